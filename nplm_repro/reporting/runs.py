"""What the report says of runs beyond reading them (tracking/runs.py reads them, tracking/best.py chooses among
them): commits shortened, the keys that tell configurations apart, validation curves, and runs named in lists.

A paper row run in several configurations shows the one with the lowest mean validation perplexity (never chosen
on test; tracking/best.py); the others are listed as attempts.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from nplm_repro.paper import COLUMNS
from nplm_repro.storage.archive import ArchiveSource
from nplm_repro.tracking.best import trained_rows


def short_commit(commit: str) -> str:
    """A git commit as 7 hex digits (and +dirty); what installed code recorded (its version) as it is."""
    sha = commit.removesuffix("+dirty")
    if len(sha) == 40 and all(ch in "0123456789abcdef" for ch in sha):
        return sha[:7] + commit[len(sha) :]
    return commit


def varying_keys(configs: pd.DataFrame) -> list[str]:
    """Config keys besides the paper's columns whose value differs between the configurations that have them: an
    MLP's training keys (optim.*, callbacks.*) tell MLPs apart, never an MLP from an n-gram, which has none."""
    dicts = [json.loads(c) for c in configs["config"]]
    shown = {"model._target_"} | {f"model.{c}" for c in COLUMNS}
    keys = sorted({k for d in dicts for k in d} - shown)
    return [k for k in keys if len({d[k] for d in dicts if k in d}) > 1]


def history(source: ArchiveSource, table: pd.DataFrame) -> dict[str, list[tuple[str, list[float]]]]:
    """Validation perplexity per epoch of every seed of every trained row shown."""
    trained = trained_rows(table)
    curves = {}
    for row in trained.itertuples():
        curves[row.label] = []
        for run_id in row.run_ids.split():
            points = sorted(source.history(run_id, "valid_ppl_epoch"))
            # a run resumed from an earlier checkpoint logs the epochs it replays again: each epoch's last value
            epochs = {step: value for step, _, value in points}
            curves[row.label].append((run_id, list(epochs.values())))
    return curves


Timeline = dict[str, list[tuple[str, list[float], list[float]]]]


def timeline(source: ArchiveSource, table: pd.DataFrame, runs: pd.DataFrame) -> Timeline:
    """Per trained row shown, per seed: (run id, CPU minutes, validation perplexity) at each validation. CPU minutes
    are the fit's seconds at that validation (`fit_seconds_epoch`, across resumes) times the run's torch threads; a
    run from before that metric counts the wall clock from the start of the run that trained it (right for a run
    never resumed): an adopted run started when it was adopted, after its copied history was logged."""
    threads = dict(zip(runs["run_id"], runs["threads"].fillna(1)))
    starts = {r: pd.Timestamp(t).timestamp() * 1000 for r, t in zip(runs["run_id"], runs["start_time"]) if pd.notna(t)}
    sources = {r: s for r, s in zip(runs["run_id"], runs["adopted_from"]) if s}
    found: Timeline = {}
    for row in trained_rows(table).itertuples():
        for run_id in row.run_ids.split():
            valid = {step: (timestamp, value) for step, timestamp, value in source.history(run_id, "valid_ppl_epoch")}
            if not valid:
                continue
            # earlier code logged it one step after its validation (global_step, not Lightning's epoch step)
            seconds = {step: value for step, _, value in source.history(run_id, "fit_seconds_epoch")}
            if seconds and not seconds.keys() & valid.keys():
                seconds = {step - 1: value for step, value in seconds.items()}
            start = source.start_time(sources[run_id]) if run_id in sources else starts.get(run_id)
            points = [
                (seconds[step] if step in seconds else (timestamp - start) / 1000, value)
                for step, (timestamp, value) in sorted(valid.items())
                if step in seconds or start is not None
            ]
            minutes = [t * threads.get(run_id, 1) / 60 for t, _ in points]
            found.setdefault(row.label, []).append((run_id, minutes, [v for _, v in points]))
    return found


def training_speeds(source: ArchiveSource, table: pd.DataFrame, seeds: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per trained row label, per seed: its training tokens per second, the mean of its epochs' (`faster` claims); a
    run adopted from another study logged its source's."""
    speeds: dict[str, dict[str, float]] = {}
    for row in trained_rows(table).itertuples():
        for run_id in row.run_ids.split():
            rates = [value for _, _, value in source.history(run_id, "train_tokens_per_s")]
            if rates:
                speeds.setdefault(row.label, {})[seeds[run_id]] = float(np.mean(rates))
    return speeds


def run_name(run: pd.Series) -> str:
    """Its row tag, or else its model family's name."""
    return run["row_tag"] or run["family_label"]


def run_text(run: pd.Series) -> str:
    """A run as the lists under the table name it: row tag (or family), columns, run name and id."""
    columns = "".join(f"{c}={run[c]}, " for c in COLUMNS if run[c] != "").removesuffix(", ")
    which = f"run {run['name']}, {run['run_id'][:8]}, seed {run['seed']}"
    return f"{run_name(run)} ({columns}; {which})" if columns else f"{run_name(run)} ({which})"
