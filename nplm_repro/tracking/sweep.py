"""Sweeps (`nplm-train -m study=<study>`, any `-m`): one MLflow parent run per sweep, every job's run nested under it.

`MlflowSweep` is a Hydra callback (conf/config.yaml, `hydra.callbacks`). In the launching process, before any
job starts, it creates the store (so parallel jobs never race to create SQLite's tables) and the parent run:
tags `sweep=true`, `study`, `sweep_dir`, params the command-line overrides and the swept values. Every `-m`
has one: a sweep file's, `-m key=a,b` alone, or a search (Optuna's sweeper). The swept values recorded are those
the sweeper sweeps: the config's `hydra.sweeper.params` as the command line narrows or widens them. Each job,
in whatever process or node the launcher gives it, learns the parent's id in `on_job_start` (the callback is
pickled with the launcher) through `NPLM_PARENT_RUN_ID`, which `tracking.parent_run_id` reads; the job's run
gets the tag `mlflow.parentRunId`. A re-run of the same sweep (same study, overrides and swept values) reuses
its parent run, so the jobs it finishes land next to those that finished before.

Hydra calls `on_multirun_end` only when every job succeeded; `ends_sweeps` ends the sweep otherwise: FAILED,
with its report listing the failed rows, after a failed job; KILLED after Ctrl-C or SIGTERM, and with it the
runs of joblib's workers, which joblib kills outright (each once its config_lock shows the worker gone), the runs
it resumed from earlier sweeps included (tag `resumed_in`).

The report is written by the function `report_with` names (conf/config.yaml: `nplm_repro.report.write_study`),
looked up when the sweep ends: tracking does not import the reporting code. It returns the files it wrote and
the study's headline numbers, which the parent run keeps as artifacts (`report/`) and metrics.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import mlflow
from filelock import Timeout
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.utils import get_method
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from omegaconf import DictConfig, OmegaConf

from nplm_repro.cli import errors_exit
from nplm_repro.errors import interrupted, sigterm_interrupts
from nplm_repro.tracking.ledger import end_orphans
from nplm_repro.tracking.locks import config_lock
from nplm_repro.tracking.records import RESUMED_IN
from nplm_repro.tracking.store import check_store, ensure_experiment, redact

log = logging.getLogger(__name__)

PARENT_ENV = "NPLM_PARENT_RUN_ID"
PARENT_FILE = "mlflow_parent_run_id"  # in the sweep directory, for the record


def sweep_key(study: str | None, overrides: list[str], params: dict[str, Any]) -> str:
    """What makes two sweep commands the same sweep: the study, the overrides and the config's
    `hydra.sweeper.params` (as the config has them: with the overrides, they say what is swept). Left out: `rerun`,
    and the choice `study=<name>` (the study is keyed already): `-m study=grid` is the sweep that
    `-cd sweeps -cn grid` was, and resumes its parent run."""
    kept = sorted(o for o in overrides if not o.lstrip("+~").startswith(("rerun=", "study=")))
    text = json.dumps({"study": study, "overrides": kept, "params": params}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def swept(params: dict[str, Any], overrides: list[str]) -> dict[str, str]:
    """What the sweeper sweeps, key by key: the config's `params`, each as the command line last sets it (the
    sweepers, Hydra's and Optuna's, read `params` then the command line), and the command line's own sweeps."""
    values = {name.lstrip("+~"): str(value) for name, value in params.items()}
    for override in OverridesParser.create().parse_overrides(overrides):
        name = override.get_key_element().lstrip("+~")
        if not override.is_delete() and (override.is_sweep_override() or name in values):
            values[name] = override.input_line.split("=", 1)[1]
    return values


class MlflowSweep(Callback):
    """Open one MLflow parent run per multirun and nest every job's run under it (tag mlflow.parentRunId)."""

    open: ClassVar[MlflowSweep | None] = None  # the sweep this process launched, until it ends

    def __init__(self, report_with: str | None = None) -> None:
        # "module.function"(uri, experiment, study, out) -> (files, metrics): writes the study's report
        self.report_with = report_with
        self.parent_run_id: str | None = None
        self.uri: str | None = None
        self.experiment: str | None = None
        self.study: str | None = None
        self.report: str | None = None  # the directory the study's report goes to, or None
        self.launcher: str = ""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.uri, experiment = config.tracking.uri, config.tracking.experiment
        study = config.get("study")
        self.experiment, self.study, self.report = experiment, study, config.get("report")
        self.launcher = config.hydra.launcher._target_
        overrides = list(OmegaConf.to_container(config.hydra.overrides.task, resolve=True))
        params = config.hydra.sweeper.get("params")  # null without a sweep file: `-m key=a,b`
        params = OmegaConf.to_container(params, resolve=True) if params is not None else {}
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        key = sweep_key(study, overrides, params)
        with errors_exit():  # Hydra would only warn of a callback's error, and run every job against that store
            check_store(self.uri)  # creates the SQLite store and its tables, once, here
        client = mlflow.MlflowClient(self.uri)
        experiment_id = ensure_experiment(client, experiment)
        previous = client.search_runs(
            [experiment_id],
            f"tags.sweep = 'true' and tags.sweep_key = '{key}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if previous:
            self.parent_run_id = previous[0].info.run_id
            client.update_run(self.parent_run_id, status="RUNNING")
            log.info(
                "sweep %s: resuming parent run %s (same study, overrides and swept values)", key, self.parent_run_id
            )
        else:
            tags = {"sweep": "true", "sweep_key": key, "study": study or "", "launcher": self.launcher}
            tags["sweeper"] = config.hydra.sweeper._target_
            run = client.create_run(experiment_id, run_name=f"{study or 'sweep'} {sweep_dir.name}", tags=tags)
            self.parent_run_id = run.info.run_id
            client.log_param(self.parent_run_id, "sweep.overrides", redact(" ".join(overrides)))
            for name, values in swept(params, overrides).items():
                client.log_param(self.parent_run_id, f"sweep.params.{name}", redact(values))
            log.info(
                "sweep %s: parent run %s in experiment %r at %s", key, self.parent_run_id, experiment, redact(self.uri)
            )
        client.set_tag(self.parent_run_id, "sweep_dir", str(sweep_dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_FILE).write_text(self.parent_run_id + "\n")
        os.environ[PARENT_ENV] = self.parent_run_id
        MlflowSweep.open = self

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent_run_id:  # set only in MULTIRUN
            os.environ[PARENT_ENV] = self.parent_run_id

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.end("FINISHED")

    def end(self, status: str) -> None:
        """End the parent run; unless interrupted, first write the study's report (failed rows listed as failed)
        and keep it on the parent run."""
        MlflowSweep.open = None
        try:
            if status != "KILLED" and self.report and self.study and self.report_with:
                report = get_method(self.report_with)
                self.keep_report(*report(self.uri, self.experiment, self.study, Path(self.report)))
        finally:
            if self.parent_run_id:
                mlflow.MlflowClient(self.uri).set_terminated(self.parent_run_id, status)
                if status == "KILLED" and "joblib" in self.launcher:  # SLURM's jobs live on without the launcher
                    self.end_killed_jobs()

    def keep_report(self, files: list[Path], metrics: dict[str, float]) -> None:
        """The report's files as the parent run's artifacts (`report/`), its headline numbers as its metrics."""
        client = mlflow.MlflowClient(self.uri)
        for path in files:
            client.log_artifact(self.parent_run_id, str(path), "report")
        for name, value in metrics.items():
            client.log_metric(self.parent_run_id, name, value)
        log.info(
            "sweep: parent run %s keeps the report's %d files and %d numbers",
            self.parent_run_id,
            len(files),
            len(metrics),
        )

    def end_killed_jobs(self, wait: float = 30.0) -> None:
        """Mark KILLED the runs this sweep's workers, now gone, left RUNNING (their config_lock is free): its
        children, and the runs of earlier sweeps it resumed."""
        client = mlflow.MlflowClient(self.uri)
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is None:
            return
        for tag in (MLFLOW_PARENT_RUN_ID, RESUMED_IN):
            query = f"tags.{tag} = '{self.parent_run_id}' and attributes.status = 'RUNNING'"
            for run in client.search_runs([experiment.experiment_id], query):
                key = run.data.tags.get("config_key")
                try:
                    with config_lock(key, timeout=wait):
                        end_orphans(self.uri, self.experiment, key)
                except Timeout:
                    log.warning(
                        "run %s: its job still holds its lock after %.0f s; left RUNNING", run.info.run_id, wait
                    )


def ends_sweeps(main: Callable[[], None]) -> Callable[[], None]:
    """Wrap the @hydra.main function: a sweep that a failed job or an interrupt stops (Hydra then skips
    on_multirun_end) still ends its parent run, FAILED with the report written, or KILLED; the error goes on."""

    @functools.wraps(main)
    def run() -> None:
        sigterm_interrupts()  # in the launching process too, or SIGTERM would end it with the parent RUNNING
        try:
            main()
        except BaseException as error:
            if MlflowSweep.open is not None:
                MlflowSweep.open.end("KILLED" if interrupted(error) else "FAILED")
            raise

    return run
