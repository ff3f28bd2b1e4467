"""Sweeps (`nplm-train -m study=<study>`, any `-m`): one MLflow parent run per sweep, every job's run nested under it.

`MlflowSweep` is a Hydra callback (conf/config.yaml, `hydra.callbacks`). In the launching process, before any
job starts, it refuses what would fail later (a search that could run nothing or would resume another's study, a
report directory that cannot be written, a declaration of its report that the report cannot apply, a job that does
not compose: `check_search`, `check_report_dir`, `check_declaration`, `compose_jobs`),
each one line and exit 2 with nothing written; then it creates the
store (so parallel jobs never race to create SQLite's tables) and the parent run:
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

The report is written by the function `report_with` names (conf/config.yaml: `nplm_repro.report.write_study`, what
`nplm-report` writes), looked up when the sweep ends: the config wires the command's writer in, so tracking imports
neither the reporting code nor a command (tests/test_layout.py). It returns the files it wrote and the study's
headline numbers, which the parent run keeps as artifacts (`report/`) and metrics. Then, as `nplm-report --register`
does after its report, a sweep whose jobs all ran registers its study's best trained model (sweeping/registry.py)
unless `tracking.register=false`; a run without weights is passed over there, never a failure. A report that cannot
be written, or a registration that fails, fails a sweep whose jobs all ran: Hydra turns a callback's error into a
warning and exits 0, so the parent run ends FAILED with the tag `error`, and `ends_sweeps` raises the error once
Hydra returns.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import mlflow
from filelock import Timeout
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.utils import get_method
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.errors import NplmError, interrupted, one_line, sigterm_interrupts
from nplm_repro.exits import errors_exit
from nplm_repro.paths import check_report_dir
from nplm_repro.progress import close_displays
from nplm_repro.storage.archive import SUFFIX, Archive
from nplm_repro.storage.finding import search
from nplm_repro.storage.locks import config_lock
from nplm_repro.storage.redaction import redact
from nplm_repro.storage.store import check_store, ensure_experiment
from nplm_repro.studies import check_claimed_rows, checked, claimed_rows
from nplm_repro.sweeping.registry import register_best
from nplm_repro.sweeping.search_checks import check_search
from nplm_repro.tracking.archived import add_runs
from nplm_repro.tracking.config_checks import check_config, check_corpus
from nplm_repro.tracking.ledger import end_orphans
from nplm_repro.tracking.records import RESUMED_IN
from nplm_repro.tracking.study_rows import (
    KNOWN_JOBS,
    check_controlled,
    composed,
    declared_rows,
    expand,
    less_seed,
)

log = logging.getLogger(__name__)

PARENT_ENV = "NPLM_PARENT_RUN_ID"
PARENT_FILE = "mlflow_parent_run_id"  # in the sweep directory, for the record


def sweep_key(study: str | None, overrides: list[str], params: dict[str, Any]) -> str:
    """What makes two sweep commands the same sweep: the study, the overrides and the config's
    `hydra.sweeper.params` (as the config has them: with the overrides, they say what is swept). Left out: `rerun`,
    the choice `study=<name>` (the study is keyed already): `-m study=grid` is the sweep that `-cd sweeps -cn grid`
    was, and resumes its parent run; and `tracking.uri` (the parent is looked for in that store): a study imported
    into a store at another path resumes its parent there."""
    kept = sorted(o for o in overrides if not o.lstrip("+~").startswith(("rerun=", "study=", "tracking.uri=")))
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


def jobs(config: DictConfig) -> list[list[str]]:
    """The overrides of every job of this multirun, as Hydra's basic sweeper makes them: its `params`, then the
    command line's overrides, each sweep expanded, their product in order."""
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()]
    arguments += OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    return expand(arguments, GlobalHydra.instance().config_loader())


def check_declaration(config: DictConfig) -> None:
    """What the study declares for its report (`reporting`), as its report will read it (studies.py `checked`: its
    keys, its claims' kinds) and every row its claims name one that the study file's jobs give (`declared_rows`):
    a typo is one line before any job, not a warning once every job has run and a report or a claim missing; and
    no claim on two rows whose jobs already differ in a key it does not name (`check_controlled`)."""
    if config.get("reporting") is None:
        return
    study = config.hydra.runtime.choices.get("study")  # the study file chosen, null for `+reporting...` alone
    where = f"study={study}" if study else "reporting"
    spec = checked(OmegaConf.to_container(config.reporting, resolve=True), where)
    if not study or not claimed_rows(spec) or config.hydra.sweeper._target_ not in KNOWN_JOBS:
        return
    loader = GlobalHydra.instance().config_loader()
    params = OmegaConf.to_container(config.hydra.sweeper.get("params") or {}, resolve=False)
    composed_jobs = composed(params, lambda job: loader.load_sweep_config(config, [f"study={study}", *job]), where)
    check_claimed_rows(spec, declared_rows(composed_jobs), where)
    check_controlled(spec, composed_jobs or [], where)


NAMED = 5  # jobs named in a refusal, then how many more


def compose_jobs(config: DictConfig) -> None:
    """Compose every job as its launcher will, and check its values as the job will (`check_config`; `check_corpus`:
    the corpus is there), before the store or the parent run is touched: a key that only some rows have (`-m
    experiment=kn3,mlp9 model.h=16`: an n-gram has no h) or a `data.path` that is not there is one line naming the
    jobs that refuse it. Jobs that differ only in their seed compose and check alike, so one of them is composed.
    Only the basic sweeper's jobs are known beforehand (Optuna draws a search's trials as it goes)."""
    if config.hydra.sweeper._target_ not in KNOWN_JOBS:
        return
    loader = GlobalHydra.instance().config_loader()
    every = jobs(config)
    seen: dict[tuple[str, ...], str | None] = {}  # a job less its seed -> why it is refused, or None
    refused: dict[str, list[str]] = {}  # why -> the jobs, each by the overrides that tell it from the others
    rows: dict[str, dict[str, list[str]]] = {}  # row -> each of its jobs (less the seed) -> the rows it mixes
    for job in every:
        kind = less_seed(job)
        if kind not in seen:
            try:
                composed = loader.load_sweep_config(config, list(job))
                with open_dict(composed):
                    del composed["hydra"]  # as Hydra hands a job its config
                check_config(composed)
                check_corpus(composed.data)
                seen[kind] = None
                if composed.get("row"):
                    own = " ".join(o for o in kind if any(o not in other for other in every)) or "its only job"
                    rows.setdefault(composed.row, {})[own] = list(OmegaConf.select(composed, "model.components") or [])
            except (HydraException, OmegaConfBaseException, NplmError) as error:
                seen[kind] = one_line(error)
        if (why := seen[kind]) is not None:
            own = [o for o in job if any(o not in other for other in every)]
            refused.setdefault(why, []).append(" ".join(own) or "its only job")
    if refused:
        raise NplmError("; ".join(_refusal(why, named, len(every)) for why, named in refused.items()))
    check_components(rows)


def check_components(rows: dict[str, dict[str, list[str]]]) -> None:
    """The rows the sweep's mixtures name (`model.components`), across its jobs (`rows`: row -> its jobs -> the rows
    each mixes): each names a row that one configuration declares (kn3 and kn5 are both 'Kneser-Ney back-off', and
    a component naming it would mix whichever ran last), and no row mixes itself through others (each would wait for
    the other for ever)."""
    mixes = {row: sorted({c for named in jobs.values() for c in named}) for row, jobs in rows.items()}
    for row, components in mixes.items():
        for component in components:
            if len(declared := rows.get(component, {})) > 1:
                raise NplmError(
                    f"model.components of row {row!r} names row {component!r}, which {len(declared)} configurations "
                    f"declare ({', '.join(declared)}): give each its own row name (the `row` of its experiment) so "
                    "that a component names exactly one (nothing was run)"
                )

    def cycle(path: list[str]) -> list[str] | None:
        for component in mixes.get(path[-1], []):
            if component in path:
                return [*path[path.index(component) :], component]
            if found := cycle([*path, component]):
                return found
        return None

    for row in mixes:
        if found := cycle([row]):
            raise NplmError(
                f"model.components: the rows mix one another in a cycle, {' -> '.join(found)} (nothing was run)"
            )


def _refusal(why: str, named: list[str], jobs: int) -> str:
    if len(named) == jobs:
        return f"{why}, in {'all ' if jobs > 1 else ''}{jobs} job{'s' if jobs > 1 else ''} (nothing was run)"
    more = f" and {len(named) - NAMED} more" if len(named) > NAMED else ""
    return f"{why}, in {len(named)} of {jobs} jobs: {', '.join(named[:NAMED])}{more} (nothing was run)"


class ReportNotWritten(Exception):
    """The jobs of a sweep ran, but its study's report could not be written."""


class NotRegistered(Exception):
    """The jobs of a sweep ran and its report was written, but its study's best model could not be registered."""


class MlflowSweep(Callback):
    """Open one MLflow parent run per multirun and nest every job's run under it (tag mlflow.parentRunId)."""

    open: ClassVar[MlflowSweep | None] = None  # the sweep this process launched, until it ends
    failure: ClassVar[Exception | None] = None  # why a sweep whose jobs all ran failed, for `ends_sweeps`

    def __init__(self, report_with: str | None = None) -> None:
        # "module.function"(uri, experiment, study, out, declared) -> (files, metrics): writes the study's report
        self.report_with = report_with
        self.parent_run_id: str | None = None
        self.uri: str | None = None
        self.experiment: str | None = None
        self.study: str | None = None
        self.report: str | None = None  # the directory the study's report goes to, or None
        self.declared: dict[str, Any] | None = None  # what the study's file declares for its report (`reporting`)
        self.launcher: str = ""
        self.register = False  # tracking.register: the study's best MLP into the Model Registry when it ends
        self.experiment_id: str | None = None
        self.archived: Path | None = None  # the archive of runs written beside the report
        self.started = 0  # when it started, ms since the epoch: runs since are this sweep's (`made_now`)
        self.ended_before: int | None = None  # when the parent it resumed had ended

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = int(time.time() * 1000)
        self.uri, experiment = config.tracking.uri, config.tracking.experiment
        study = config.get("study")
        self.experiment, self.study, self.report = experiment, study, config.get("report")
        if config.get("reporting") is not None:
            self.declared = OmegaConf.to_container(config.reporting, resolve=True)
        self.launcher = config.hydra.launcher._target_
        self.register = bool(config.tracking.get("register", True))
        overrides = list(OmegaConf.to_container(config.hydra.overrides.task, resolve=True))
        params = config.hydra.sweeper.get("params")  # null without a sweep file: `-m key=a,b`
        params = OmegaConf.to_container(params, resolve=True) if params is not None else {}
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        key = sweep_key(study, overrides, params)
        with errors_exit():  # before anything is written: Hydra would only warn of a callback's error and go on
            check_search(config)  # a search's budget, space and study (search_checks.py)
            if self.writes_report():
                check_report_dir(self.report)
            check_declaration(config)
            compose_jobs(config)
        with errors_exit():  # Hydra would only warn of a callback's error, and run every job against that store
            check_store(self.uri)  # creates the SQLite store and its tables, once, here
        client = mlflow.MlflowClient(self.uri)
        experiment_id = self.experiment_id = ensure_experiment(client, experiment)
        previous = search(self.uri, experiment, "tags.sweep = 'true'", f"tags.sweep_key = '{key}'", max_results=1)
        if previous:
            self.parent_run_id, self.ended_before = previous[0].info.run_id, previous[0].info.end_time
            client.update_run(self.parent_run_id, status="RUNNING")
            if "error" in previous[0].data.tags:  # why an earlier attempt failed; this one may not
                client.delete_tag(self.parent_run_id, "error")
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

    def writes_report(self) -> bool:
        return bool(self.report and self.study and self.report_with)

    def end(self, status: str) -> None:
        """End the parent run; unless interrupted, first write the study's report (failed rows listed as failed)
        and keep it on the parent run, then, if every job ran, register the study's best model, as `nplm-report
        --register` does. A report that cannot be written, or a registration that fails, ends a sweep whose jobs
        all ran FAILED, with the tag `error`, and is kept in `MlflowSweep.failure` for `ends_sweeps`; after a failed
        job it is only logged (the job's error is the sweep's). A study with nothing to report is a warning
        (`report_with`'s), one with nothing to register a line of the log (`register_best`'s)."""
        MlflowSweep.open = None
        registering = False
        try:
            if status != "KILLED" and self.writes_report():
                report = get_method(self.report_with)
                self.keep_report(*report(self.uri, self.experiment, self.study, Path(self.report), self.declared))
            if status == "FINISHED" and self.register and self.study:
                registering = True
                register_best(self.uri, self.experiment, self.study)
        except Exception as error:  # noqa: BLE001  whatever stopped it, the report or the registration is missing
            if registering:
                failure: Exception = NotRegistered(
                    f"the study's best model was not registered: {type(error).__name__}: {one_line(error)} (its "
                    f"runs and report are recorded: nplm-report --study {self.study} --register registers it)"
                )
            else:
                failure = ReportNotWritten(
                    f"report={self.report}: the study's report was not written: {type(error).__name__}: "
                    f"{one_line(error)} (its runs are recorded: nplm-report --study {self.study} writes it)"
                )
            failure.__context__ = error  # the traceback, for HYDRA_FULL_ERROR=1
            log.error("sweep: %s", redact(str(failure)))
            if status == "FINISHED" and self.parent_run_id:
                status, MlflowSweep.failure = "FAILED", failure
                mlflow.MlflowClient(self.uri).set_tag(self.parent_run_id, "error", redact(str(failure)))
        except BaseException as error:
            if interrupted(error):
                status = "KILLED"
            raise
        finally:
            if self.parent_run_id:
                made = self.made_now()
                # a sweep that ran nothing (every job's run in the store) leaves its parent's end as it was
                end = self.ended_before if not made and status == "FINISHED" else None
                mlflow.MlflowClient(self.uri).set_terminated(self.parent_run_id, status, end_time=end)
                self.archive_parent()
                if status == "KILLED" and "joblib" in self.launcher:  # SLURM's jobs live on without the launcher
                    self.end_killed_jobs()
                else:
                    say_what_ran(made)
                    log.info("sweep: its runs in MLflow's dashboard: %s", dashboard(self.uri, self.experiment_id))

    def made_now(self) -> list[mlflow.entities.Run]:
        """The runs this sweep's jobs made (those that found their run in the store made none)."""
        mine = f"tags.{MLFLOW_PARENT_RUN_ID} = '{self.parent_run_id}'"
        return search(self.uri, self.experiment, mine, f"attributes.start_time >= {self.started}")

    def archive_parent(self) -> None:
        """The parent run as it ended, in the archive the report was written with (its status, its headline
        numbers); nothing without one."""
        if self.archived is not None:
            try:
                add_runs(self.uri, Archive.read(self.archived), self.archived, [self.parent_run_id])
            except (NplmError, OSError) as error:
                log.warning("sweep: the archive %s keeps the parent run as it was: %s", self.archived, error)

    def keep_report(self, files: list[Path], metrics: dict[str, float]) -> None:
        """The report's files as the parent run's artifacts (`report/`), its headline numbers as its metrics."""
        self.archived = next((path for path in files if path.name.endswith(SUFFIX)), None)
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
        children, and the runs of earlier sweeps it resumed. `wait`: the seconds to wait for the locks, all of them
        together, so that a stopped sweep ends in that time however many runs it left."""
        deadline = time.monotonic() + wait
        for tag in (MLFLOW_PARENT_RUN_ID, RESUMED_IN):
            running = f"tags.{tag} = '{self.parent_run_id}'", "attributes.status = 'RUNNING'"
            for run in search(self.uri, self.experiment, *running):
                key = run.data.tags.get("config_key")
                try:
                    with config_lock(key, timeout=max(0.0, deadline - time.monotonic())):
                        end_orphans(self.uri, self.experiment, key)
                except Timeout:
                    log.warning(
                        "run %s: its job still holds its lock after %.0f s; left RUNNING", run.info.run_id, wait
                    )


# The experiment's runs, not MLflow 3's GenAI overview of traces, on which its UI opens any experiment in a browser
# that has not chosen otherwise (docs/tracking.md): the UI's own query for its "Model training" view
RUNS_VIEW = "workflowType=machine_learning"


def say_what_ran(made: list[mlflow.entities.Run]) -> None:
    """One line: how many runs a sweep made, how many of them adopted a model trained already; or that it ran
    nothing, every job's run being in the store (a study resumed from its imported archive)."""
    if made:
        adopted = sum("adopted_from" in run.data.tags for run in made)
        log.info(
            "sweep: %d runs made now (%d of them adopted a model trained already); every other job's run was in the "
            "store",
            len(made),
            adopted,
        )
    else:
        log.info("sweep: nothing ran: every job's run was in the store already (each job skipped)")


def dashboard(uri: str, experiment_id: str | None) -> str:
    """Where a user sees an experiment's runs: the server's page, or the command that serves a local store; the
    link opens on the runs table."""
    page = f"#/experiments/{experiment_id}?{RUNS_VIEW}"
    if uri.startswith(("http://", "https://")):
        return f"{redact(uri).rstrip('/')}/{page}"
    return f"mlflow ui --backend-store-uri {redact(uri)}, then open http://127.0.0.1:5000/{page}"


def ends_sweeps(main: Callable[[], None]) -> Callable[[], None]:
    """Wrap the @hydra.main function: a sweep that a failed job or an interrupt stops (Hydra then skips
    on_multirun_end) still ends its parent run, FAILED with the report written, or KILLED; the error goes on. A
    sweep whose report could not be written (`MlflowSweep.failure`: Hydra swallows a callback's errors) raises that
    error once Hydra returns, so the command fails."""

    @functools.wraps(main)
    def run() -> None:
        sigterm_interrupts()  # in the launching process too, or SIGTERM would end it with the parent RUNNING
        try:
            main()
        except BaseException as error:
            close_displays()
            if MlflowSweep.open is not None:
                MlflowSweep.open.end("KILLED" if interrupted(error) else "FAILED")
            raise
        failure, MlflowSweep.failure = MlflowSweep.failure, None
        if failure is not None:
            raise failure

    return run
