"""What each run records in MLflow: params (each key once), tags (data, code), the corpus as a dataset input, the
uncommitted changes to its code, its name, optionally system metrics, and the logger that keeps it open.

The code is a checkout's commit only when the code that runs is that checkout's tracked files (`code_state`): a
package installed into a virtualenv inside a checkout (`pip install .`, not editable) is the installed version,
never the surrounding checkout's HEAD and diff."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import platform
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import pandas as pd
import torch
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_GIT_COMMIT
from omegaconf import DictConfig, OmegaConf

from nplm_repro.data.corpus import Corpus
from nplm_repro.data.splits import SPLITS
from nplm_repro.errors import NplmError, interrupted
from nplm_repro.family import family_of
from nplm_repro.machine import cpuinfo
from nplm_repro.storage.archive import code_fingerprint
from nplm_repro.storage.redaction import redact
from nplm_repro.storage.store import store_error
from nplm_repro.tracking.keys import KEY_VERSION, trained, without_unused

if TYPE_CHECKING:
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

log = logging.getLogger(__name__)

CODE = Path(__file__).resolve().parents[1]  # the package that runs: a checkout's nplm_repro/, or an installed copy
DISTRIBUTION = "nplm-repro"
TRAINING_ONLY = ("optim", "trainer", "callbacks")  # config groups a counted or mixed row never reads
NEEDS_PSUTIL = "tracking.system_metrics=true needs psutil: .venv/bin/pip install -e '.[system-metrics]'"


def flat_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as flat dotted keys (model.n, optim.lr, ...): Hydra's own keys left out, and the
    TRAINING_ONLY groups of a model that is not trained, which cannot change its numbers; credentials masked."""
    tree = without_unused(OmegaConf.to_container(cfg, resolve=True))
    tree.pop("reporting", None)  # the study's report, declared beside its jobs: words and claims, no knob of a run
    if not trained(cfg.model):
        tree = {k: v for k, v in tree.items() if k not in TRAINING_ONLY}
    flat = pd.json_normalize(tree, sep=".").iloc[0].items()
    return {k: redact(v) if isinstance(v, str) else v for k, v in flat if not k.startswith("hydra.")}


def _git(code: Path, *args: str) -> str:
    command = ["git", *args]
    return subprocess.run(command, cwd=code, capture_output=True, encoding="utf-8", errors="replace", check=True).stdout


# What runs besides the package, as git pathspecs from the checkout's top: every other package pyproject.toml
# installs (hydra_plugins/, the search's sweeper, which every nplm-train imports), the configs every job composes
# (conf/, installed as nplm_repro.conf, and sweeps/, its study/) and pyproject.toml, which decides the dependencies
# and the commands. Not reports/ (which the README's quickstart rewrites), docs/, tests/ or the README: none runs.
RUNS_BESIDE = (":(top)hydra_plugins", ":(top)conf", ":(top)sweeps", ":(top)pyproject.toml")


def code_state(code: Path = CODE) -> tuple[str, str]:
    """What the code that runs (the package at `code`) is, for the tag `git_commit`, and the diff that goes with it.

    In a checkout whose tracked files it is: the commit, with '+dirty' if the code that runs (the package and
    RUNS_BESIDE) has uncommitted changes, and those changes to tracked files as `git diff HEAD --binary` writes them
    (`git apply` puts them back on the commit). Changes elsewhere, such as the reports a study rewrites, leave the
    code clean: they would mark every later run of an unchanged package. Untracked files are not code, as git's
    diff has them (a new module counts once `git add`ed). Otherwise git may still find a checkout around it (a
    virtualenv inside one, ignored by it), but that checkout's HEAD and diff are not this code: it is the installed
    version (`installed`), with no diff."""
    try:
        _git(code, "ls-files", "--error-unmatch", "--", "__init__.py")  # fails outside git and for untracked files
    except (OSError, subprocess.CalledProcessError):
        return installed(code), ""
    commit = _git(code, "rev-parse", "HEAD").strip()
    diff = _git(code, "diff", "HEAD", "--binary", "--", ".", *RUNS_BESIDE)  # ".": the package, git's cwd
    return commit + ("+dirty" if diff else ""), diff


def installed(code: Path) -> str:
    """The installed package at `code`: `nplm-repro <version>`, and where pip installed it from if it wrote PEP 610's
    direct_url.json (a directory, a wheel, a VCS URL at its commit; editable: a checkout that is not git's); 'unknown'
    if no installed distribution holds `code`."""
    dist = _distribution(code)
    if dist is None:
        return "unknown"
    version = f"{DISTRIBUTION} {dist.version}"
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    if not isinstance(direct, dict) or not direct.get("url"):
        return version  # from an index: the version says it all
    source = direct["url"]
    if vcs := direct.get("vcs_info"):
        source = f"{vcs.get('vcs', 'vcs')}+{source}@{vcs.get('commit_id', vcs.get('requested_revision', '?'))}"
    how = "editable install of" if direct.get("dir_info", {}).get("editable") else "installed from"
    return f"{version} ({how} {source})"


def _distribution(code: Path) -> importlib.metadata.Distribution | None:
    """The installed distribution whose files are the package at `code`: its dist-info beside it (site-packages), or
    an editable install whose project directory holds it."""
    beside = sorted(code.parent.glob(f"{code.name}-*.dist-info"))
    if beside:
        return importlib.metadata.Distribution.at(beside[0])
    for dist in importlib.metadata.distributions(name=DISTRIBUTION):
        try:
            url = urllib.parse.urlparse(json.loads(dist.read_text("direct_url.json") or "{}").get("url", ""))
        except (ValueError, AttributeError):
            continue
        if url.scheme == "file" and Path(urllib.request.url2pathname(url.path)).resolve() / code.name == code.resolve():
            return dist
    return None


def is_commit(state: str) -> bool:
    """Whether `code_state` named a git commit (with '+dirty' or not), rather than an installed version."""
    return re.fullmatch(r"[0-9a-f]{40,64}(\+dirty)?", state) is not None


LIBRARIES = ("torch", "lightning", "mlflow", "hydra-core", "numpy")  # what computed and recorded a number
# The CPU flags that decide which kernels run, so how fast (and, through rounding, how exactly) a run computes:
# bfloat16 is emulated without avx512_bf16 or AMX, 4-20 times slower than float32.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def cpu() -> tuple[str, str]:
    """The CPU's model (with its family and model numbers, which tell Zen 3 from Zen 4) and its CPU_FLAGS."""
    fields = cpuinfo()
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields:
        name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    flags = set(fields.get("flags", "").split())
    return name, " ".join(f for f in CPU_FLAGS if f in flags)


def environment_tags() -> dict[str, str]:
    """Where and with what a run computed: Python and library versions, the CPU, torch's threads (the report's
    reproducibility section; a number is compared across CPUs only with these beside it)."""
    tags = {"python": platform.python_version(), "torch_threads": str(torch.get_num_threads())}
    for name in LIBRARIES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            tags[f"version.{name}"] = importlib.metadata.version(name)
    tags["cpu_model"], tags["cpu_flags"] = cpu()
    return tags


def data_tags(corpus: Corpus) -> dict[str, str]:
    """What identifies the data: its fingerprint, |V|, the split sizes, what was counted and where it was read."""
    tags = {"data_fingerprint": corpus.fingerprint, "vocab_size": str(corpus.vocab_size)}
    tags.update({f"{split}_tokens": str(corpus.size(split)) for split in SPLITS})
    return tags | corpus.count_tags()


def corpus_input(data: DictConfig, corpus: Corpus) -> DatasetInput:
    """The corpus as MLflow's dataset of the run (the runs table's Dataset column; `dataset.digest = '...'` filters):
    named after the corpus, its digest the data fingerprint, its source the file read, |V| and split sizes as profile.
    One dataset, context `training`: the fingerprint covers the three splits together."""
    path = data.get("path")
    source = redact(str(Path(path).expanduser().resolve()) if path else corpus.source or corpus.name)
    profile = {"vocab_size": corpus.vocab_size, **{f"{split}_tokens": corpus.size(split) for split in SPLITS}}
    dataset = Dataset(
        corpus.name, corpus.fingerprint, "local", json.dumps({"uri": source}), profile=json.dumps(profile)
    )
    return DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, "training")])


def log_corpus(client: MlflowClient, run_id: str, corpus: DatasetInput, attempts: int = 3) -> None:
    """Link the run to its corpus dataset. MLflow's store looks the dataset up and then inserts it, so jobs of one
    sweep that start together can all insert it, and all but one fail on its unique key (PostgreSQL and SQLite
    alike). The winner's row is then there: a retry links to it instead."""
    for attempt in range(1, attempts + 1):
        try:
            client.log_inputs(run_id, datasets=[corpus])
            return
        except MlflowException:
            if attempt == attempts:
                raise
            time.sleep(0.1 * attempt)


def check_system_metrics(tracking: DictConfig) -> None:
    """Before any work: MLflow's system metrics monitor (`tracking.system_metrics=true`) needs psutil."""
    if tracking.get("system_metrics") and importlib.util.find_spec("psutil") is None:
        raise NplmError(NEEDS_PSUTIL)


class RunLogger(MLFlowLogger):
    """MLFlowLogger that keeps the run open after `fit`: the reported perplexities are computed after it.

    Lightning finalizes loggers with "success" at the end of every fit/test; the run is ended only by
    `close()`. A failure still ends it at once: KILLED for Ctrl-C or SIGTERM (resumable), else FAILED. MLflow's
    system metrics monitor, if watching, stops first, flushing what it sampled.
    """

    monitor: SystemMetricsMonitor | None = None

    def watch_system(self, resumed: bool) -> None:
        """Log CPU, memory, disk and network (and GPU where its library is) as `system/*` metrics, every 10 s
        (MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL), with MLflow's own monitor; a resumed run continues its steps."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor  # imports psutil

        self.monitor = SystemMetricsMonitor(self.run_id, resume_logging=resumed, tracking_uri=self._tracking_uri)
        self.monitor.start()

    def _end(self, status: str) -> None:
        if self.monitor is not None:
            self.monitor.finish()
            # MLflow's monitor drops the samples of its last, unfinished window: a run shorter than one
            # interval would have no system metrics at all. Publish them before the run ends.
            if last := self.monitor.aggregate_metrics():
                self.monitor.publish_metrics(last)
                self.monitor.mlflow_logger.flush()
            self.monitor = None
        super().finalize(status)

    def finalize(self, status: str = "success") -> None:
        if status == "failed" and interrupted(sys.exc_info()[1]):
            status = "KILLED"
        if status != "success":
            self._end(status)

    def close(self) -> None:
        self._end("success")


# Tag of a resumed run: the sweep (parent run id) that resumed it last. A run keeps the parent that started it, and
# a sweep stopped by SIGTERM or Ctrl-C marks KILLED the runs its killed workers left RUNNING by both tags.
RESUMED_IN = "resumed_in"


def run_name(cfg: DictConfig) -> str:
    """The paper's row (or the model's knobs) and the seed, and a mixture's weighting unless it is the tables' fixed
    0.5 (MLP6 mix=learned). MLflow's random names repeat under a fixed seed."""
    knobs = {k: v for k, v in cfg.model.items() if k != "_target_"}
    what = cfg.get("row") or " ".join(f"{k}={v}" for k, v in knobs.items())
    mode = knobs.get("mode", knobs.get("mix", "none"))
    if cfg.get("row") and mode not in ("none", "fixed"):
        what += f" mix={mode}"
    return f"{what} seed={cfg.seed}"


def open_run(cfg: DictConfig, corpus: Corpus, resume: str | None = None, **extra_tags: str) -> RunLogger:
    """Create the MLflow run of this job, with its params, tags and dataset (and its code's uncommitted changes), or
    reopen run `resume` (status RUNNING again); fails with one line if the store is unusable."""
    uri, experiment = cfg.tracking.uri, cfg.tracking.experiment
    if resume:
        client = mlflow.MlflowClient(uri)
        if cfg.tracking.get("parent_run_id"):  # a sweep other than the run's parent may resume it: see RESUMED_IN
            client.set_tag(resume, RESUMED_IN, cfg.tracking.parent_run_id)
        client.update_run(resume, status="RUNNING")
        log.info("MLflow run %s resumed in experiment %r at %s", resume, experiment, redact(uri))
        logger = RunLogger(experiment_name=experiment, tracking_uri=uri, run_id=resume)
    else:
        logger = _new_run(cfg, corpus, extra_tags)
    if cfg.tracking.get("system_metrics"):
        logger.watch_system(resumed=bool(resume))
    return logger


def _new_run(cfg: DictConfig, corpus: Corpus, extra_tags: dict[str, str]) -> RunLogger:
    uri, experiment = cfg.tracking.uri, cfg.tracking.experiment
    commit, diff = code_state()
    tags = {**data_tags(corpus), "git_commit": commit, "code_fingerprint": code_fingerprint(commit, diff)}
    tags |= {"corpus": corpus.name, **environment_tags(), **extra_tags}
    if is_commit(commit):  # MLflow's own, the UI's Version column; what '+dirty' adds is git_diff.patch
        tags[MLFLOW_GIT_COMMIT] = commit.removesuffix("+dirty")
    tags |= family_of(cfg.model).tags(cfg) | {"key_version": KEY_VERSION}
    for key in ("row", "study", "note"):
        if cfg.get(key):
            tags[key] = str(cfg[key])
    if cfg.tracking.get("parent_run_id"):
        tags["mlflow.parentRunId"] = cfg.tracking.parent_run_id  # the sweep's parent run (nplm_repro.sweeping.sweep)
    tags = {k: redact(v) for k, v in tags.items()}
    params, name = flat_params(cfg), cfg.tracking.run_name or run_name(cfg)  # a config error is not the store's
    try:
        logger = RunLogger(experiment_name=experiment, tracking_uri=uri, run_name=name, tags=tags)
        logger.log_hyperparams(params)
        log_corpus(logger.experiment, logger.run_id, corpus_input(cfg.data, corpus))
        if diff:
            logger.experiment.log_text(logger.run_id, redact(diff), "git_diff.patch")
    except Exception as error:  # noqa: BLE001  MLflow raises many types for a bad store; all mean the same
        raise NplmError(f"tracking store {redact(uri)!r} is unusable: {redact(store_error(error))}") from None
    log.info("MLflow run %s in experiment %r at %s", logger.run_id, experiment, redact(uri))
    return logger
