"""The wrapper every command's main runs in (`cli`): how it ends, by exits.py's rule (a bad key or value is one line
and exit 2, any other error one line and exit 1), Ctrl-C or SIGTERM one line and exit 130 (a run being recorded ends
KILLED); what it silences; a command line of before read as today's (nplm_repro/migrations.py `upgrade_argv`). The
same rule holds in a single run and a sweep. And the options the argparse commands share, declared once so that one
spelling means one thing in each: where the store is (`store_arguments`), which run of it is read
(`run_arguments`)."""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import multiprocessing
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from joblib.externals.loky.backend.context import set_start_method

from nplm_repro.errors import NplmError, interrupted
from nplm_repro.exits import (
    EXIT_INTERRUPTED,
    HYDRA_TRACEBACK,
    RAISED_BY_JOB,
    end_lines,
    fail_with,
    traceback_switch,
)
from nplm_repro.migrations import RUN_SEED_DEPRECATED, upgrade_argv, upgrade_run_seed
from nplm_repro.storage.store import existing_store
from nplm_repro.tracking.best import row_run

# Said on Ctrl-C or SIGTERM: the ledger marks a run it was recording KILLED, and resumes it on the same command.
INTERRUPTED = "interrupted (any run it was recording is now KILLED; the same command resumes it)"


# Log lines and warnings the user cannot act on, each printed on every run:
NOISE = {
    # Lightning's advertisement for its cloud logger
    "lightning.pytorch.utilities.rank_zero": "💡 Tip",
    # MLflow on how our Model is saved (serving/served.py: a class of this package, saved with its code)
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


def freeze_imports() -> None:
    """Move every object this process holds now, its imports' above all, out of the garbage collector's reach, once
    per process: they live as long as it does, so its collections and its end need not scan them (2 s saved on each
    command's end, and on each of a sweep's workers'). Called first by a command, and by a job in joblib's workers."""
    if not gc.get_freeze_count():
        gc.freeze()


def fork_workers_from(module: str) -> None:
    """A sweep's joblib workers (hydra/launcher=parallel) are forked from one server process that imported `module`
    once (multiprocessing's forkserver, one of loky's start methods), not each started afresh: each saves the 6-7 s
    of CPU that importing torch, Lightning and MLflow takes. The server starts with the sweep's first worker and ends
    with the sweep. Each worker is still a process of its own, with its own threads and signal handlers. Where there
    is no forkserver (Windows), loky's own start method stays."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        set_start_method("forkserver", force=True)
        multiprocessing.set_forkserver_preload([module])


def cli(main: Callable[[], Any], traceback_env: str = HYDRA_TRACEBACK) -> Callable[[], None]:
    """Wrap a command's main function (@hydra.main's, or argparse's with `traceback_env=TRACEBACK`): a bad key or
    value (NplmError, from a job too) prints `prog: error: ...` and exits 2; any other exception prints
    `prog: error: <type>: ...` and exits 1 (a run keeps its traceback in error.txt), as `exit_code` (exits.py) says.

    Hydra prints its own multi-line report unless HYDRA_FULL_ERROR is set; we set it so the error reaches
    us, and keep the full traceback when the user set `traceback_env`. Ctrl-C or SIGTERM: one line and exit 130.
    A study's command of before, `-cd sweeps -cn <study>`, runs as `study=<study>` (migrations.py `upgrade_argv`).
    """

    @functools.wraps(main)
    def run() -> None:
        freeze_imports()
        wants_traceback = traceback_switch(traceback_env)
        os.environ[HYDRA_TRACEBACK] = "1"
        quiet()
        try:
            sys.argv[1:] = upgrade_argv(sys.argv[1:])
            main()
        except (KeyboardInterrupt, SystemExit) as error:
            if not interrupted(error) or wants_traceback:
                raise
            end_lines()
            print(f"{os.path.basename(sys.argv[0])}: {INTERRUPTED}", file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as error:
            if wants_traceback:
                raise
            fail_with(error, in_job=getattr(error, RAISED_BY_JOB, False))

    return run


DEFAULT_STORE = "sqlite:///mlflow.db"


def store_arguments(parser: argparse.ArgumentParser, default: str | None = DEFAULT_STORE) -> None:
    """The options of an argparse command that reads a store (nplm-report, nplm-score, nplm-import): where it is;
    `default` None: unset unless $MLFLOW_TRACKING_URI is (nplm-report then reads the study's archive)."""
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI") or default,
        help=f"default: $MLFLOW_TRACKING_URI, else {default or 'the study archive in --out, else ' + DEFAULT_STORE}",
    )


def run_arguments(parser: argparse.ArgumentParser, verb: str, run_seed: bool = False) -> None:
    """The options that name a recorded run by its study's row, declared once for every command that reads one run
    (nplm-score, nplm-ask's subcommands) so that each spells and means them alike: nplm-ask's --seed was the seed of
    its draws, its --run-seed nplm-score's --seed. `verb`: what the command does with the run (`scored`, `asked`).
    The run id, the other way to name it, is each command's own positional: nplm-ask neighbours reads words after it.
    `run_seed`: also `--run-seed`, for one more release (`check_run` reads it as --seed and warns of it)."""
    parser.add_argument(
        "--row",
        help="a row of --study (its runs' row tag: MLP9, Del. Int., ...): the run of it with the lowest valid "
        "perplexity, of the row as the report shows it (tracking/best.py); with --seed, that seed's run",
    )
    parser.add_argument("--study", help=f"with --row: the study whose run is {verb} (tag study)")
    parser.add_argument(
        "--seed",
        type=int,
        help="with --row: that seed's run (default: the row's seed with the lowest valid perplexity)",
    )
    if run_seed:
        parser.add_argument("--run-seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--experiment", default="brown", help="with --row: the MLflow experiment (default: brown)")


def check_run(args: argparse.Namespace) -> None:
    """Refuse, before any store is opened, a run named twice or not at all (`args.run_id`, or --row), a row without
    its study, and a seed with no row to pick it from (a run id names its run: the seed would go unread), each in one
    line. A deprecated `--run-seed` is read as --seed (migrations.py `upgrade_run_seed`), and warned of."""
    given = upgrade_run_seed(args)
    if bool(args.run_id) == bool(args.row):
        raise NplmError("name one run: a run id, or --row with --study")
    if args.row and not args.study:
        raise NplmError("--row needs --study: the study whose row it is")
    if args.seed is not None and not args.row:  # nplm-ask generate's --seed was its draws' seed: say where that went
        why = (
            "the draws' seed is --draw-seed"
            if given == "--seed" and hasattr(args, "draw_seed")
            else "a run id names its run already"
        )
        raise NplmError(f"{given} {args.seed} picks a seed's run of --row: {why}")
    if given != "--seed":
        print(f"{os.path.basename(sys.argv[0])}: warning: {RUN_SEED_DEPRECATED}", file=sys.stderr)


def named_run(args: argparse.Namespace) -> str:
    """The run `check_run` let through, in a store that exists: the run id given, else --row's run in --study by
    the one rule of the best run (tracking/best.py), or that of --seed."""
    existing_store(args.tracking_uri)
    return args.run_id or row_run(args.tracking_uri, args.experiment, args.study, args.row, args.seed)
