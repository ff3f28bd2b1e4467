"""The one exception type that reaches the user as a single line (no traceback), how an error reads in one line,
and how an interrupt looks."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import yaml


class NplmError(Exception):
    """Bad input or environment: the message says what is wrong and how to fix it."""


def interrupted(error: BaseException | None) -> bool:
    """Ctrl-C or SIGTERM, also when Lightning turned it into SystemExit after its graceful shutdown, and a SIGTERM that
    Lightning's own handler alone saw: its SIGTERMException at the next batch's end, when the KeyboardInterrupt of
    `sigterm_interrupts` was lost (raised inside a finalizer, which Python reports and ignores). That one is a
    SystemExit with no code, which would end the command with 0 and its run FAILED."""
    lightning = sys.modules.get("lightning.pytorch.utilities.exceptions")  # loaded before it could raise one
    stops = (KeyboardInterrupt, lightning.SIGTERMException) if lightning else (KeyboardInterrupt,)
    while error is not None:
        if isinstance(error, stops):
            return True
        error = error.__context__
    return False


# The signal (SIGINT or SIGTERM) that stopped this job, kept for `raise_if_signalled`.
_signalled: str | None = None


def _stop(signum: int, frame: FrameType | None) -> None:
    global _signalled
    _signalled = signal.Signals(signum).name
    raise KeyboardInterrupt(_signalled)


def sigterm_interrupts() -> None:
    """SIGTERM (kill, SLURM's preemption) stops a job as Ctrl-C does: its run ends KILLED, resumable. Either signal is
    remembered for `raise_if_signalled`; a job starts with none (a launcher's worker runs one job after another)."""
    global _signalled
    _signalled = None
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)


def raise_if_signalled() -> None:
    """Raise again the KeyboardInterrupt of a Ctrl-C or SIGTERM that was lost: one raised inside a finalizer
    (SQLAlchemy's weakref callbacks, say) is printed as "Exception ignored" and dropped, and the run would go on to
    its end and exit 0."""
    if _signalled is not None:
        raise KeyboardInterrupt(_signalled)


def yaml_line(error: yaml.YAMLError, where: str | None = None) -> str:
    """A file that is not YAML, or has a key twice in one mapping (YAML forbids it; Hydra refuses it, PyYAML alone
    keeps the last), in one line naming the file (`where`, else the file PyYAML read) and the line: PyYAML's message
    spans four lines, and its first ("while parsing a flow node") says neither."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem, context = getattr(error, "problem", None), getattr(error, "context", None)
    name = where or (mark.name if mark is not None else "a config file")
    at = f", line {mark.line + 1}" if mark is not None else ""
    what = problem or context or str(error).strip().splitlines()[0]
    return f"{name}{at}: not valid YAML: {what}" + (f" ({context})" if problem and context else "")


def one_line(error: BaseException) -> str:
    """Hydra/OmegaConf messages span lines; keep the first line of the error and of its cause. A YAML error as
    `yaml_line` says it."""
    if isinstance(error, yaml.YAMLError):
        return yaml_line(error)
    parts = [(str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")]
    lines = str(error.__cause__).strip().splitlines() if error.__cause__ is not None else []
    cause = lines[0] if lines else ""
    if cause and cause.rstrip(".") not in parts[0]:  # OmegaConf chains its own message as the cause under a tracer
        parts.append(cause)
    return ": ".join(parts)
