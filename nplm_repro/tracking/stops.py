"""What ended a trained run's fit, from what the run recorded: the report's `stopped` column, its note on rows that
have not converged, and a search's note on how each trial ended all read it here. Torch-free: the report reads it.

A run records it at its fit's end as the metric `<why>_epoch` (models/training.py `StopReason`; a search's trial
records `pruned_epoch` or `budget_epoch`, sweeping/search.py). A run from before that record is read from its epochs
and its fit's seconds: all of trainer.max_epochs trained is the ceiling, trainer.max_time spent is the time budget,
anything else early stopping (such a run stopped by trainer.max_steps reads as early stopping).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

# Each way a fit ends, as its metric `<why>_epoch` names it, and as a report says it; the first a run recorded wins
STOPS = {
    "pruned": "pruned",
    "budget": "budget",
    "early_stopping": "early stopping",
    "max_time": "max_time",
    "max_steps": "max_steps",
    "max_epochs": "max_epochs",
}


def seconds(max_time: str) -> float | None:
    """trainer.max_time as written in a config, DD:HH:MM:SS, in seconds; None for another form or none."""
    found = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", max_time.strip())
    if found is None:
        return None
    days, hours, minutes, secs = map(int, found.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + secs)


def stopped_by(run: Mapping[str, Any], config: dict[str, str]) -> str:
    """What ended a run's fit (a key of STOPS), from its metrics (`metrics.<name>` of a run as mlflow.search_runs
    gives it, None or NaN where it has none) and its flat config; '' for a run that fitted nothing (counted, mixed)."""
    recorded = [why for why in STOPS if pd.notna(run.get(f"metrics.{why}_epoch"))]
    if recorded:
        return recorded[0]
    epochs, fit_seconds = run.get("metrics.epochs"), run.get("metrics.fit_seconds")
    if pd.isna(epochs):
        return ""
    ceiling = pd.to_numeric(config.get("trainer.max_epochs"), errors="coerce")
    budget = seconds(config.get("trainer.max_time") or "")
    if ceiling > 0 and epochs >= ceiling:
        return "max_epochs"
    if budget is not None and pd.notna(fit_seconds) and fit_seconds >= budget:
        return "max_time"
    return "early_stopping"
