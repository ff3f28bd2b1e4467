"""How commands end: a bad key or value is one line and exit 2, any other error one line and exit 1, Ctrl-C or
SIGTERM one line and exit 130 (a run being recorded ends KILLED)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.errors import NplmError, interrupted, one_line

EXIT_FAILED = 1  # anything else that went wrong: the run is FAILED, its traceback in the run's error.txt
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # as a shell reports a job stopped by Ctrl-C


# Hydra's word for `+experiment=mlp5` since conf/config.yaml lists the group (`experiment: null`), and the fix
OLD_EXPERIMENT = "Multiple values for experiment."
NEW_EXPERIMENT = " (the group is in the defaults now: write experiment=<row>, without the +)"


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(code)


_user_wants_traceback = False  # HYDRA_FULL_ERROR as the user set it, before `cli` sets it for its own use


def _unexpected(error: Exception) -> str:
    return f"{type(error).__name__}: {one_line(error)} (HYDRA_FULL_ERROR=1 shows the traceback)"


@contextlib.contextmanager
def errors_exit() -> Iterator[None]:
    """Inside a single Hydra job: NplmError becomes one line and exit 2, any other exception one line and exit 1.
    SystemExit bypasses Hydra's own report ("Error executing job with overrides: ..."), which would come first.

    Not in a sweep: there a job's error is its failure, and `cli` prints it once the sweep ends.
    """
    try:
        yield
    except NplmError as error:
        _fail(one_line(error))
    except Exception as error:
        if _user_wants_traceback:
            raise
        _fail(_unexpected(error), EXIT_FAILED)


def cli(main: Callable[[], Any]) -> Callable[[], None]:
    """Wrap a @hydra.main function: a bad key or value (NplmError, from a job too) prints `prog: error: ...` and
    exits 2; any other exception prints `prog: error: <type>: ...` and exits 1 (a run keeps its traceback in
    error.txt).

    Hydra prints its own multi-line report unless HYDRA_FULL_ERROR is set; we set it so the error reaches
    us, and keep the full traceback when the user set it. Ctrl-C or SIGTERM: one line and exit 130.
    """

    @functools.wraps(main)
    def run() -> None:
        global _user_wants_traceback
        _user_wants_traceback = bool(os.environ.get("HYDRA_FULL_ERROR"))
        os.environ["HYDRA_FULL_ERROR"] = "1"
        try:
            main()
        except (HydraException, OmegaConfBaseException, NplmError) as error:
            if _user_wants_traceback:
                raise
            message = one_line(error)
            _fail(message + NEW_EXPERIMENT if message.startswith(OLD_EXPERIMENT) else message)
        except (KeyboardInterrupt, SystemExit) as error:
            if not interrupted(error) or _user_wants_traceback:
                raise
            print(f"{os.path.basename(sys.argv[0])}: interrupted (a run being recorded is now KILLED)", file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as error:
            if _user_wants_traceback:
                raise
            _fail(_unexpected(error), EXIT_FAILED)

    return run
