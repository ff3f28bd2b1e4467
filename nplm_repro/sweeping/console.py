"""A sweep's console: one progress display for the whole sweep, each job's output in its own log file.

Jobs that joblib runs side by side would otherwise share the terminal: their progress bars write over each other
on one line. `SweepConsole` (a Hydra callback, conf/config.yaml) sends each such job's output, progress bars,
warnings and errors, to `output.log` in its job directory, and draws in the launching process one line: jobs done,
running and failed out of the total, each running job's row and epoch, and the time left. A failed job gets a line
of its own with its error and its log's path. On a terminal the line is redrawn in place; elsewhere (a CI log, a
file) a line is written when a job starts or ends. Hydra's basic launcher runs one job at a time in this process,
its output on the terminal as a single run's: a failed job gets the same line of its own, with its log (Hydra's
`<job>.log` in its job directory), as every job of the sweep ends, where Hydra would say only the first error.
SLURM's jobs have their own logs and searches (Optuna's) keep their output as it is.

A job says where it is through its status file (nplm_repro/progress.py): its row, its overrides less its seed
(`job_key`) and the time when it starts, the epoch it trains, whether it waits for another job's MLP, and how it
ended. The time left (`time_left`) costs each job by those of its key, or of its family's kind (`plan`: trained,
counted, mixed), that were timed: Table 1's first MLP takes minutes, its baselines and mixtures seconds.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from joblib import effective_n_jobs
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.errors import one_line
from nplm_repro.family import family_of
from nplm_repro.progress import STATUS_ENV, add_display, read_status, report_status
from nplm_repro.sweeping.sweep import KNOWN_JOBS, jobs
from nplm_repro.tracking.study_rows import less_seed

OUTPUT_LOG = "output.log"  # in each job's directory: everything the job printed
STATUS_DIR = ".jobs"  # in the sweep's directory: one status file per job, <job number>.json
FINAL = ("done", "failed")
QUICK = 30.0  # seconds: a job done this fast found its run made (skipped, adopted) and tells nothing of the cost
BASIC_LAUNCHER = f"{BasicLauncher.__module__}.{BasicLauncher.__name__}"  # one job at a time, in this process


def row_of(config: DictConfig) -> str:
    """How the console names a job (its status, the line of its failure): its row, else its overrides, else its
    number."""
    return config.get("row") or " ".join(config.hydra.overrides.task) or f"job {config.hydra.job.num}"


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 45s, 3m05s, 1h02m."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass(frozen=True)
class Plan:
    """What the time left needs of a sweep before its jobs start: each job's `job_key` and its family's kind
    (trained, counted, mixed; None where it does not compose), and how many jobs run at once."""

    jobs: tuple[tuple[str, str | None], ...]
    workers: int = 1


def job_key(overrides: Iterable[str]) -> str:
    """A job's overrides less its seed, as one string: jobs that differ only in their seed cost alike."""
    return " ".join(sorted(less_seed(overrides)))


def plan(config: DictConfig) -> Plan:
    """The sweep's jobs as the time left costs them, each kind of job composed once (as `compose_jobs` composes
    them) and its family asked its kind: a row not yet timed is costed as the timed rows of its kind, so that the
    first MLP's minutes are not taken for the pace of the baselines' seconds."""
    loader = GlobalHydra.instance().config_loader()
    kinds: dict[str, str | None] = {}
    every = []
    for job in jobs(config):
        key = job_key(job)
        if key not in kinds:
            try:
                composed = loader.load_sweep_config(config, list(job))
                kinds[key] = family_of(composed.model).kind(composed)
            except (HydraException, OmegaConfBaseException, ImportError, AttributeError, ValueError):
                kinds[key] = None  # refused before any job (sweep.py `compose_jobs`), or fails as its own job
        every.append((key, kinds[key]))
    return Plan(tuple(every), effective_n_jobs(OmegaConf.select(config, "hydra.launcher.n_jobs", default=1)))


def _share(status: dict[str, Any]) -> float:
    """Of a whole job, what this launch does: a resumed job's epochs trained before it (`epochs_before`) are done."""
    max_epochs = status.get("max_epochs")
    return 1 - status.get("epochs_before", 0) / max_epochs if max_epochs else 1.0


def _pace(status: dict[str, Any], now: float) -> float | None:
    """Seconds an epoch of a training job takes at this launch's pace; None before its first epoch here."""
    trained = status.get("epoch", 1) - 1 - status.get("epochs_before", 0)
    if status.get("state") != "training" or trained <= 0 or "started" not in status:
        return None
    return (now - status["started"]) / trained


def _mean_of(values: dict[str, list[float]], kinds: dict[str, str | None]) -> Callable[[str], float | None]:
    """A key's mean of `values`, else the mean over the keys of its family's kind; None where neither has one."""
    of_key = {key: sum(v) / len(v) for key, v in values.items()}
    alike: dict[str | None, list[float]] = {}
    for key, mean in of_key.items():
        alike.setdefault(kinds.get(key), []).append(mean)
    of_kind = {kind: sum(m) / len(m) for kind, m in alike.items() if kind is not None}
    return lambda key: of_key.get(key, of_kind.get(kinds.get(key)))


def time_left(plan: Plan, statuses: list[dict[str, Any]], now: float) -> tuple[float | None, int]:
    """Seconds until the sweep ends, and how many jobs that leaves out (their kind of row not yet timed).

    A training job has its epochs to go at its own pace: to where the done jobs of its key stopped (early stopping
    ends most before `max_epochs`), else those of its family's kind, else to `max_epochs`. Any other job not done
    costs what the done jobs of its key cost, else what its key's training jobs are on pace to cost, else what the
    timed keys of its family's kind cost; a started one less its seconds so far. The sum is shared among the
    workers, but no sooner than the longest job alone ends (a job runs on one worker). A job that ended within
    `QUICK` seconds found its run made and tells nothing of the cost, nor do the epochs a resumed job had trained
    before this launch. None before anything is timed."""
    kinds = dict(plan.jobs)
    finished = [s for s in statuses if s.get("state") == "done"]
    stopped: dict[str, list[float]] = {}  # the epochs each key's done training jobs ran
    for status in finished:
        if "epoch" in status:
            stopped.setdefault(status.get("job", ""), []).append(status["epoch"])
    epochs_of = _mean_of(stopped, kinds)

    def epochs(status: dict[str, Any]) -> float:
        """How many epochs a training job is expected to run, in all."""
        return min(epochs_of(status.get("job", "")) or status["max_epochs"], status["max_epochs"])

    done: dict[str, list[float]] = {}
    on_pace: dict[str, list[float]] = {}
    for status in statuses:
        key, share = status.get("job", ""), _share(status)
        if status.get("state") == "done" and status.get("seconds", 0.0) >= QUICK and share > 0:
            done.setdefault(key, []).append(status["seconds"] / share)
        elif (pace := _pace(status, now)) is not None:
            on_pace.setdefault(key, []).append(pace * epochs(status))
    if not done and not on_pace:
        return None, 0
    cost_of = _mean_of(on_pace | done, kinds)
    running = [s for s in statuses if s.get("state") not in FINAL]
    pending = Counter(key for key, _ in plan.jobs) - Counter(s.get("job", "") for s in statuses)
    each, untimed = [], 0  # the seconds each job has to go
    for status in [*running, *({"job": key} for key in pending.elements())]:
        cost = cost_of(status.get("job", ""))
        if (pace := _pace(status, now)) is not None:
            each.append(pace * (max(epochs(status), status["epoch"]) - status["epoch"] + 1))
        elif cost is None:
            untimed += 1
        else:
            each.append(max(0.0, cost * _share(status) - (now - status.get("started", now))))
    return max(sum(each) / max(1, min(plan.workers, len(each))), max(each, default=0.0)), untimed


def progress_line(study: str, plan: Plan, statuses: list[dict[str, Any]], elapsed: float, now: float) -> str:
    """The display's one line: `quickstart: 1/4 done, 2 running, 0 failed | MLP9 epoch 2/3, Del. Int. | ~1m20s left`,
    with `, 3 untimed` where jobs of a kind of row not yet timed are left out of the time left (`time_left`), and
    the time the sweep took once every job has ended."""
    total = len(plan.jobs)
    done = sum(s.get("state") == "done" for s in statuses)
    failed = sum(s.get("state") == "failed" for s in statuses)
    running = [s for s in statuses if s.get("state") not in FINAL]
    parts = [f"{study}: {done}/{total} done, {len(running)} running, {failed} failed"]
    shown = []
    for status in running:
        what = status.get("row", "starting")
        if status.get("state") == "training":
            what += f" epoch {status['epoch']}/{status['max_epochs']}"
        elif status.get("state") in ("waiting", "scoring"):
            what += f" {status['state']}"
        shown.append(what)
    if shown:
        parts.append(", ".join(shown))
    if done + failed >= total:
        parts.append(f"{duration(elapsed)}")
        return " | ".join(parts)
    left, untimed = time_left(plan, statuses, now)
    if left is not None:
        parts.append(f"~{duration(left)} left" + (f", {untimed} untimed" if untimed else ""))
    return " | ".join(parts)


def job_error(job: JobReturn) -> BaseException | None:
    """The error a failed job raised, read through JobReturn's public `return_value`, which raises it and says so on
    stderr (kept quiet here: the caller says it in one line); None for a job that did not fail."""
    if job.status != JobStatus.FAILED:
        return None
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            job.return_value  # noqa: B018 (raises the job's error)
        except BaseException as error:  # noqa: BLE001 (the job's own error, whatever it was)
            return error
    return None


class SweepConsole(Callback):
    """Each job's output into its own log, and one progress display for the sweep (joblib's launcher); a line for
    each failed job (joblib's launcher and Hydra's basic one)."""

    def __init__(self, every: float = 1.0) -> None:
        self.every = every  # seconds between redraws on a terminal
        self.in_process = False  # Hydra's basic launcher: the jobs run here, their output on the terminal
        self.status_dir: Path | None = None  # set in the launching process, pickled with the callback to the jobs
        self._saved: tuple[int, int] | None = None  # a job's own stdout and stderr while its output goes to its log
        self._started = 0.0  # when the job began (time.monotonic), for the seconds it took
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:  # what travels to joblib's workers: not the display's thread
        return {"every": self.every, "status_dir": self.status_dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["every"])
        self.status_dir = state["status_dir"]

    # In the launching process

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.sweeper._target_ not in KNOWN_JOBS:
            return
        self.in_process = config.hydra.launcher._target_ == BASIC_LAUNCHER
        if "joblib" not in config.hydra.launcher._target_:
            return
        jobs_plan = plan(config)
        self.status_dir = Path(str(config.hydra.sweep.dir)).resolve() / STATUS_DIR
        self.status_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.status_dir.glob("*.json"):  # a sweep run again into the same directory
            stale.unlink()
        study = config.get("study") or "sweep"
        self._thread = threading.Thread(target=self._draw, args=(study, jobs_plan, sys.stderr), daemon=True)
        self._thread.start()
        add_display(self.close)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.close()

    def close(self) -> None:
        """Draw the last line and stop (also when a failed job or Ctrl-C ends the sweep: `ends_sweeps`)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None

    def _draw(self, study: str, jobs_plan: Plan, out: TextIO) -> None:
        start, tty = time.monotonic(), out.isatty()
        said: dict[str, str] = {}  # per job, the state last written (not on a terminal) or reported (failures)
        last = ""
        while True:
            stopping = self._stop.wait(self.every)
            statuses = {p.stem: read_status(p) for p in sorted(self.status_dir.glob("*.json"))}
            line = progress_line(study, jobs_plan, list(statuses.values()), time.monotonic() - start, time.time())
            for job, status in statuses.items():
                state = status.get("state", "")
                if state == "failed" and said.get(job) != "failed":
                    failure = f"job {job} ({status.get('row')}) failed: {status.get('error', '')}; "
                    out.write(("\r\x1b[K" if tty else "") + failure + f"its output: {status.get('log', '?')}\n")
                started = state not in ("", "starting") and said.get(job) in (None, "", "starting")
                if not tty and (started or (state in FINAL and said.get(job) != state)) and line != last:
                    out.write(line + "\n")
                    last = line
                said[job] = state
            if tty:
                out.write("\r\x1b[K" + line[: shutil.get_terminal_size().columns - 1])
            if stopping:
                out.write(("\n" if tty else "") + (line + "\n" if not tty and line != last else ""))
                out.flush()
                return
            out.flush()

    # In the job's process

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.status_dir is None:
            return
        job_dir = Path(str(config.hydra.runtime.output_dir))
        job_dir.mkdir(parents=True, exist_ok=True)
        log = job_dir / OUTPUT_LOG
        os.environ[STATUS_ENV] = str(self.status_dir / f"{config.hydra.job.num}.json")
        key = job_key(config.hydra.overrides.task)
        report_status(row=row_of(config), state="starting", log=str(log), job=key, started=time.time())
        self._started = time.monotonic()
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        with open(log, "ab") as f:  # the descriptors, not sys.stdout: torch's and C libraries' output goes there too
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self.in_process and job_return.status == JobStatus.FAILED:
            say_failed(config, job_error(job_return))
        if self._saved is None:
            return
        seconds = time.monotonic() - self._started
        if job_return.status == JobStatus.FAILED:
            error = job_error(job_return)
            print(f"error: {type(error).__name__}: {one_line(error)}", file=sys.stderr)
            report_status(state="failed", error=one_line(error), seconds=seconds)
        else:
            report_status(state="done", seconds=seconds)
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self._saved = None
        os.environ.pop(STATUS_ENV, None)


def say_failed(config: DictConfig, error: BaseException) -> None:
    """The line of a failed job of Hydra's basic launcher, as `_draw` writes one for joblib's: its number, its row,
    its error and where its log is (Hydra's job log: the job's own output went to the terminal)."""
    log = OmegaConf.select(config, "hydra.job_logging.handlers.file.filename", default=None)
    where = f"; its log: {log}" if log else ""
    line = f"job {config.hydra.job.num} ({row_of(config)}) failed: {one_line(error)}{where}"
    print(line, file=sys.stderr, flush=True)
