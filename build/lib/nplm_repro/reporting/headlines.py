"""The headline figures a study declares (studies.yaml `figures`), each the answer to its study's one question at a
glance: what sampled training costs in test perplexity and saves in time, pair by pair (`sampled_pairs`,
brown_sampled); which step from the paper's recipe to ours moved MLP5's test perplexity (`recipe_steps`,
brown_recipe); what an output layer buys in training speed and costs in test perplexity (`speed_cost`,
brown_extensions); what compute buys each family, validation perplexity against CPU minutes (`compute`,
brown_modern). figures.py draws them first, as HEADLINES names them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from nplm_repro.paper import paper_table
from nplm_repro.reporting import recipe
from nplm_repro.reporting.claims import verdict_of
from nplm_repro.reporting.drawing import EQUIVALENT, LEGEND, VERDICT_COLOURS, fit_labels, new_figure, wrap
from nplm_repro.reporting.notes import Pairing, both_ways, speed_up
from nplm_repro.reporting.tables import Report
from nplm_repro.tracking.runs import present


@dataclass(frozen=True)
class SampledPair:
    """One model trained both ways (notes.sampled_vs_exact's pair): the exact row's label, the sampled row's test
    perplexity over the exact row's less 1 with its paired 95% interval and verdict (None without kept scores),
    and the speed-up, exact time over sampled time (minutes in fit where both have them, else wall minutes)."""

    label: str
    estimate: float
    low: float | None
    high: float | None
    verdict: str | None
    speedup: float
    in_fit: bool


def sampled_pairs(report: Report) -> list[SampledPair]:
    """The trained MLPs run both ways, paired as notes.sampled_vs_exact pairs them (the same config less
    the study's `how_trained`), with the same paired interval and its equivalence verdict within +-its margin."""
    pairs, pairing = [], Pairing.declared(report.spec)
    for exact, sampled in both_ways(report.table, pairing.how_trained):
        speedup, cost = speed_up(exact, sampled)
        in_fit = cost == "fit_minutes"
        difference = report.evidence.compare(sampled["label"], exact["label"])
        estimate = sampled["test_ppl"] / exact["test_ppl"] - 1
        if difference is None:
            pairs.append(SampledPair(exact["label"], estimate, None, None, None, speedup, in_fit))
        else:
            verdict = verdict_of(difference, EQUIVALENT, pairing.margin)
            low, high = difference.low, difference.high
            pairs.append(SampledPair(exact["label"], difference.estimate, low, high, verdict, speedup, in_fit))
    return pairs


def sampled_figure(report: Report) -> Figure | None:
    """brown_sampled's pairs, one line each: left, what sampling costs in test perplexity (sampled over exact, less
    1, with its paired 95% interval, against the +-margin band of the equivalence claim); right, what it saves
    (exact time over sampled time). None without a pair."""
    pairs, margin = sampled_pairs(report), Pairing.declared(report.spec).margin
    if not pairs:
        return None
    names = fit_labels([p.label for p in pairs])
    figure = new_figure(9, 1.9 + 0.4 * len(pairs))
    cost, speed = figure.subplots(1, 2, sharey=True, width_ratios=[3, 2])
    y = np.arange(len(pairs), 0, -1)
    cost.axvspan(-margin * 100, margin * 100, color="tab:green", alpha=0.12, linewidth=0)
    cost.axvline(0, color="0.6", linewidth=0.8)
    seen = {}
    for pair, at in zip(pairs, y):
        if pair.low is None:
            cost.plot(pair.estimate * 100, at, "o", markerfacecolor="none", markeredgecolor="0.3", markersize=6)
            seen["no interval (no kept scores)"] = Line2D([], [], marker="o", ls="", mfc="none", mec="0.3")
            continue
        colour = VERDICT_COLOURS.get(pair.verdict, "0.45")
        error = [[(pair.estimate - pair.low) * 100], [(pair.high - pair.estimate) * 100]]
        cost.errorbar(pair.estimate * 100, at, xerr=error, fmt="o", color=colour, capsize=3, markersize=5)
        seen[f"within ±{margin:.0%}: {pair.verdict}"] = Line2D([], [], marker="o", ls="", color=colour)
    reach = max(
        margin * 100 * 1.5,
        *(abs(v) * 100 * 1.1 for p in pairs for v in (p.estimate, p.low, p.high) if v is not None),
    )
    cost.set_xlim(-reach, reach)
    cost.set_yticks(y, names, fontsize=8)
    cost.set_ylim(0.4, len(pairs) + 0.6)
    cost.set_xlabel(
        f"test perplexity, sampled over exact, less 1 (%)\nbar: paired 95% interval; band: ±{margin:.0%}",
        fontsize=8,
    )
    cost.set_title("what sampling costs", fontsize=9)
    cost.grid(axis="x", alpha=0.3)
    speedups = [p.speedup for p in pairs]
    speed.barh(y, [s if present(s) else 0 for s in speedups], height=0.5, color="C0", alpha=0.7)
    for at, value in zip(y, speedups):
        if present(value):
            speed.annotate(
                f"{value:.1f}x", (value, at), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
            )
    finite = [s for s in speedups if present(s)]
    speed.set_xlim(0, max([1.0, *finite]) * 1.3)
    speed.axvline(1, color="0.6", linewidth=0.8)
    what = "minutes in fit" if all(p.in_fit for p in pairs) else "minutes"
    speed.set_xlabel(f"speed-up: exact {what} over sampled", fontsize=8)
    speed.set_title("what sampling saves", fontsize=9)
    speed.tick_params(axis="y", left=False)
    speed.grid(axis="x", alpha=0.3)
    speed.legend(list(seen.values()), list(seen), **LEGEND)
    figure.suptitle(f"{report.study}: sampled against exact training of the same MLP, pair by pair", fontsize=10)
    return figure


def recipe_figure(report: Report) -> Figure | None:
    """A recipe study's steps (brown_recipe's) from the paper's recipe to ours as a waterfall of the ablated row's
    (MLP5's) test perplexity: the paper's recipe a bar from the floor, each later step a bar from the step before it
    that ran to its own value (green down, red up), its value and relative change above it; the paper's row and
    the compared study's optim=fast row as lines. None unless two steps have a finished run of the row."""
    if report.recipe is None:
        return None
    plan, row = report.recipe.plan, report.recipe.plan.ablate
    table = report.table[(report.table["status"] == "finished") & (report.table["row"] == row)]
    steps = table["config"].map(lambda config: recipe.step_of(config, plan.steps))
    values = []
    for step in plan.steps:
        ran = table[steps == step]
        values.append(float(ran["test_ppl"].iloc[0]) if len(ran) else np.nan)  # as recipe.ablation: the first
    if np.isfinite(values).sum() < 2:
        return None
    paper = float(paper_table(plan.paper).set_index("row").loc[row, "paper_test_ppl"])
    fast = report.recipe.beside.set_index("row").loc[row, "test, fast"].split()[0]
    fast = float(fast) if re.fullmatch(r"[\d.]+", fast) else np.nan
    shown = [v for v in (*values, paper, fast) if not np.isnan(v)]
    floor = min(shown) - 0.25 * (max(shown) - min(shown) or 10)
    figure = new_figure(9, 4.5)
    ax = figure.add_subplot()
    before = None
    ticks = []
    for x, (step, value) in enumerate(zip(plan.steps, values)):
        ticks.append(wrap(f"{x}. {step.name}", 20) + ("\n(not run)" if np.isnan(value) else ""))
        if np.isnan(value):
            continue
        if before is None:
            ax.bar(x, value - floor, bottom=floor, color="0.55", width=0.6)
            text = f"{value:.1f}"
        else:
            colour = "tab:green" if value < before[1] else "tab:red"
            ax.bar(x, value - before[1], bottom=before[1], color=colour, width=0.6)
            ax.plot([before[0] + 0.3, x - 0.3], [before[1], before[1]], color="0.4", linewidth=0.8, linestyle=":")
            text = f"{value:.1f}\n{value / before[1] - 1:+.1%}"
        down = before is not None and value < before[1]  # the value at the bar's lower end: its words below it
        ax.annotate(
            text, (x, value), xytext=(0, -3 if down else 3), textcoords="offset points", ha="center",
            va="top" if down else "bottom", fontsize=8,
        )  # fmt: skip
        before = (x, value)
    ax.axhline(paper, color="k", linestyle="--", linewidth=0.9, label=f"the paper's {row}: {paper:g}")
    if not np.isnan(fast):
        ax.axhline(
            fast, color="C0", linestyle=":", linewidth=1.2, label=f"{row}, optim=fast ({plan.against}): {fast:g}"
        )
    ax.set_xticks(range(len(plan.steps)), ticks, fontsize=8)
    ax.set_ylim(floor, max(shown) + 0.15 * (max(shown) - floor))
    ax.set_ylabel(f"{row}'s test perplexity")
    ax.set_xlabel("step, one knob changed each, against the step before it that ran")
    ax.set_title(f"{report.study}: from the paper's recipe (optim=paper) to ours (optim=fast)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(**LEGEND)
    return figure


def speed_cost_figure(report: Report) -> Figure | None:
    """Each trained row at its training speed (tokens/s, mean over seeds, log scale) and its test perplexity with
    its 95% interval: what an output layer buys and what it costs, at a glance. None without a row with both."""
    shown = report.table[(report.table["status"] == "finished") & report.table["train_speed"].notna()]
    if shown.empty:
        return None
    figure = new_figure(9, 4.2)
    ax = figure.add_subplot()
    for i, (name, (_, row)) in enumerate(zip(fit_labels(list(shown["label"]), 40), shown.iterrows())):
        colour = f"C{i % 10}"
        low, high = row.get("test_low"), row.get("test_high")
        error = [[row["test_ppl"] - low], [high - row["test_ppl"]]] if present(low) else None
        ax.errorbar(row["train_speed"], row["test_ppl"], yerr=error, fmt="o", color=colour, capsize=3, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens/s (mean over seeds, this study's runs, log scale)", fontsize=8)
    ax.set_ylabel("test perplexity (95% interval over texts)", fontsize=8)
    ax.set_title(f"{report.study}: test perplexity against training speed, row by row", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(**LEGEND)
    return figure


def compute_figure(report: Report) -> Figure | None:
    """What compute buys: validation perplexity against CPU minutes (training seconds x torch threads) for every
    trained row, one thin line a seed, the row's colour, one time axis for all; None without a history."""
    rows = {label: seeds for label, seeds in report.timeline.items() if seeds}
    if not rows:
        return None
    part = validated_on(report)
    names = [
        name + (f" (valid: first {part[label]:.0%})" if label in part else "")
        for label, name in zip(rows, fit_labels(list(rows), 40))
    ]
    figure = new_figure(9, 4.5)
    ax = figure.add_subplot()
    for i, (name, seeds) in enumerate(zip(names, rows.values())):
        colour = f"C{i % 10}"
        for j, (_, minutes, valid) in enumerate(seeds):
            ax.plot(minutes, valid, color=colour, linewidth=1.0, alpha=0.7, marker=".", label=name if j == 0 else None)
    best = min(min(valid) for seeds in rows.values() for _, _, valid in seeds)
    ax.set_ylim(best * 0.95, best * 2.0)  # the first epochs' perplexities would flatten the ends that matter
    ax.set_xlabel("CPU minutes in training (seconds in fit x torch threads)", fontsize=8)
    ax.set_ylabel("validation perplexity, each epoch", fontsize=8)
    ax.set_title(f"{report.study}: what compute buys, every trained row on one time axis (a line a seed)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(**LEGEND)
    return figure


def validated_on(report: Report) -> dict[str, float]:
    """The rows whose epochs validated on a part of the split (`trainer.limit_val_batches` < 1: optim=sampled's first
    quarter), by label, and that part: their curves are not on the same measure as the others'."""
    found = {}
    for label, config in zip(report.table["label"], report.table.get("config", [])):
        part = json.loads(config).get("trainer.limit_val_batches") if isinstance(config, str) else None
        if part not in (None, "None") and float(part) < 1:
            found[label] = float(part)
    return found


# The headline figures a study may declare (studies.yaml `figures`), by name: the name is also the file's stem,
# <study>_<name>.png
HEADLINES = {
    "sampled_pairs": sampled_figure,
    "recipe_steps": recipe_figure,
    "speed_cost": speed_cost_figure,
    "compute": compute_figure,
}
