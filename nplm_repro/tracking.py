"""MLflow: where runs go, what each run records (params, tags, fingerprints, artifacts)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
from lightning.pytorch.loggers import MLFlowLogger
from omegaconf import DictConfig, OmegaConf

from nplm_repro.corpus import SPLITS, Corpus
from nplm_repro.errors import NplmError

log = logging.getLogger(__name__)


def flat_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as flat dotted keys (model.n, optim.lr, ...), Hydra's own keys left out."""
    tree = OmegaConf.to_container(cfg, resolve=True)
    return {k: v for k, v in pd.json_normalize(tree, sep=".").iloc[0].items() if not k.startswith("hydra.")}


def git_commit() -> str:
    """The commit of the code that ran (with '+dirty' if it had uncommitted changes), or 'unknown'."""
    here = Path(__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def data_tags(corpus: Corpus) -> dict[str, str]:
    """What identifies the data: its fingerprint, |V| and the split sizes."""
    tags = {"data_fingerprint": corpus.fingerprint, "vocab_size": str(corpus.vocab_size)}
    tags.update({f"{split}_tokens": str(corpus.size(split)) for split in SPLITS})
    return tags


class RunLogger(MLFlowLogger):
    """MLFlowLogger that keeps the run open after `fit`: the reported perplexities are computed after it.

    Lightning finalizes loggers with "success" at the end of every fit/test; the run is ended only by
    `close()`. A failure still ends it at once as FAILED.
    """

    def finalize(self, status: str = "success") -> None:
        if status != "success":
            super().finalize(status)

    def close(self) -> None:
        super().finalize("success")


def open_run(cfg: DictConfig, corpus: Corpus) -> RunLogger:
    """Create the MLflow run of this job, with its params and tags; fails with one line if the store is unreachable."""
    uri, experiment = cfg.tracking.uri, cfg.tracking.experiment
    tags = {**data_tags(corpus), "git_commit": git_commit(), "corpus": corpus.name}
    if cfg.get("row"):
        tags["row"] = cfg.row
    try:
        logger = RunLogger(experiment_name=experiment, tracking_uri=uri, run_name=cfg.tracking.run_name, tags=tags)
        logger.log_hyperparams(flat_params(cfg))
    except Exception as error:  # MLflow raises many types for a bad store; all mean the same to the user
        raise NplmError(f"tracking store {uri!r} is unusable: {str(error).splitlines()[0]}") from error
    log.info("MLflow run %s in experiment %r at %s", logger.run_id, experiment, uri)
    return logger
