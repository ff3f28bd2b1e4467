"""The note `search` of a search's report (hparams_search=..., sweeping/search.py): its budget as spent, who proposed
each trial (the sampler, or the random draws of its start), how each trial ended (and which the budget cut while still
improving), the best on validation, the best trials retrained on other seeds, and any chosen value at an edge of its
space, so that the report alone says what the search cost, how far it searched and whether it is done."""

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


EDGE = 0.1  # of a range's width (its logarithm's for a log range): a value this near a bound sits at its edge
ENOUGH = 16  # trials a search should end with, at most a quarter of them its random start (issue 68)


def at_edge(value: Any, space: dict[str, Any]) -> str:
    """Which edge of its space (`described` by sweeping/search.py) `value` sits at, '' if none: the smallest or
    largest of numeric choices, or within EDGE of a range's bound."""
    if "choices" in space:
        try:
            choices = sorted(float(c) for c in space["choices"] if not isinstance(c, bool))
            number = float(value)
        except (TypeError, ValueError):
            return ""  # words, flags: no order, no edge
        if len(choices) < 2:
            return ""
        return "the smallest" if number <= choices[0] else "the largest" if number >= choices[-1] else ""
    low, high, number = float(space["low"]), float(space["high"]), float(value)
    if space.get("log"):
        low, high, number = np.log(low), np.log(high), np.log(number)
    reach = EDGE * (high - low)
    return "near its low end" if number <= low + reach else "near its high end" if number >= high - reach else ""


def edges(values: dict[str, Any], spaces: dict[str, dict[str, Any]]) -> list[str]:
    """The chosen `values` at an edge of their space, as `model.width=384 (the largest of 256, 384)`."""
    found = []
    for key, space in sorted(spaces.items()):
        where = at_edge(values.get(key), space) if key in values else ""
        if where:
            bounds = (
                ", ".join(map(str, space["choices"]))
                if "choices" in space
                else f"{space['low']:g} to {space['high']:g}"
            )
            found.append(f"{key}={number(values[key])} ({where} of {bounds})")
    return found


def proposals(trials: pd.DataFrame) -> str:
    """Who proposed the trials' values: the sampler, or random draws (its start); what a reader needs to tell a
    model-based search from a random one."""
    said = trials["proposed_by"].fillna("") if "proposed_by" in trials else pd.Series("", index=trials.index)
    if (said == "").all():
        return "Who proposed each trial's values was not recorded (trials run before the search recorded it)."
    counts = said.value_counts()
    random, unknown = int(counts.get("random", 0)), int(counts.get("", 0))
    samplers = {k: int(v) for k, v in counts.items() if k not in ("random", "")}
    told = "; ".join(f"{v} proposed by {k}" for k, v in samplers.items()) or "none proposed by the sampler"
    line = f"Proposals: {told}; {random} drawn at random (the sampler's start)"
    line += f"; {unknown} not recorded." if unknown else "."
    total = len(trials)
    if not samplers:
        line += " The sampler never proposed a value: this was a random search."
    elif random > total / 4 or total < ENOUGH:
        line += f" Fewer than {ENOUGH} trials, or more than a quarter of them random: the sampler barely searched."
    return line


def cut_improving(trials: pd.DataFrame, curves: dict[str, list[float]]) -> str:
    """The trials the budget stopped while their last validation was still their best: rivals it cut, not beat."""
    cut = []
    for _, trial in trials[trials["stopped_by"] == "budget"].iterrows():
        values = curves.get(trial["run_id"], [])
        if values and int(np.argmin(values)) == len(values) - 1:
            cut.append(f"trial {trial['number']} (valid {values[-1]:.1f} at epoch {len(values)})")
    if not cut:
        return ""
    return f"Cut by the budget while still improving (their last epoch their best): {', '.join(cut)}."


def retrained(runs: pd.DataFrame, trials: pd.DataFrame, keys: list[str]) -> tuple[list[str], Any]:
    """Lines for the trials trained again from scratch on other seeds (search.py `retrain`: the study's runs that
    are no trial, matched to a trial by the searched values), and the number of the trial of lowest mean retrained
    validation perplexity (None without retrains)."""
    again = runs[(runs["trial"] == "") & (runs["state"] == "finished")]
    if again.empty or not keys:
        return [], None

    def values(config: str) -> tuple[Any, ...]:
        parsed = json.loads(config)
        return tuple(parsed.get(k) for k in keys)

    by_values = {values(c): n for n, c in zip(trials["number"], trials["config"])}
    means = []
    for number_, group in again.assign(of=[by_values.get(values(c)) for c in again["config"]]).groupby("of"):
        trial = trials[trials["number"] == number_].iloc[0]
        seeds = ", ".join(f"{v:.1f} (seed {s})" for s, v in sorted(zip(group["seed"], group["valid_ppl"])))
        searched = f"valid {trial['valid_ppl']:.1f} in the search" if trial["state"] == "finished" else "no value"
        means.append((float(group["valid_ppl"].mean()), int(number_), len(group), f"{searched}; retrained {seeds}"))
    if not means:
        return [], None
    means.sort()
    most = max(count for _, _, count, _ in means)  # a trial with fewer seeds so far is not yet comparable
    chosen = next(n for _, n, count, _ in means if count == most)
    lines = [
        "Retrained from scratch on other seeds, to convergence (the search's best, chosen on their mean): "
        + "; ".join(f"trial {n}: {said}, mean {mean:.1f}" for mean, n, _, said in means)
        + f". Chosen: trial {chosen}"
        + (
            f", among the trials retrained on all {most} seeds so far."
            if most > min(c for _, _, c, _ in means)
            else "."
        )
    ]
    return lines, chosen


def search_note(runs: pd.DataFrame, curves: dict[str, list[float]] | None = None) -> list[str]:
    """`runs`: the study's tidy runs (tracking/runs.py); `curves`: validation perplexity per epoch by run id (the
    report's). One line for the budget, who proposed, what the budget cut, the best, the retrained, the edges, then
    one a trial."""
    curves = curves or {}
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
    budget = pd.to_numeric(
        pd.Series([json.loads(c).get("callbacks.pruning.cpu_hours") for c in trials["config"]]), errors="coerce"
    ).dropna()
    against = f" of its budget of {budget.iloc[0]:g}" if len(budget) else ""
    lines = [
        f"Trials: {len(trials) + len(unrecorded)} ({counted}; {failed} failed{gaps}, {running} running); "
        f"{cpu_hours(trials):.2f} CPU hours{against} (training seconds x torch threads, summed over the trials that "
        "ended)" + (f" on {'; '.join(cpus)}" if cpus else "") + ".",
        proposals(trials),
    ]
    cut = cut_improving(trials, curves)
    lines += [cut] if cut else []
    keys = searched_keys(trials)
    chosen_number = None
    if not finished.empty:
        best = finished.loc[finished["valid_ppl"].idxmin()]
        values = json.loads(best["config"])
        chosen = ", ".join(f"{k}={number(values.get(k, ''))}" for k in keys)
        lines.append(
            f"Best on validation: trial {best['number']}, valid {best['valid_ppl']:.1f} (test {best['test_ppl']:.1f}), "
            f"{epochs(best['epochs'])} ({ENDINGS[best['stopped_by']]}): {chosen}."
        )
        chosen_number = best["number"]
    again, retrained_number = retrained(runs, trials, keys)
    lines += again
    chosen_number = retrained_number if retrained_number is not None else chosen_number
    spaces = [json.loads(s) for s in trials.get("search_space", pd.Series(dtype=str)) if s]
    if chosen_number is not None and spaces:
        found = edges(json.loads(trials.loc[trials["number"] == chosen_number, "config"].iloc[0]), spaces[-1])
        if found:
            lines.append(
                f"At an edge of its space, trial {chosen_number}'s {', '.join(found)}: this search is not done; "
                "widen its space past that edge and search again."
            )
        else:
            lines.append(f"No value of trial {chosen_number} sits at an edge of its space.")
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
