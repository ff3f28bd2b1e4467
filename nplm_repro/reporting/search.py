"""The note `search` of a search's report (hparams_search=..., tracking/search.py): its budget as spent, how each
trial ended, and the best on validation, so that the report alone says what the search cost and what it chose."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from nplm_repro.tracking.stops import STOPS

ENDINGS = STOPS | {"budget": "stopped by the budget"}  # how a trial's run ended, its `stopped_by` (tracking/stops.py)


def number(value: Any) -> str:
    """A searched value as a reader reads it: 3 significant digits for a float, as is otherwise."""
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        return str(value)
    return str(value) if str(value).lstrip("-").isdigit() else f"{as_float:.3g}"


def searched_keys(runs: pd.DataFrame) -> list[str]:
    """The config keys that differ between the trials (the search's space), less the trial's own bookkeeping."""
    configs = pd.DataFrame([json.loads(c) for c in runs["config"]])
    return sorted(k for k in configs if configs[k].nunique(dropna=False) > 1 and not k.startswith("callbacks.pruning"))


def epochs(count: float) -> str:
    return f"{int(count)} epoch{'s' * (int(count) != 1)}"


def cpu_hours(runs: pd.DataFrame) -> float:
    """Training seconds times torch threads, summed (a run from before threads were tagged counts one thread)."""
    return float((runs["fit_minutes"] * runs["threads"].fillna(1)).sum() / 60.0)


def search_note(runs: pd.DataFrame) -> list[str]:
    """`runs`: the study's tidy runs (tracking/runs.py). One line for the budget, one for the best, one a trial."""
    trials = runs[runs["trial"] != ""].copy()
    if trials.empty:
        return ["No trial of a search (hparams_search=...) in this study."]
    trials["number"] = trials["trial"].astype(int)
    trials = trials.sort_values(["number", "start_time"]).drop_duplicates("number", keep="last")
    finished = trials[trials["state"] == "finished"]
    endings = finished["stopped_by"].value_counts()
    counted = ", ".join(f"{endings[k]} {ENDINGS[k]}" for k in ENDINGS if k in endings)
    failed = int((trials["state"] == "failed").sum())
    running = int((trials["state"] == "running").sum())
    # a trial whose job ended before it recorded a run (a configuration its family refuses): a gap in the numbers
    unrecorded = sorted(set(range(int(trials["number"].max()))) - set(trials["number"]))
    gaps = f", {len(unrecorded)} with no run" if unrecorded else ""
    cpus = sorted(set(trials["cpu"]) - {""})
    lines = [
        f"Trials: {len(trials) + len(unrecorded)} ({counted}; {failed} failed{gaps}, {running} running); "
        f"{cpu_hours(trials):.2f} CPU hours (training seconds x torch threads, summed over the trials that ended)"
        + (f" on {'; '.join(cpus)}" if cpus else "")
        + "."
    ]
    keys = searched_keys(trials)
    if not finished.empty:
        best = finished.loc[finished["valid_ppl"].idxmin()]
        values = json.loads(best["config"])
        chosen = ", ".join(f"{k}={number(values.get(k, ''))}" for k in keys)
        lines.append(
            f"Best on validation: trial {best['number']}, valid {best['valid_ppl']:.1f} (test {best['test_ppl']:.1f}), "
            f"{epochs(best['epochs'])} ({ENDINGS[best['stopped_by']]}): {chosen}."
        )
    if unrecorded:
        lines.append(
            f"Trial{'s' * (len(unrecorded) > 1)} {', '.join(map(str, unrecorded))}: no run; the job ended before it "
            "recorded one (a configuration its family refuses, such as model.h=0 without model.direct; the search's "
            "log says why), and the search counts it as a failed trial."
        )
    for _, trial in trials.iterrows():
        values = json.loads(trial["config"])
        said = ", ".join(f"{k}={number(values.get(k, ''))}" for k in keys)
        if trial["state"] != "finished":
            lines.append(f"Trial {trial['number']}: {said}: {trial['state']}.")
            continue
        hours = trial["fit_minutes"] * (1 if np.isnan(trial["threads"]) else trial["threads"]) / 60.0
        lines.append(
            f"Trial {trial['number']}: {said}: {epochs(trial['epochs'])}, {ENDINGS[trial['stopped_by']]}, "
            f"valid {trial['valid_ppl']:.1f}, {hours:.2f} CPU hours."
        )
    return lines
