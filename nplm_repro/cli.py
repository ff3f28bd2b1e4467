"""How commands end: a bad key or value is one line and exit 2, any other error one line and exit 1, Ctrl-C or
SIGTERM one line and exit 130 (a run being recorded ends KILLED). The same rule holds in a single run and a sweep."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.errors import NplmError, interrupted, one_line
from nplm_repro.progress import close_displays

EXIT_FAILED = 1  # anything else that went wrong: the run is FAILED, its traceback in the run's error.txt
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # as a shell reports a job stopped by Ctrl-C


# Hydra's words that need our fix beside them: `+experiment=mlp5` since conf/config.yaml lists the group
# (`experiment: null`), hparams_search=... without the optional Optuna sweeper, and an editable install made
# before conf/ was installed as the package nplm_repro.conf (pyproject.toml's package-dir)
HINTS = {
    "Primary config module 'nplm_repro.conf' not found": " (an install from before conf/ was packaged: pip install -e .)",
    "Multiple values for experiment.": " (the group is in the defaults now: write experiment=<row>, without the +)",
    "Could not find 'hydra/sweeper/optuna'": " (Hydra's Optuna sweeper is an extra: .venv/bin/pip install -e '.[optuna]')",
}


# Hydra's lexer refuses an unquoted value holding a character outside its grammar (ü, a dash —, #, an apostrophe),
# naming the override: its key (with any +, ++ or ~ before it) is the one the hint quotes
UNQUOTED = re.compile(r"LexerNoViableAltException: ([+~]*[^=\s]+)=")


def hints(message: str) -> str:
    """What to add to Hydra's one-line `message`: the fixes of HINTS whose words it holds, and how to quote a value
    that Hydra's lexer refused (`UNQUOTED`)."""
    found = "".join(hint for words, hint in HINTS.items() if words in message)
    if refused := UNQUOTED.search(message):
        found += (
            " (a value with characters other than ASCII letters, digits, spaces and _-./ needs quotes: "
            f"'{refused[1]}=\"...\"')"
        )
    return found


def end_lines() -> None:
    """Before a command's last line: the sweep's display stopped (`close_displays`) and every progress bar still
    open (Lightning's, on stdout) closed, each ending its line. An open bar would otherwise be drawn again at exit,
    after the error, and the error would start on the bar's line wherever the two streams go to one file."""
    close_displays()
    bars = sys.modules.get("tqdm.std")  # loaded with the first bar: a command without one has none to close
    for bar in list(bars.tqdm._instances) if bars else []:
        bar.leave = True  # drawn once more, then a newline
        bar.close()
    sys.stdout.flush()


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    end_lines()
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(code)


HYDRA_TRACEBACK = "HYDRA_FULL_ERROR"  # Hydra's switch for its own commands
TRACEBACK = "NPLM_FULL_ERROR"  # the same switch for a command that is not Hydra's (nplm-report)
_traceback_env = HYDRA_TRACEBACK  # the switch of the running command, named in the line of an unexpected error
_user_wants_traceback = False  # that switch as the user set it, before `cli` sets HYDRA_FULL_ERROR for its own use
# Set on a sweep job's error before Hydra raises it again at the sweep's end (a plain attribute, kept when a
# launcher pickles the error back from its worker): `cli` then gives it the exit code it gets in a single run
RAISED_BY_JOB = "nplm_raised_by_job"


def _unexpected(error: Exception) -> str:
    return f"{type(error).__name__}: {one_line(error)} ({_traceback_env}=1 shows the traceback)"


def exit_code(error: Exception, in_job: bool) -> int:
    """One rule for a single run and a sweep's jobs: NplmError is bad input (2); so is an error of Hydra or
    OmegaConf raised outside any job, i.e. the command line refused (an unknown key, a missing option); any other
    error, Hydra's InstantiationException from a job included, is unexpected (1)."""
    if isinstance(error, NplmError) or (not in_job and isinstance(error, (HydraException, OmegaConfBaseException))):
        return EXIT_BAD_INPUT
    return EXIT_FAILED


def _fail_with(error: Exception, in_job: bool) -> NoReturn:
    if exit_code(error, in_job) == EXIT_FAILED:
        _fail(_unexpected(error), EXIT_FAILED)
    message = one_line(error)
    _fail(message + hints(message))


@contextlib.contextmanager
def errors_exit(sweep: bool = False) -> Iterator[None]:
    """Inside a Hydra job: NplmError becomes one line and exit 2, any other exception one line and exit 1 (`exit_code`).
    SystemExit bypasses Hydra's own report ("Error executing job with overrides: ..."), which would come first.

    In a sweep (`sweep`) a job's error is its failure: it goes on to Hydra, marked RAISED_BY_JOB, and `cli` prints
    it once the sweep ends, with the exit code it has here.
    """
    try:
        yield
    except Exception as error:
        if sweep:
            setattr(error, RAISED_BY_JOB, True)
            raise
        if _user_wants_traceback and not isinstance(error, NplmError):
            raise
        _fail_with(error, in_job=True)


# How a study ran before the studies became the config group `study`: sweeps/ as Hydra's config directory
OLD_STUDY_OPTIONS = {"-cd": "dir", "--config-dir": "dir", "-cn": "name", "--config-name": "name"}


def study_form(argv: list[str]) -> list[str]:
    """`argv` with `-cd DIR -cn NAME` as `study=NAME` when DIR/NAME.yaml is the installed study NAME, which
    composes the same jobs; a study file of another version is an error (Hydra cannot run a group's file alone).
    Any other command line, such as `-cd` naming a config of one's own, is returned as it is."""
    given: dict[str, tuple[str, list[int]]] = {}
    for i, arg in enumerate(argv):
        option, equals, value = arg.partition("=")
        if option in OLD_STUDY_OPTIONS and (equals or i + 1 < len(argv)):
            given[OLD_STUDY_OPTIONS[option]] = (value, [i]) if equals else (argv[i + 1], [i, i + 1])
    if given.keys() != {"dir", "name"}:
        return argv
    (folder, dir_at), (name, name_at) = given["dir"], given["name"]
    path = Path(folder) / f"{name}.yaml"
    if not path.is_file() or not path.read_text().startswith("# @package _global_"):
        return argv
    installed = resources.files("nplm_repro.conf") / "study" / path.name
    if not installed.is_file() or installed.read_text() != path.read_text():
        raise NplmError(
            f"{path} is not the study {name} installed with nplm_repro: a study is the config group `study` "
            f"(nplm-train -m study=<name>), so reinstall the package (pip install .) to run this file"
        )
    return [f"study={name}" if i == name_at[0] else arg for i, arg in enumerate(argv) if i not in dir_at + name_at[1:]]


# Said on Ctrl-C or SIGTERM: the ledger marks a run it was recording KILLED, and resumes it on the same command.
INTERRUPTED = "interrupted (any run it was recording is now KILLED; the same command resumes it)"


# Log lines and warnings the user cannot act on, each printed on every run:
NOISE = {
    # Lightning's advertisement for its cloud logger
    "lightning.pytorch.utilities.rank_zero": "💡 Tip",
    # MLflow on how our Model is saved (tracking/served.py: a class of this package, saved with its code)
    "mlflow.pyfunc": "Passing a Python object as `python_model`",
}
WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # torch deprecates a class Lightning still uses
    r"Precision bf16-mixed is not supported by the model summary",  # Lightning's summary of the model's size
)
# Python's and loky's resource trackers, processes of their own, warn when they exit of each semaphore that a process
# they served left behind; joblib kills a sweep's workers outright on Ctrl-C, so the warnings came after the command's
# last line. The trackers still remove the semaphores; only the warning goes, for every process this one starts.
TRACKER_WARNING = "ignore:resource_tracker:UserWarning"


class _Drop(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def quiet() -> None:
    """Silence what the user cannot act on (`NOISE`, `WARNINGS`) in this process, and `TRACKER_WARNING` in the
    processes it starts; a sweep's workers call it too.
    MLflow's bar for each artifact it downloads is one too: a report reads every run's kept scores."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    filters = os.environ.get("PYTHONWARNINGS", "")
    if TRACKER_WARNING not in filters.split(","):
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (filters, TRACKER_WARNING)))
    for message in WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name, start in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(start))


def cli(main: Callable[[], Any], traceback_env: str = HYDRA_TRACEBACK) -> Callable[[], None]:
    """Wrap a command's main function (@hydra.main's, or argparse's with `traceback_env=TRACEBACK`): a bad key or
    value (NplmError, from a job too) prints `prog: error: ...` and exits 2; any other exception prints
    `prog: error: <type>: ...` and exits 1 (a run keeps its traceback in error.txt), as `exit_code` says.

    Hydra prints its own multi-line report unless HYDRA_FULL_ERROR is set; we set it so the error reaches
    us, and keep the full traceback when the user set `traceback_env`. Ctrl-C or SIGTERM: one line and exit 130.
    A study's command of before, `-cd sweeps -cn <study>`, runs as `study=<study>` (`study_form`).
    """

    @functools.wraps(main)
    def run() -> None:
        global _traceback_env, _user_wants_traceback
        _traceback_env = traceback_env
        _user_wants_traceback = bool(os.environ.get(traceback_env))
        os.environ[HYDRA_TRACEBACK] = "1"
        quiet()
        try:
            sys.argv[1:] = study_form(sys.argv[1:])
            main()
        except (KeyboardInterrupt, SystemExit) as error:
            if not interrupted(error) or _user_wants_traceback:
                raise
            end_lines()
            print(f"{os.path.basename(sys.argv[0])}: {INTERRUPTED}", file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as error:
            if _user_wants_traceback:
                raise
            _fail_with(error, in_job=getattr(error, RAISED_BY_JOB, False))

    return run


def store_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of an argparse command that reads a store (nplm-report, nplm-score): where it is."""
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db",
        help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db",
    )
