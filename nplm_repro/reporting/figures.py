"""The report's figures: validation perplexity per epoch of the trained MLPs, and perplexity against each knob that
takes two values or more, ours filled beside the paper's hollow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from nplm_repro.paper import COLUMNS, FAMILY_NAMES
from nplm_repro.reporting.runs import present
from nplm_repro.reporting.tables import Report


def draw(report: Report, directory: Path) -> list[str]:
    """Every figure the report has something to show in, saved into `directory`; their file names, in order."""
    names = []
    name = f"{report.study}_test.png"
    if rows_figure(report, directory / name):
        names.append(name)
    name = f"{report.study}_valid_by_epoch.png"
    if valid_by_epoch(report, directory / name):
        names.append(name)
    for kinds, name in (
        ((BETTER, EQUIVALENT), f"{report.study}_claims.png"),
        ((MORE,), f"{report.study}_claims_epochs.png"),
    ):
        if claims_forest(report, kinds, directory / name):
            names.append(name)
    if report.learned is not None:  # drawn when its run ended (tracking/features.py): copied as it is
        name = f"{report.study}_features_map.png"
        (directory / name).write_bytes(report.learned.map_png)
        names.append(name)
    for knob in (*COLUMNS, *report.extra):
        name = f"{report.study}_{knob}.png"
        if against_knob(report, knob, directory / name):
            names.append(name)
    return names


def rows_figure(report: Report, path: Path) -> bool:
    """Every finished row's test perplexity, one line each, MLPs first: ours filled with its 95% interval over texts
    (and each seed's own, small), the paper's hollow on the same line; False when no row has a number."""
    table = report.table[report.table["status"] == "finished"].copy()
    if table.empty:
        return False
    table["_mlp"] = table["family"] != "mlp"
    table = table.sort_values("_mlp", kind="stable").reset_index(drop=True)
    labels = short_labels(list(table["label"]))
    figure = Figure(figsize=(8, 1.0 + 0.3 * len(table)))
    ax = figure.add_subplot()
    y = list(range(len(table), 0, -1))
    for i, row in table.iterrows():
        colour = "C0" if row["family"] == "mlp" else "C1"
        low, high = row.get("test_low"), row.get("test_high")
        if present(low):
            ax.plot([low, high], [y[i], y[i]], color=colour, linewidth=2, alpha=0.6)
        ax.plot(row["test_ppl"], y[i], "o", color=colour, markersize=6)
        if present(row.get("paper_test_ppl")):
            ax.plot(row["paper_test_ppl"], y[i], "o", markerfacecolor="none", markeredgecolor="k", markersize=7)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("test perplexity (filled: ours, mean over seeds, bar: 95% interval over texts; hollow: the paper's)")
    ax.set_title(f"{report.study}: test perplexity per row (blue: MLPs, orange: n-grams)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    return True


BETTER, EQUIVALENT, MORE = "better", "equivalent", "more"
VERDICT_COLOURS = {"holds": "tab:green", "fails": "tab:red", "inconclusive": "0.45"}


def short_labels(labels: list[str]) -> list[str]:
    """The labels less the `key=value` words that every one of them has (they tell nothing apart)."""
    words = [label.split() for label in labels]
    shared = set.intersection(*({w for w in ws if "=" in w} for ws in words)) if words else set()
    return [" ".join(w for w in ws if w not in shared) for ws in words]


def claims_forest(report: Report, kinds: tuple[str, ...], path: Path) -> bool:
    """A forest plot of the claims' pairs of these kinds: each pair's relative difference with its 95% interval,
    coloured by its verdict, under its claim; the claim's threshold as a dashed line across its own pairs."""
    claims = [(i, c, [m for m in c.measured if m.kind in kinds]) for i, c in enumerate(report.claims, 1)]
    claims = [(i, c, pairs) for i, c, pairs in claims if pairs]
    if not claims:
        return False
    labels = iter(short_labels([m.pair for _, _, pairs in claims for m in pairs]))
    rows = sum(len(pairs) + 1 for _, _, pairs in claims)
    figure = Figure(figsize=(9, 0.8 + 0.32 * rows))
    ax = figure.add_subplot()
    y, ticks, names = rows, [], []
    for number, claim, pairs in claims:
        colour = VERDICT_COLOURS.get(claim.verdict, "0.45")
        words = claim.text if len(claim.text) <= 95 else claim.text[:94] + "…"
        header = f"{number}. {words}: {claim.verdict}"
        ax.text(0.005, y, header, transform=ax.get_yaxis_transform(), fontsize=7.5, fontweight="bold", color=colour)
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
    what = (
        "best validation epoch: b over a, less 1"
        if kinds == (MORE,)
        else "test perplexity: baseline over model, less 1"
    )
    ax.set_xlabel(f"relative difference, % ({what}),\nwith its 95% interval; dashed: the claim's threshold", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(
        f"{report.study}: the claims, pair by pair (verdicts: green holds, red fails, grey inconclusive)", fontsize=9
    )
    figure.savefig(path, dpi=110, bbox_inches="tight")
    return True


def _sort_values(values: list[str]) -> list[str]:
    numeric = pd.to_numeric(pd.Series(values), errors="coerce")
    return [v for _, v in sorted(zip(numeric, values))] if numeric.notna().all() else sorted(values)


def valid_by_epoch(report: Report, path: Path) -> bool:
    """Validation perplexity per epoch of every trained MLP row: a thin line per seed with its best epoch (the
    checkpoint reported) marked, the seeds' mean in bold, one colour per row, the legend beside the axes; False when
    there is none."""
    curves = {row: seeds for row, seeds in report.history.items() if any(values for _, values in seeds)}
    if not curves:
        return False
    names = dict(zip(curves, short_labels(list(curves))))
    figure = Figure(figsize=(8, 4.5))
    ax = figure.add_subplot()
    for colour, (row, seeds) in enumerate(curves.items()):
        colour = f"C{colour % 10}"
        for _, values in seeds:
            epochs = np.arange(1, len(values) + 1)
            ax.plot(epochs, values, color=colour, linewidth=0.8, alpha=0.45)
            best = int(np.argmin(values))
            ax.plot(epochs[best], values[best], marker="v", color=colour, markersize=5, alpha=0.8)
        shortest = min(len(values) for _, values in seeds)
        mean = np.mean([values[:shortest] for _, values in seeds], axis=0)
        ax.plot(np.arange(1, shortest + 1), mean, color=colour, linewidth=2.2, label=f"{names[row]} ({len(seeds)})")
    for row, valid in (report.recipe.paper_valid if report.recipe else {}).items():  # brown_recipe's targets
        ax.axhline(valid, color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(
            f"{row}, paper's valid {valid:g}", (1, valid), fontsize=7, xytext=(2, 2), textcoords="offset points"
        )
    configs = [json.loads(c) for c in report.table.get("config", []) if isinstance(c, str)]  # missing rows: none
    quarter = any(c.get("trainer.limit_val_batches") not in (None, "1.0", "1") for c in configs)
    on = " (sampled runs: on the first quarter of validation)" if quarter else ""
    ax.set(xlabel="epoch", ylabel="validation perplexity")
    ax.set_title(
        f"{report.study}: validation perplexity per epoch{on}\nthin: one seed (v: its best epoch, the checkpoint "
        "reported); bold: the seeds' mean",
        fontsize=9,
    )
    ax.legend(fontsize="small", title="row (seeds)", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.grid(alpha=0.3)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    return True


def against_knob(report: Report, knob: str, path: Path) -> bool:
    """Test perplexity against one knob, like with like: one line per group of finished rows that differ in this
    knob alone (the family and every other knob equal), ours filled, the paper's hollow; False when no two rows
    differ in this knob alone (a figure of rows that differ in several knobs would answer no question)."""
    rows = report.table[(report.table["status"] == "finished") & (report.table[knob].astype(str) != "")]
    others = [k for k in ("family", *COLUMNS, *report.extra) if k != knob]
    groups = [g for _, g in rows.groupby([rows[k].astype(str) for k in others], sort=False) if g[knob].nunique() > 1]
    if not groups:
        return False
    values = _sort_values(sorted({str(v) for g in groups for v in g[knob]}))
    position = {v: i for i, v in enumerate(values)}
    figure = Figure(figsize=(8, 4.5))
    ax = figure.add_subplot()
    names = short_labels([" ".join(_group_name(g, others)) for g in groups])
    for colour, (group, name) in enumerate(zip(groups, names)):
        group = group.assign(_x=group[knob].astype(str).map(position)).sort_values("_x")
        colour = f"C{colour % 10}"
        ax.plot(group["_x"], group["test_ppl"], marker="o", color=colour, label=name)
        ax.scatter(group["_x"], group["paper_test_ppl"], facecolors="none", edgecolors=colour)
    ax.set(xticks=range(len(values)), xticklabels=values, xlabel=knob, ylabel="test perplexity")
    ax.set_title(
        f"{report.study}: test perplexity against {knob}, other knobs held (filled: ours, hollow: paper)", fontsize=9
    )
    ax.margins(x=0.2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    figure.savefig(path, dpi=110, bbox_inches="tight")
    return True


def _group_name(group: pd.DataFrame, others: list[str]) -> list[str]:
    """What a group's rows share: the family's name and the other knobs that have a value."""
    first = group.iloc[0]
    return [FAMILY_NAMES.get(first["family"], first["family"])] + [
        f"{k}={first[k]}" for k in others if k != "family" and str(first[k]) != ""
    ]
