"""Where a command will write, checked before any work: a directory that is there, or one that can be created.
A leaf every layer may use (torch-free: nplm-report checks its --out with it)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from nplm_repro.errors import NplmError


def check_report_dir(report: str, named: str | None = None) -> None:
    """A study's report can go to `report`: a directory there, or one can be created there (`named`: how the error
    names it, `report=<it>` by default). Tried by creating (and removing) a directory in the nearest one that exists:
    `os.access` tells root yes even where nothing can be created, as in procfs."""
    named = named or f"report={report}"
    out = Path(report).absolute()
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise NplmError(f"{named}: {existing} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing))
    except OSError as error:
        raise NplmError(f"{named}: cannot create a directory in {existing} ({error.strerror})") from None


def why_missing(path: Path) -> str:
    """Why `path`, which does not exist, is not there, as a user would check it: a symbolic link that loops, or one
    to a file that does not exist, or no such file or directory (what the OS says of all three)."""
    if not path.is_symlink():
        return "no such file or directory"
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python 3.11's resolve says a loop so
        return "a symbolic link that loops back to itself"
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "a symbolic link that loops back to itself"
    return f"a symbolic link to {os.readlink(path)}, which does not exist"

