"""The runs a row is made from (its family's `needs`: a mixture's components): each one's finished run of the
study, seed and data its need names, waited for while its job in the same sweep still runs; and the key a mixed row
had when the paper's mixed rows were an MLP's `model.mix` (`former_key`, of migrations.py's `former_config`)."""

from __future__ import annotations

import logging
import tempfile
import time

import mlflow
from mlflow.entities import Run
from omegaconf import DictConfig, OmegaConf

from nplm_repro.data.corpus import Corpus
from nplm_repro.errors import NplmError
from nplm_repro.family import Need
from nplm_repro.migrations import counted, former_config, run_family
from nplm_repro.paper import PAPER_MODEL, PAPER_TRIGRAM
from nplm_repro.progress import report_status
from nplm_repro.storage.finding import search
from nplm_repro.storage.locks import recording
from nplm_repro.tracking.keys import BOOKKEEPING, config_key, without_unused
from nplm_repro.tracking.runs import TRAINED_GROUPS

log = logging.getLogger(__name__)

WAIT_SECONDS = 15  # between two looks at a component still training


class ComponentFailed(NplmError):
    """A row a row needs has failed (in this sweep, say): the needing row's job fails, and records a FAILED run of its
    own (`failed_run`), so that its row is listed as failed in the report, not missing."""


def one_configuration(name: str, study: str, runs: list[Run], key: str) -> None:
    """Refuse a component whose row name is shared by runs of several configurations (kn3 and kn5 are both
    'Kneser-Ney back-off'): which one it mixes would depend on which ran last. The refusal names them by the values
    that tell them apart."""
    newest = {r.data.tags.get("config_key", r.info.run_id): r for r in reversed(runs)}
    if len(newest) < 2:
        return
    # its configuration's params, not what a run fitted (an n-gram's fit.*)
    names = {k for r in newest.values() for k in r.data.params if k.startswith(TRAINED_GROUPS)}
    names = sorted(names - set(BOOKKEEPING))
    differing = [k for k in names if len({r.data.params.get(k) for r in newest.values()}) > 1][:3]
    each = "; ".join(
        f"run {r.info.run_id[:8]} ({', '.join(f'{k}={r.data.params.get(k)}' for k in differing) or 'another config'})"
        for r in newest.values()
    )
    raise NplmError(
        f"{key}: row {name!r} is {len(newest)} configurations in study {study}: {each}; give each its own "
        "row name (the `row` of its experiment) so that a component names exactly one"
    )


def being_recorded(run: Run) -> bool:
    """A RUNNING run whose job is alive (it holds its config's lock), not one a kill left RUNNING."""
    return run.info.status == "RUNNING" and recording(run.data.tags.get("config_key", run.info.run_id))


def same_recipe(runs: list[Run], cfg: DictConfig) -> list[Run]:
    """Of the runs of a row that several configurations share, those trained with this mixture's own recipe, its
    optim group (brown_recipe's MLP6, with optim=paper, mixes the MLP5 trained with optim=paper, not its other
    steps); all of them when they are one configuration, or none has that recipe."""
    if len({r.data.tags.get("config_key", r.info.run_id) for r in runs}) < 2:
        return runs
    optim = without_unused({"optim": OmegaConf.to_container(cfg.optim, resolve=True)})["optim"]
    recipe = {f"optim.{k}": str(v) for k, v in optim.items()}
    same = [r for r in runs if all(r.data.params.get(k) == v for k, v in recipe.items())]
    return same or runs


def component_runs(cfg: DictConfig, corpus: Corpus, needs: list[Need]) -> list[Run]:
    """The finished run of each of `needs` (its family's `needs(cfg)`), on this data, of this job's recipe where the
    row has several (`same_recipe`): the newest with the need's seed, or for a counted row (no weights: the seed
    changes nothing) any. A needed run still RUNNING (its job in this sweep, or one training it again) is waited
    for; one with no run, or only failed ones, is an error naming it, and so is a row name that several
    configurations share (`one_configuration`)."""
    uri, experiment = cfg.tracking.uri, cfg.tracking.experiment
    found = []
    for need in needs:
        name, seed, of = need.row, need.seed, need.study
        study = f"tags.study = '{of}'" if of else "tags.study IS NULL"
        while True:
            runs = search(
                uri, experiment, f"tags.row = '{name}'", study, f"tags.data_fingerprint = '{corpus.fingerprint}'"
            )
            seeded = [r for r in runs if r.data.params.get("seed") == str(seed)]
            if not any(r.info.status == "FINISHED" for r in seeded) and any(counted(r.data.tags) for r in runs):
                finished = [r for r in runs if r.info.status == "FINISHED" and counted(r.data.tags)]
                seeded = [r for r in runs if r.data.params.get("seed") == (finished or runs)[0].data.params.get("seed")]
            live = same_recipe([r for r in seeded if r.info.status == "FINISHED" or being_recorded(r)], cfg)
            one_configuration(name, of or "(none)", live, need.key)
            done = [r for r in live if r.info.status == "FINISHED"]
            if done and live[0].info.status == "FINISHED":  # the newest: a run of its row training again is waited for
                found.append(done[0])
                break
            if not live:
                why = f"{need.key}: no finished run of row {name!r} with seed {seed} in study {of or '(none)'} on this data"
                if seeded and seeded[0].info.status == "KILLED":  # the newest: stopped, not failed
                    raise NplmError(
                        f"{why}: its run {seeded[0].info.run_id} was killed before it ended; the command that ran it "
                        "resumes it (a trained row from its last epoch), then this mixture can run"
                    )
                if any(r.info.status == "FAILED" for r in seeded):
                    raise ComponentFailed(f"{why}: its run failed, so this mixture fails with it")
                raise NplmError(f"{why}: run that row first (a mixed row comes after its rows)")
            report_status(state=f"waiting for {name}")
            log.info("component %s (seed %s) is still running: waiting for it", name, seed)
            time.sleep(WAIT_SECONDS)
    return found


def former_key(cfg: DictConfig, components: list[Run], fingerprint: str) -> str | None:
    """The config_key this row had when an MLP mixed with the interpolated trigram was the MLP's own row with
    `model.mix` (the paper's MLP2 ... MLP10, and their other weightings; `former_config` of its MLP component's
    run). A store made then holds its run under that key, which this job skips to. None for any other mixture."""
    families = [run_family(r.data.tags.get("family"), r.data.params.get("model._target_")) for r in components]
    if families != [PAPER_MODEL, PAPER_TRIGRAM]:
        return None
    client = mlflow.MlflowClient(cfg.tracking.uri)
    with tempfile.TemporaryDirectory() as into:
        mlp = OmegaConf.load(client.download_artifacts(components[0].info.run_id, "config.yaml", into))
    return config_key(former_config(mlp, cfg.model.mode, cfg.get("study")), fingerprint)
