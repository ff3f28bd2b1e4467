"""Where derived files live between runs: clusterings, precision probes and the run locks."""

from __future__ import annotations

import os
from pathlib import Path

from nplm_repro.errors import NplmError

CACHE_ENV = "NPLM_CACHE"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else $NPLM_CACHE, else ~/.cache/nplm_repro; one clear error if it is not a directory."""
    root = Path(cache_dir or os.environ.get(CACHE_ENV) or "~/.cache/nplm_repro").expanduser()
    if root.exists() and not root.is_dir():
        raise NplmError(f"cache directory {root} is not a directory: point {CACHE_ENV} at a directory")
    return root


def cache_dir(name: str) -> Path:
    """The folder `name` of the cache, created if missing. One line naming NPLM_CACHE where it cannot be created or
    written (a mistyped or read-only NPLM_CACHE), rather than the OSError of whatever first writes there."""
    path = cache_root() / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise NplmError(
            f"cache directory {path} cannot be created ({error.strerror}): point {CACHE_ENV} at a writable directory"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise NplmError(f"cache directory {path} is not writable: point {CACHE_ENV} at a writable directory")
    return path
