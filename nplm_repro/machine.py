"""What this machine's CPU says of itself (/proc/cpuinfo on Linux): read in one place, for the precision probe's
cache key (models/precision.py) and a run's tags (tracking/records.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpuinfo() -> dict[str, str]:
    """The first processor's fields (model name, cpu family, model, stepping, flags, ...): every core of one machine
    says the same; {} where there is no /proc/cpuinfo (not Linux)."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError), CPUINFO.open() as f:
        for line in f:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields
