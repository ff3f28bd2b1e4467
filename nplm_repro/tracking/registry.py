"""The best trained model (an MLP, an LSTM, a Transformer) of a study in MLflow's Model Registry, as a version of
`nplm-<experiment>-<study>` (the experiment is the corpus's, or debug_<corpus> for quick checks, which never join a
study's registered model): what `mlflow models serve -m models:/nplm-brown-brown_table1/1` serves, and what the
dashboard's Models page lists.

Best: of the study's finished trained runs (not counted, not mixed) on its newest data, the one with the lowest
validation perplexity (never chosen on test). Its Model is that of the run itself, or of the run it adopted; a run from before runs logged a
Model gets one from its checkpoint first. A study whose newest version already holds that Model registers nothing.
The version is tagged with the row, the run, its valid and test perplexities and the data fingerprint.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import mlflow
from mlflow.entities import Run

from nplm_repro.tracking.kept import download
from nplm_repro.tracking.scoring import CHECKPOINT, RunScorer
from nplm_repro.tracking.served import log_model, model_of
from nplm_repro.tracking.store import tracking_at

log = logging.getLogger(__name__)


def registered_name(experiment: str, study: str) -> str:
    return f"nplm-{experiment}-{study}"


def best_mlp(client: mlflow.MlflowClient, experiment: str, study: str) -> Run | None:
    """The study's finished unmixed MLP run with the lowest valid_ppl on its newest data, or None."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    query = f"tags.study = '{study}' and attributes.status = 'FINISHED'"
    runs = client.search_runs([found.experiment_id], query, max_results=5000, order_by=["attributes.start_time DESC"])
    runs = [r for r in runs if "data_fingerprint" in r.data.tags]
    if not runs:
        return None
    newest = runs[0].data.tags["data_fingerprint"]
    mlps = [
        r
        for r in runs
        if "model_key" in r.data.tags and r.data.tags["data_fingerprint"] == newest and "valid_ppl" in r.data.metrics
    ]
    return min(mlps, key=lambda r: r.data.metrics["valid_ppl"]) if mlps else None


def register_best(uri: str, experiment: str, study: str) -> str | None:
    """Register the study's best MLP (module docstring); returns 'name/version', or None when it has no MLP."""
    client = mlflow.MlflowClient(uri)
    best = best_mlp(client, experiment, study)
    if best is None:
        log.info("registry: study %s has no finished MLP run: nothing registered", study)
        return None
    source = best.data.tags.get("adopted_from", best.info.run_id)
    model = model_of(client, source)
    if model is None:  # a run from before runs logged a Model: its checkpoint becomes one
        scorer = RunScorer(uri, source)
        with tempfile.TemporaryDirectory() as into:
            checkpoint = Path(download(client, source, CHECKPOINT, into))
            model = log_model(client, source, checkpoint, scorer.corpus, scorer.cfg.data, scorer.cfg.model._target_)
        log.info("registry: run %s had no Model: logged one from its %s", source, CHECKPOINT)
    name = registered_name(experiment, study)
    if client.search_registered_models(f"name = '{name}'"):
        versions = client.search_model_versions(f"name = '{name}'", order_by=["version_number DESC"], max_results=1)
        if versions and versions[0].source == f"models:/{model}":  # the store may not fill in model_id
            log.info("registry: %s version %s already holds run %s's Model", name, versions[0].version, source)
            return f"{name}/{versions[0].version}"
    else:
        client.create_registered_model(name, description=f"The best MLP of study {study} (lowest valid perplexity)")
    metrics = best.data.metrics
    tags = {
        "row": best.data.tags.get("row", ""),
        "run_id": best.info.run_id,
        "valid_ppl": f"{metrics['valid_ppl']:.3f}",
        "test_ppl": f"{metrics.get('test_ppl', float('nan')):.3f}",
        "data_fingerprint": best.data.tags["data_fingerprint"],
        "study": study,
    }
    with tracking_at(uri):  # the registry resolves the version's source through the global tracking URI
        version = client.create_model_version(name, f"models:/{model}", run_id=source, tags=tags, model_id=model)
    log.info(
        "registry: %s version %s = run %s (%s, valid %s)", name, version.version, source, tags["row"], tags["valid_ppl"]
    )
    return f"{name}/{version.version}"
