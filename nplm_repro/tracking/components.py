"""The rows a mixture mixes (`model.components`): each one's finished run of the mixture's study, seed and data,
waited for while its job in the same sweep still runs."""

from __future__ import annotations

import logging
import time

from mlflow.entities import Run
from omegaconf import DictConfig

from nplm_repro.data.corpus import Corpus
from nplm_repro.errors import NplmError
from nplm_repro.progress import report_status
from nplm_repro.tracking.finding import search
from nplm_repro.tracking.keys import BOOKKEEPING
from nplm_repro.tracking.runs import TRAINED_GROUPS

log = logging.getLogger(__name__)

WAIT_SECONDS = 15  # between two looks at a component still training


class ComponentFailed(NplmError):
    """A row a mixture mixes has failed (in this sweep, say): the mixture's job fails, and records a FAILED run of its
    own (`failed_run`), so that its row is listed as failed in the report, not missing."""


def seedless(run: Run) -> bool:
    """Whether a run counted its model (an n-gram: no weights, so its seed changes nothing); runs from before the tag
    `family_kind` were counted when they neither trained (model_key) nor mixed (base_run_id)."""
    tags = run.data.tags
    if "family_kind" in tags:
        return tags["family_kind"] == "counted"
    return "model_key" not in tags and "base_run_id" not in tags


def one_configuration(name: str, study: str, runs: list[Run]) -> None:
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
        f"model.components: row {name!r} is {len(newest)} configurations in study {study}: {each}; give each its own "
        "row name (the `row` of its experiment) so that a component names exactly one"
    )


def component_runs(cfg: DictConfig, corpus: Corpus) -> list[Run]:
    """The finished run of each row `cfg.model.components` names, in this study, on this data: the one with this
    job's seed, or for a counted row (no weights: the seed changes nothing) any. A component whose run is still
    RUNNING (its job in this sweep) is waited for; one with no run, or only failed ones, is an error naming it, and
    so is a row name that several configurations share (`one_configuration`)."""
    uri, experiment = cfg.tracking.uri, cfg.tracking.experiment
    study = f"tags.study = '{cfg.study}'" if cfg.get("study") else "tags.study IS NULL"
    found = []
    for name in cfg.model.components:
        while True:
            runs = search(
                uri, experiment, f"tags.row = '{name}'", study, f"tags.data_fingerprint = '{corpus.fingerprint}'"
            )
            seeded = [r for r in runs if r.data.params.get("seed") == str(cfg.seed)]
            if not any(r.info.status == "FINISHED" for r in seeded) and any(seedless(r) for r in runs):
                finished = [r for r in runs if r.info.status == "FINISHED" and seedless(r)]
                seeded = [r for r in runs if r.data.params.get("seed") == (finished or runs)[0].data.params.get("seed")]
            live = [r for r in seeded if r.info.status in ("FINISHED", "RUNNING")]
            one_configuration(name, cfg.get("study") or "(none)", live)
            done = [r for r in live if r.info.status == "FINISHED"]
            if done:
                found.append(done[0])
                break
            if not live:
                why = (
                    f"model.components: no finished run of row {name!r} with seed {cfg.seed} in study "
                    f"{cfg.get('study') or '(none)'} on this data"
                )
                if any(r.info.status == "FAILED" for r in seeded):
                    raise ComponentFailed(f"{why}: its run failed, so this mixture fails with it")
                raise NplmError(f"{why}: run that row first (a mixed row comes after its rows)")
            report_status(state=f"waiting for {name}")
            log.info("component %s (seed %s) is still running: waiting for it", name, cfg.seed)
            time.sleep(WAIT_SECONDS)
    return found
