"""The report's figures: the headline figures a study declares (studies.yaml `figures`, drawn by headlines.py)
first, then those every study has: every row's test perplexity, validation perplexity per epoch of the trained rows,
the claims pair by pair, and perplexity against each knob its rows vary alone (ours filled beside the paper's hollow;
only the knobs the study declares, studies.yaml `knobs`, where it does).

Every figure function builds and returns a matplotlib Figure, or None when it has nothing to show; `save`
(drawing.py, with the rules every figure keeps) is the one place that writes one, as PNG (for the README and the
markdown report) and SVG beside it, same stem.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from nplm_repro.errors import NplmError
from nplm_repro.paper import COLUMNS
from nplm_repro.reporting.drawing import (
    BETTER,
    EQUIVALENT,
    FASTER,
    LEGEND,
    LIMIT,
    MORE,
    VERDICT_COLOURS,
    fit_labels,
    new_figure,
    save,
    saved,
    wrap,
)
from nplm_repro.reporting.headlines import HEADLINES
from nplm_repro.reporting.tables import Report
from nplm_repro.tracking.runs import present


def figures(report: Report) -> list[tuple[str, Figure | bytes]]:
    """Every figure the report has something to show in, in order, by file stem: the study's declared headline
    figures first; the features map is PNG bytes drawn when its run ended (serving/features.py), copied as is."""
    study = report.study
    found: list[tuple[str, Figure | bytes | None]] = []
    for name in report.spec.get("figures", []):
        if name not in HEADLINES:
            raise NplmError(f"study {study} declares figure {name!r}; figures: {', '.join(HEADLINES)}")
        found.append((f"{study}_{name}", HEADLINES[name](report)))
    found += [
        (f"{study}_test", rows_figure(report)),
        (f"{study}_valid_by_epoch", valid_by_epoch(report)),
        (f"{study}_claims", claims_forest(report, (BETTER, EQUIVALENT))),
        (f"{study}_claims_epochs", claims_forest(report, (MORE,))),
        (f"{study}_claims_speed", claims_forest(report, (FASTER,))),
        (f"{study}_features_map", report.learned.map_png if report.learned is not None else None),
        *((f"{study}_{knob}", against_knob(report, knob)) for knob in knobs(report)),
    ]
    return [(stem, figure) for stem, figure in found if figure is not None]


def knobs(report: Report) -> list[str]:
    """The knobs the report draws test perplexity against: those its study declares (studies.yaml `knobs`: a study
    that asks one question draws no figure of another), else every column and extra key of its table."""
    every = [*COLUMNS, *report.extra]
    declared = report.spec.get("knobs")
    return every if declared is None else [knob for knob in declared if knob in every]


def draw(report: Report, directory: Path) -> list[str]:
    """Every figure of the report saved into `directory` (PNG, and SVG beside each but the features map); the PNGs'
    file names, in order."""
    names = []
    for stem, figure in figures(report):
        path = directory / f"{stem}.png"
        if isinstance(figure, bytes):
            path.write_bytes(figure)
        else:
            save(figure, path)
        names.append(path.name)
    return names


# --- the figures every study has ---------------------------------------------------------------------------------


def rows_figure(report: Report) -> Figure | None:
    """Every finished row's test perplexity, one line each, MLPs first: ours filled (the mean over seeds) with its
    95% interval over texts and each seed's value as a small dot, the paper's hollow on the same line; None when no
    row has a number."""
    table = report.table[report.table["status"] == "finished"].copy()
    if table.empty:
        return None
    table["_counted"] = table["kind"] == "counted"  # trained and mixed rows first, the n-grams after them
    table = table.sort_values("_counted", kind="stable").reset_index(drop=True)
    labels = fit_labels(list(table["label"]))
    figure = new_figure(9, 1.3 + 0.3 * len(table))
    ax = figure.add_subplot()
    y = list(range(len(table), 0, -1))
    shown: dict[str, Line2D] = {}
    for i, row in table.iterrows():
        colour, kind = row["colour"], "n-gram" if row["kind"] == "counted" else row["family_label"]
        low, high = row.get("test_low"), row.get("test_high")
        if present(low):
            ax.plot([low, high], [y[i], y[i]], color=colour, linewidth=2, alpha=0.6)
            shown["95% interval over texts"] = Line2D([], [], color="0.5", linewidth=2, alpha=0.6)
        by_seed = row.get("test_ppl_by_seed")
        if isinstance(by_seed, tuple) and len(by_seed) > 1:
            ax.plot(by_seed, [y[i] + 0.22] * len(by_seed), "|", color=colour, markersize=5, alpha=0.9)
            shown["one seed"] = Line2D([], [], marker="|", ls="", color="0.3", markersize=5)
        ax.plot(row["test_ppl"], y[i], "o", color=colour, markersize=6)
        shown[f"ours, {kind} (mean over seeds)"] = Line2D([], [], marker="o", ls="", color=colour)
        if present(row.get("paper_test_ppl")):
            ax.plot(row["paper_test_ppl"], y[i], "o", markerfacecolor="none", markeredgecolor="k", markersize=7)
            shown["the paper's"] = Line2D([], [], marker="o", ls="", mfc="none", mec="k", markersize=7)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_ylim(0.4, len(table) + 0.6)
    ax.set_xlabel("test perplexity", fontsize=8)
    ax.set_title(f"{report.study}: test perplexity per row, ours beside the paper's", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    order = sorted(shown, key=lambda k: (not k.startswith("ours"), k == "the paper's"))
    ax.legend([shown[k] for k in order], order, **LEGEND)
    return figure


def claims_forest(report: Report, kinds: tuple[str, ...], path: Path | None = None) -> Figure | None:
    """A forest plot of the claims' pairs of these kinds: each pair's relative difference with its 95% interval,
    coloured by its verdict, under its claim (its words wrapped, with its verdict); the claim's threshold as a dashed
    line across its own pairs. None when no claim has such a pair measured; saved to `path` when one is given."""
    claims = [(i, c, [m for m in c.measured if m.kind in kinds]) for i, c in enumerate(report.claims, 1)]
    claims = [(i, c, pairs) for i, c, pairs in claims if pairs]
    if not claims:
        return None
    named = [m.pair.removesuffix(f" ({m.kind})") for _, _, measured in claims for m in measured]  # the axis says so
    labels = iter(fit_labels(named))
    headers = [wrap(f"{number}. {claim.text}: {claim.verdict}") for number, claim, _ in claims]
    heights = [math.ceil((header.count("\n") + 1) / 2) for header in headers]  # two lines of 7.5 pt to a row
    rows = sum(height + len(pairs) for height, (_, _, pairs) in zip(heights, claims))
    figure = new_figure(9, 1.2 + 0.32 * rows)
    ax = figure.add_subplot()
    y, ticks, names = rows, [], []
    for header, height, (_, claim, pairs) in zip(headers, heights, claims):
        colour = VERDICT_COLOURS.get(claim.verdict, "0.45")
        ax.text(
            0.005, y + 0.4, header, transform=ax.get_yaxis_transform(), fontsize=7.5, fontweight="bold",
            color=colour, va="top", linespacing=1.1,
        )  # fmt: skip
        y -= height - 1
        for m in pairs:
            y -= 1
            colour = VERDICT_COLOURS.get(m.verdict, "0.45")
            ax.errorbar(
                m.estimate * 100,
                y,
                xerr=[[(m.estimate - m.low) * 100], [(m.high - m.estimate) * 100]],
                fmt="o",
                color=colour,
                capsize=3,
                markersize=4,
            )
            ticks.append(y)
            names.append(next(labels))
            for x in (-m.threshold, m.threshold) if m.kind == EQUIVALENT else (m.threshold,):
                ax.plot([x * 100, x * 100], [y - 0.45, y + 0.45], color="0.3", linestyle="--", linewidth=0.9)
        y -= 1
    ax.axvline(0, color="0.75", linewidth=0.8, zorder=0)
    ax.set_yticks(ticks, names, fontsize=8)
    ax.set_ylim(y + 0.5, rows + 0.5)
    what = {
        (MORE,): "best validation epoch: b over a, less 1",
        (FASTER,): "training tokens/s: b over a, less 1",
    }.get(kinds, "test perplexity: baseline over model, less 1")
    ax.set_xlabel(f"relative difference, % ({what}),\nwith its 95% interval; dashed: the claim's threshold", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(
        f"{report.study}: the claims, pair by pair (verdicts: green holds, red fails, grey inconclusive)", fontsize=9
    )
    return saved(figure, path)


def _sort_values(values: list[str]) -> list[str]:
    numeric = pd.to_numeric(pd.Series(values), errors="coerce")
    return [v for _, v in sorted(zip(numeric, values))] if numeric.notna().all() else sorted(values)


def valid_by_epoch(report: Report) -> Figure | None:
    """Validation perplexity per epoch of every trained row: a thin line per seed with its best epoch (the
    checkpoint reported) marked, the seeds' mean in bold, one colour per row, the legend beside the axes (with the
    paper's validation perplexity of brown_recipe's targets, dashed); None when there is none."""
    curves = {row: seeds for row, seeds in report.history.items() if any(values for _, values in seeds)}
    if not curves:
        return None
    counts = [f" ({len(seeds)})" for seeds in curves.values()]
    names = dict(zip(curves, fit_labels(list(curves), LIMIT - max(map(len, counts)))))
    figure = new_figure(9, 4.5)
    ax = figure.add_subplot()
    for colour, ((row, seeds), count) in enumerate(zip(curves.items(), counts)):
        colour = f"C{colour % 10}"
        for _, values in seeds:
            if not values:
                continue
            epochs = np.arange(1, len(values) + 1)
            ax.plot(epochs, values, color=colour, linewidth=0.8, alpha=0.45)
            best = int(np.argmin(values))
            ax.plot(epochs[best], values[best], marker="v", color=colour, markersize=5, alpha=0.8)
        shortest = min(len(values) for _, values in seeds if values)
        mean = np.mean([values[:shortest] for _, values in seeds if values], axis=0)
        ax.plot(np.arange(1, shortest + 1), mean, color=colour, linewidth=2.2, label=f"{names[row]}{count}")
    targets = report.recipe.paper_valid if report.recipe else {}  # a recipe study's target rows
    for style, (row, valid) in zip(("--", ":", "-."), targets.items()):
        ax.axhline(valid, color="grey", linestyle=style, linewidth=0.9, label=f"{row}, the paper's valid: {valid:g}")
    configs = [json.loads(c) for c in report.table.get("config", []) if isinstance(c, str)]  # missing rows: none
    parts = sorted({c.get("trainer.limit_val_batches") for c in configs} - {None, "None", "1.0", "1"}, key=float)
    on = f" (runs with trainer.limit_val_batches={', '.join(parts)}: on that part of validation)" if parts else ""
    ax.set(xlabel="epoch", ylabel="validation perplexity")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole: no tick at 2.5
    ax.set_title(
        f"{report.study}: validation perplexity per epoch{on}\nthin: one seed (v: its best epoch, the checkpoint "
        "reported); bold: the seeds' mean",
        fontsize=9,
    )
    ax.legend(title="row (seeds)", **LEGEND)
    ax.grid(alpha=0.3)
    return figure


def against_knob(report: Report, knob: str, path: Path | None = None) -> Figure | None:
    """Test perplexity against one knob, like with like: one line per group of finished rows that differ in this
    knob alone (the family and every other knob equal), ours filled, the paper's hollow; None when no two rows
    differ in this knob alone (a figure of rows that differ in several knobs would answer no question). Saved to
    `path` when one is given."""
    rows = report.table[(report.table["status"] == "finished") & (report.table[knob].astype(str) != "")]
    others = [k for k in ("family", *COLUMNS, *report.extra) if k != knob]
    groups = [g for _, g in rows.groupby([rows[k].astype(str) for k in others], sort=False) if g[knob].nunique() > 1]
    if not groups:
        return None
    values = _sort_values(sorted({str(v) for g in groups for v in g[knob]}))
    position = {v: i for i, v in enumerate(values)}
    figure = new_figure(8, 4.5)
    ax = figure.add_subplot()
    names = fit_labels([" ".join(_group_name(g, others)) for g in groups])
    for colour, (group, name) in enumerate(zip(groups, names)):
        group = group.assign(_x=group[knob].astype(str).map(position)).sort_values("_x")
        colour = f"C{colour % 10}"
        ax.plot(group["_x"], group["test_ppl"], marker="o", color=colour, label=name)
        ax.scatter(group["_x"], group["paper_test_ppl"], facecolors="none", edgecolors=colour)
    ticks = fit_labels(values)
    slant = sum(map(len, ticks)) > 60  # long values side by side would run into each other
    ax.set_xticks(range(len(values)), ticks, rotation=30 if slant else 0, ha="right" if slant else "center")
    ax.set(xlabel=knob, ylabel="test perplexity")
    ax.set_title(
        f"{report.study}: test perplexity against {knob}, other knobs held\n(filled: ours, hollow: the paper's)",
        fontsize=9,
    )
    ax.margins(x=0.2)
    ax.grid(alpha=0.3)
    ax.legend(**LEGEND)
    return saved(figure, path)


def _group_name(group: pd.DataFrame, others: list[str]) -> list[str]:
    """What a group's rows share: the family's name and the other knobs that have a value."""
    first = group.iloc[0]
    return [first["family_label"]] + [f"{k}={first[k]}" for k in others if k != "family" and str(first[k]) != ""]
