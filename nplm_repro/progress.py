"""How a sweep's job tells the launching process where it is: a small JSON file the job rewrites.

Jobs run in other processes (joblib's workers), and their terminals are not the user's: each job's output goes to
its own log file. What the sweep's one progress display needs of a job (its row, its state, the epoch it trains)
travels instead through a file named by `NPLM_JOB_STATUS`, which the sweep sets for the job
(sweeping/console.py); a job without it (a single run, another launcher) writes nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATUS_ENV = "NPLM_JOB_STATUS"
# The launching process's displays, each closed (its last line drawn) when the sweep ends however it ends
_displays: list[Callable[[], None]] = []


def report_status(**fields: Any) -> None:
    """Merge `fields` into this job's status file, if it has one; replaced whole, so a reader never sees half."""
    path = os.environ.get(STATUS_ENV)
    if not path:
        return
    status = read_status(Path(path)) | fields
    partial = Path(f"{path}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(status))
    partial.replace(path)


def read_status(path: Path) -> dict[str, Any]:
    """A job's status as last written; {} before its first write."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def add_display(close: Callable[[], None]) -> None:
    """Have `close_displays` close this display."""
    _displays.append(close)


def close_displays() -> None:
    """Draw the displays' last lines and stop them: before the sweep's own last words (its report, its error)."""
    while _displays:
        _displays.pop()()
