"""What each run records in MLflow: params, tags (data, code), its name, and the logger that keeps it open."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from lightning.pytorch.loggers import MLFlowLogger
from omegaconf import DictConfig, OmegaConf

from nplm_repro.data.corpus import Corpus
from nplm_repro.data.splits import SPLITS
from nplm_repro.errors import NplmError, interrupted
from nplm_repro.tracking.keys import KEY_VERSION, family, without_unused
from nplm_repro.tracking.store import store_error

log = logging.getLogger(__name__)


def flat_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as flat dotted keys (model.n, optim.lr, ...), Hydra's own keys left out."""
    tree = without_unused(OmegaConf.to_container(cfg, resolve=True))
    return {k: v for k, v in pd.json_normalize(tree, sep=".").iloc[0].items() if not k.startswith("hydra.")}


def git_commit() -> str:
    """The commit of the code that ran (with '+dirty' if it had uncommitted changes), or 'unknown'."""
    here = Path(__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def data_tags(corpus: Corpus) -> dict[str, str]:
    """What identifies the data: its fingerprint, |V|, the split sizes, what was counted and where it was read."""
    tags = {"data_fingerprint": corpus.fingerprint, "vocab_size": str(corpus.vocab_size)}
    tags.update({f"{split}_tokens": str(corpus.size(split)) for split in SPLITS})
    return tags | corpus.count_tags()


class RunLogger(MLFlowLogger):
    """MLFlowLogger that keeps the run open after `fit`: the reported perplexities are computed after it.

    Lightning finalizes loggers with "success" at the end of every fit/test; the run is ended only by
    `close()`. A failure still ends it at once: KILLED for Ctrl-C or SIGTERM (resumable), else FAILED.
    """

    def finalize(self, status: str = "success") -> None:
        if status == "failed" and interrupted(sys.exc_info()[1]):
            status = "KILLED"
        if status != "success":
            super().finalize(status)

    def close(self) -> None:
        super().finalize("success")


def run_name(cfg: DictConfig) -> str:
    """The paper's row (or the model's knobs) and the seed. MLflow's random names repeat under a fixed seed."""
    knobs = {k: v for k, v in cfg.model.items() if k != "_target_"}
    what = cfg.get("row") or " ".join(f"{k}={v}" for k, v in knobs.items())
    if cfg.get("row") and knobs.get("mix", "none") not in ("none", "fixed"):
        what += f" mix={knobs['mix']}"
    return f"{what} seed={cfg.seed}"


def open_run(cfg: DictConfig, corpus: Corpus, resume: str | None = None, **extra_tags: str) -> RunLogger:
    """Create the MLflow run of this job, with its params and tags, or reopen run `resume` (status RUNNING again);
    fails with one line if the store is unreachable."""
    uri, experiment = cfg.tracking.uri, cfg.tracking.experiment
    if resume:
        mlflow.MlflowClient(uri).update_run(resume, status="RUNNING")
        log.info("MLflow run %s resumed in experiment %r at %s", resume, experiment, uri)
        return RunLogger(experiment_name=experiment, tracking_uri=uri, run_id=resume)
    tags = {**data_tags(corpus), "git_commit": git_commit(), "corpus": corpus.name, **extra_tags}
    tags |= {"family": family(cfg), "key_version": KEY_VERSION}
    for key in ("row", "study", "note"):
        if cfg.get(key):
            tags[key] = str(cfg[key])
    if cfg.tracking.get("parent_run_id"):
        tags["mlflow.parentRunId"] = cfg.tracking.parent_run_id  # the sweep's parent run (nplm_repro.tracking.sweep)
    params, name = flat_params(cfg), cfg.tracking.run_name or run_name(cfg)  # a config error is not the store's
    try:
        logger = RunLogger(experiment_name=experiment, tracking_uri=uri, run_name=name, tags=tags)
        logger.log_hyperparams(params)
    except Exception as error:  # noqa: BLE001  MLflow raises many types for a bad store; all mean the same
        raise NplmError(f"tracking store {uri!r} is unusable: {store_error(error)}") from None
    log.info("MLflow run %s in experiment %r at %s", logger.run_id, experiment, uri)
    return logger
