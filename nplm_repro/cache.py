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
