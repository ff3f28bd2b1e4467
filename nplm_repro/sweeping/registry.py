"""The best trained model (an MLP, an LSTM, a Transformer) of a study in MLflow's Model Registry, as a version of
`nplm-<experiment>-<study>` (the experiment is the corpus's, or debug_<corpus> for quick checks, which never join a
study's registered model), with the alias `champion` on it: what `mlflow models serve -m
models:/nplm-brown-brown_table1@champion` serves, and what the dashboard's Models page lists.

Best: the study's best run by the one rule the report and `nplm-score --row` follow (tracking/best.py), among the
runs the report lists (tracking/runs.py: a study's runs by tag, a paper table's untagged rows, `adhoc`). A run
without weights (an MLP stopped before its first validation: its numbers come from the weights in memory at its
end, but it kept none) cannot be served: it is passed over, said in one line, for the next run in the rule's order.
Its Model is that of the run itself, or of the run it adopted; a run from before runs logged a Model gets one from
its checkpoint first. A version that already holds that Model is not registered again: the alias moves to it. The
version is tagged with the row, the run, its valid and test perplexities and the data fingerprint.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import mlflow
import pandas as pd

from nplm_repro.errors import NplmError
from nplm_repro.migrations import CHECKPOINT_BEFORE_MODELS
from nplm_repro.serving.scoring import RunScorer, has_weights
from nplm_repro.serving.served import log_model, model_of
from nplm_repro.storage.archive import ARCHIVED_ID
from nplm_repro.storage.kept import download
from nplm_repro.storage.store import tracking_at
from nplm_repro.tracking.best import ranked_runs
from nplm_repro.tracking.runs import study_runs

log = logging.getLogger(__name__)

CHAMPION = "champion"  # the alias of a study's best version: models:/<name>@champion


def registered_name(experiment: str, study: str) -> str:
    return f"nplm-{experiment}-{study}"


def best_with_weights(
    uri: str, experiment: str, study: str, fingerprint: str | None = None, require_clean: bool = False
) -> pd.Series | None:
    """The study's best run that has weights (module docstring), among the runs its report lists (`fingerprint`,
    `require_clean`: as `nplm-report` was given them), or None (why, in one line of the log); each better run
    without weights is a warning."""
    try:
        runs = study_runs(uri, experiment, study, fingerprint, require_clean).runs
    except NplmError as why:  # nothing to register: the report says the same, or has said it
        log.info("registry: nothing registered: %s", why)
        return None
    client = mlflow.MlflowClient(uri)
    for run in ranked_runs(study, runs):
        source = run["adopted_from"] or run["run_id"]
        if has_weights(client, source):
            return run
        imported = ARCHIVED_ID in client.get_run(source).data.tags
        log.warning(
            "registry: run %s (%s, seed %s, valid %.1f) has no weights (%s): not registered",
            source,
            run["row_tag"] or run["family_label"],
            run["seed"],
            run["valid_ppl"],
            "imported from an archive, which ships no weights"
            if imported
            else "it stopped before its first validation, or they were deleted",
        )
    log.info("registry: study %s has no finished trained run with weights: nothing registered", study)
    return None


def register_best(
    uri: str, experiment: str, study: str, fingerprint: str | None = None, require_clean: bool = False
) -> str | None:
    """Register the study's best run that has weights and point `champion` at it (module docstring); returns
    'name/version', or None when the study has no such run."""
    best = best_with_weights(uri, experiment, study, fingerprint, require_clean)
    if best is None:
        return None
    client = mlflow.MlflowClient(uri)
    source = best["adopted_from"] or best["run_id"]
    model = model_of(client, source)
    if model is None:  # a run from before runs logged a Model: its checkpoint becomes one
        scorer = RunScorer(uri, source)
        with tempfile.TemporaryDirectory() as into:
            checkpoint = Path(download(client, source, CHECKPOINT_BEFORE_MODELS, into))
            model = log_model(client, source, checkpoint, scorer.corpus, scorer.cfg.data, scorer.cfg.model._target_)
        log.info("registry: run %s had no Model: logged one from its %s", source, CHECKPOINT_BEFORE_MODELS)
    name = registered_name(experiment, study)
    if client.search_registered_models(f"name = '{name}'"):
        holding = [  # the store may not fill in model_id
            v for v in client.search_model_versions(f"name = '{name}'") if v.source == f"models:/{model}"
        ]
        if holding:
            version = max(holding, key=lambda v: int(v.version))
            client.set_registered_model_alias(name, CHAMPION, version.version)
            log.info(
                "registry: %s version %s (@%s) already holds run %s's Model", name, version.version, CHAMPION, source
            )
            return f"{name}/{version.version}"
    else:
        client.create_registered_model(name, description=f"The best trained model of study {study} (tracking/best.py)")
    tags = {
        "row": best["row_tag"],
        "run_id": best["run_id"],
        "seed": best["seed"],
        "valid_ppl": f"{best['valid_ppl']:.3f}",
        "test_ppl": f"{best['test_ppl']:.3f}",
        "data_fingerprint": best["fingerprint"],
        "study": study,
    }
    with tracking_at(uri):  # the registry resolves the version's source through the global tracking URI
        version = client.create_model_version(name, f"models:/{model}", run_id=source, tags=tags, model_id=model)
    client.set_registered_model_alias(name, CHAMPION, version.version)
    log.info(
        "registry: %s version %s (@%s) = run %s (%s, seed %s, valid %s)",
        name,
        version.version,
        CHAMPION,
        source,
        tags["row"],
        tags["seed"],
        tags["valid_ppl"],
    )
    return f"{name}/{version.version}"
