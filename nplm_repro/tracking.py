"""MLflow: where runs go, what each run records (params, tags, fingerprints, artifacts)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import requests
from filelock import FileLock, Timeout
from lightning.pytorch.loggers import MLFlowLogger
from omegaconf import DictConfig, OmegaConf

from nplm_repro.corpus import SPLITS, Corpus
from nplm_repro.errors import NplmError, interrupted

log = logging.getLogger(__name__)


SAMPLING_KEYS = ("output", "samples", "proposal", "estimator")  # optim's, for optim.output=sampled only


def _without_unused(tree: dict[str, Any]) -> dict[str, Any]:
    """`tree` (a config as a dict) less the sampling keys of an exact run, which it did not use: an exact run
    records, and is identified by, what it was before sampled training existed, so stored runs keep matching."""
    optim = tree.get("optim")
    if isinstance(optim, dict) and optim.get("output", "exact") == "exact":
        tree["optim"] = {k: v for k, v in optim.items() if k not in SAMPLING_KEYS}
    return tree


def flat_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as flat dotted keys (model.n, optim.lr, ...), Hydra's own keys left out."""
    tree = _without_unused(OmegaConf.to_container(cfg, resolve=True))
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


def model_key(cfg: DictConfig, corpus: Corpus) -> str:
    """What determines a trained MLP: data, model (less the mixture), optimiser, trainer, early stopping, seed.

    A mixed row looks up the finished run with its key instead of training the same MLP again.
    """
    parts = _without_unused({k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "optim", "trainer")})
    parts["model"].pop("mix", None)
    parts |= {
        "data": corpus.fingerprint,
        "seed": cfg.seed,
        "stopping": OmegaConf.to_container(cfg.callbacks.early_stopping),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


# Keys that record where or how a job ran, not what it computed: left out of `config_key`. The row name is
# left out too: the MLP a mixed row trains for itself (no row) is the same run as its own row's.
BOOKKEEPING = (
    "tracking",
    "rerun",
    "report",
    "note",
    "threads",
    "row",
    "data.path",
    "data.split.valid_path",
    "data.split.test_path",
    "data.eval_batch_size",
    "trainer.enable_progress_bar",
    "trainer.strategy",  # auto and ddp_spawn give the same steps for the same trainer.devices
    "callbacks.progress_bar",
    "callbacks.model_checkpoint.dirpath",
)


def config_key(cfg: DictConfig, corpus: Corpus) -> str:
    """What determines a run's results in its study: the resolved config less BOOKKEEPING, and the data fingerprint.

    A job whose key already has a FINISHED run is skipped (unless `rerun=true`): a re-run sweep finishes
    only what is missing. The study is part of the key, so every study's runs carry its tag.
    """
    kept = _without_unused(OmegaConf.to_container(cfg, resolve=False))
    for dotted in BOOKKEEPING:
        *path, last = dotted.split(".")
        node = functools.reduce(lambda d, k: d.get(k) or {}, path, kept)
        node.pop(last, None)
    resolved = OmegaConf.to_container(OmegaConf.create(kept), resolve=True)
    text = json.dumps({"config": resolved, "data": corpus.fingerprint}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sqlite_file(uri: str) -> Path | None:
    """The database file of an embedded SQLite store URI, else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?")[0]
    return Path(path) if path not in ("", ":memory:") else None


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Hold `<database>.lock` beside an embedded SQLite store while MLflow opens it. MLflow creates a new store's
    tables (and migrates an old one) on first open, and two processes doing it at once both fail ("table
    _alembic_tmp_tags already exists") and leave the store unusable; under this lock one creates, the others
    find it made. Any other store is a server's or a database's, which serialises itself."""
    path = sqlite_file(uri)
    lock = FileLock(f"{path}.lock") if path is not None else None
    try:
        if lock is not None:
            lock.acquire(timeout=600)
    except Timeout:  # a process hung while opening the store: go on without it rather than wait for ever
        log.warning("tracking store %s: its lock %s.lock is held for 600 s; opening the store without it", path, path)
        lock = None
    except OSError:  # a read-only directory: nothing can create or migrate a store there either
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def repair_interrupted_upgrade(path: Path) -> None:
    """Finish what an interrupted MLflow schema upgrade left in a SQLite store, or refuse it in one line.

    Alembic changes a SQLite table by copying it into `_alembic_tmp_<table>`, dropping the table and renaming the
    copy. A process stopped in between (or two upgrading at once, before `store_lock`) leaves the copy behind,
    and every later upgrade fails on "table _alembic_tmp_<table> already exists". While `<table>` still exists
    the copy holds nothing it lacks: it is dropped and the upgrade runs again. Without `<table>`, the copy has
    the only rows: nothing is changed, and the error says how to put it back.
    """
    if not path.is_file():
        return
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        copies = sorted(name for name in tables if name.startswith("_alembic_tmp_"))
        for copy in copies:
            table = copy.removeprefix("_alembic_tmp_")
            if table not in tables:
                raise NplmError(
                    f"tracking store {path} was left mid-upgrade by MLflow: table {table} exists only as {copy}; "
                    f"back up the file, run sqlite3 {path} 'ALTER TABLE {copy} RENAME TO {table}', then run again"
                )
        for copy in copies:
            db.execute(f'DROP TABLE "{copy}"')
            log.warning("tracking store %s: dropped %s, left by an interrupted MLflow upgrade", path, copy)


def ensure_experiment(client: mlflow.MlflowClient, name: str) -> str:
    """The id of experiment `name`, created if missing; another process creating it at the same moment is fine."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except mlflow.exceptions.MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def store_error(error: Exception) -> str:
    """What went wrong in a store, in one line: the database's own message where MLflow and SQLAlchemy wrap it
    ("(sqlite3.OperationalError) attempt to write a readonly database"), else the error's first line."""
    text = str(error).strip()
    found = re.findall(r"\((?:\w+\.)*\w+(?:Error|Exception)\) [^\n]+", text)
    return found[-1] if found else (text.splitlines() or [type(error).__name__])[0]


def check_store(uri: str, create: bool = True, experiment: str | None = None) -> None:
    """Fail at once, in one line, on a store that cannot be used (before a corpus is read or a run opened).

    An HTTP store must answer /health within 10 s: MLflow's client would retry for minutes. Other stores are
    opened and listed, an embedded SQLite one under `store_lock` and after `repair_interrupted_upgrade` (a new
    SQLite file is created, unless `create=False`), and `experiment` is created in it if given and missing.
    """
    if uri.startswith(("http://", "https://")):
        try:
            requests.get(uri.rstrip("/") + "/health", timeout=10).raise_for_status()
        except requests.RequestException as error:
            raise NplmError(f"tracking store {uri!r} is unreachable: {type(error).__name__} on /health") from None
    path = sqlite_file(uri)
    if create or path is not None:
        try:
            with store_lock(uri):
                if path is not None:
                    repair_interrupted_upgrade(path)
                client = mlflow.MlflowClient(uri)
                client.search_experiments(max_results=1)
                if experiment:
                    ensure_experiment(client, experiment)
        except NplmError:
            raise
        except Exception as error:  # noqa: BLE001  MLflow raises many types for a bad store; all mean the same
            raise NplmError(f"tracking store {uri!r} is unusable: {store_error(error)}") from None


def find_finished(uri: str, experiment: str, **tags: str) -> str | None:
    """The newest FINISHED run of the experiment with these tag values, or None."""
    client = mlflow.MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    query = " and ".join([f"tags.{k} = '{v}'" for k, v in tags.items()] + ["attributes.status = 'FINISHED'"])
    runs = client.search_runs([found.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def find_resumable(uri: str, experiment: str, config_key: str) -> tuple[str, Path] | None:
    """The newest run of this config that a kill interrupted (KILLED, or RUNNING with its process gone), and the
    last checkpoint it wrote; None if there is none. The caller holds the config's lock, so no live job owns it."""
    client = mlflow.MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    query = f"tags.config_key = '{config_key}'"
    for run in client.search_runs([found.experiment_id], query, order_by=["attributes.start_time DESC"]):
        if run.info.status not in ("KILLED", "RUNNING"):
            continue
        last = Path(run.data.tags.get("checkpoint_dir", "")) / "last.ckpt"
        if run.data.tags.get("checkpoint_dir") and last.is_file():
            return run.info.run_id, last
    return None


ORPHANED = "its process ended without ending the run (kill -9, out of memory, a lost machine)"


def end_orphans(uri: str, experiment: str, config_key: str, keep: str | None = None) -> None:
    """Mark KILLED (tag `killed_because`) the runs of this config still RUNNING, but `keep`. The caller holds the
    config's lock, which a live job recording such a run would hold: their process is gone."""
    client = mlflow.MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return
    query = f"tags.config_key = '{config_key}' and attributes.status = 'RUNNING'"
    for run in client.search_runs([found.experiment_id], query):
        if run.info.run_id != keep:
            client.set_tag(run.info.run_id, "killed_because", ORPHANED)
            client.set_terminated(run.info.run_id, "KILLED")
            log.warning("run %s of this config was left RUNNING by a process now gone: marked KILLED", run.info.run_id)


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
    for key in ("row", "study", "note"):
        if cfg.get(key):
            tags[key] = str(cfg[key])
    if cfg.tracking.get("parent_run_id"):
        tags["mlflow.parentRunId"] = cfg.tracking.parent_run_id  # the sweep's parent run (nplm_repro.sweep)
    params, name = flat_params(cfg), cfg.tracking.run_name or run_name(cfg)  # a config error is not the store's
    try:
        logger = RunLogger(experiment_name=experiment, tracking_uri=uri, run_name=name, tags=tags)
        logger.log_hyperparams(params)
    except Exception as error:  # noqa: BLE001  MLflow raises many types for a bad store; all mean the same
        raise NplmError(f"tracking store {uri!r} is unusable: {store_error(error)}") from None
    log.info("MLflow run %s in experiment %r at %s", logger.run_id, experiment, uri)
    return logger
