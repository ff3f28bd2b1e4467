"""The report's figures: the headline figures a study declares (studies.yaml `figures`: brown_sampled's pairs,
brown_recipe's steps), every row's test perplexity, validation perplexity per epoch of the trained MLPs, the claims
pair by pair, and perplexity against each knob its rows vary alone (ours filled beside the paper's hollow; only the
knobs the study declares, studies.yaml `knobs`, where it does).

Every figure function builds and returns a matplotlib Figure, or None when it has nothing to show; `save` is the one
place that writes one, as PNG (for the README and the markdown report) and SVG beside it, same stem. The rules every
figure keeps (tests/test_figures.py holds them, from matplotlib's own extents): a label (tick label, legend entry,
annotation) names its row by what tells it apart from the rest of its figure, at most LIMIT characters a line
(`fit_labels`); no text overlaps another; legends sit beside the axes, never on the data.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from nplm_repro.errors import NplmError
from nplm_repro.paper import COLUMNS, paper_table
from nplm_repro.reporting import recipe
from nplm_repro.reporting.claims import FAILS, HOLDS, INCONCLUSIVE, verdict_of
from nplm_repro.reporting.notes import SAMPLED_MARGIN, both_ways, speed_up
from nplm_repro.reporting.tables import Report
from nplm_repro.tracking.runs import present

DPI = 110
LIMIT = 40  # the most characters a label's line may have
BETTER, EQUIVALENT, MORE, FASTER = "better", "equivalent", "more", "faster"
VERDICT_COLOURS = {HOLDS: "tab:green", FAILS: "tab:red", INCONCLUSIVE: "0.45"}
LEGEND = {"fontsize": "small", "loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0}

# --- the one place a figure is written ---------------------------------------------------------------------------


def save(figure: Figure, path: Path) -> None:
    """The figure as `path` (a .png) and as SVG beside it (same stem), both cropped to what is drawn; the SVG without
    a date and with fixed ids, so that a figure drawn again from the same runs writes the same bytes."""
    with matplotlib.rc_context({"svg.hashsalt": "nplm-repro"}):
        figure.savefig(path, dpi=DPI, bbox_inches="tight")
        figure.savefig(path.with_suffix(".svg"), bbox_inches="tight", metadata={"Date": None})


def _figure(width: float, height: float) -> Figure:
    """A figure of its own (no pyplot state), laid out by matplotlib's constrained layout so that titles, tick
    labels and the legends beside the axes get room of their own."""
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _saved(figure: Figure | None, path: Path | None) -> Figure | None:
    if figure is not None and path is not None:
        save(figure, path)
    return figure


def figures(report: Report) -> list[tuple[str, Figure | bytes]]:
    """Every figure the report has something to show in, in order, by file stem: the study's declared headline
    figures first; the features map is PNG bytes drawn when its run ended (tracking/features.py), copied as is."""
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


# --- labels ----------------------------------------------------------------------------------------------------


SETTING = re.compile(r"([A-Za-z_][\w.]*)=(\S+)")  # a key=value word of a label: optim.lr=0.005, n=3


def _key(word: str) -> str:
    """The key of a key=value word, "" for any other word."""
    setting = SETTING.fullmatch(word)
    return setting.group(1) if setting else ""


def short_labels(labels: list[str]) -> list[str]:
    """The labels less the `key=value` words that every one of them has (they tell nothing apart), unless a label
    sets that key to another value too (a pair's `n=3 / n=4`: there the word tells its two sides apart); a label
    alone is left whole (nothing else in its figure to tell it from)."""
    if len(labels) < 2:
        return list(labels)
    words = [label.split() for label in labels]
    shared = set.intersection(*({w for w in ws if _key(w)} for ws in words))
    compared = set()  # the keys a label sets to two values
    for ws in words:
        keys = [_key(w) for w in set(ws) if _key(w)]
        compared |= {key for key in keys if keys.count(key) > 1}
    shared = {w for w in shared if _key(w) not in compared}
    return [" ".join(w for w in ws if w not in shared) for ws in words]


NAMES = {"Kneser-Ney back-off": "KN", "class-based back-off": "class-based"}  # the families' names, short
KEYS = {  # config keys, short (after their prefix is dropped)
    "limit_val_batches": "val",
    "limit_train_batches": "train",
    "precision": "prec",
    "estimator": "est",
    "proposal": "prop",
    "samples": "k",
    "output": "out",
    "batch_size": "batch",
    "plateau_factor": "plateau",
    "decay_rate": "decay",
    "max_epochs": "epochs",
    "features": "feat",
    "max_unk_freq": "unk",
}
VALUES = {"bf16-mixed": "bf16", "16-mixed": "fp16", "32-true": "fp32", "fixed_random": "random", "fixed_lsi": "lsi"}


def _keeps_apart(before: list[str], after: list[str]) -> bool:
    """Whether `after` tells apart exactly the labels `before` told apart."""
    return len(set(before)) == len(set(after)) == len(set(zip(before, after)))


def _words(labels: list[str], change: Callable[[str], str]) -> list[str]:
    """Each label with each word changed (a word changed to "" left out)."""
    return [" ".join(w for w in (change(w) for w in label.split()) if w) for label in labels]


def _key_word(word: str, change: Callable[[str, str], str]) -> str:
    """A key=value word changed, any other word as it is."""
    setting = SETTING.fullmatch(word)
    return change(*setting.groups()) if setting else word


def _drop_prefixes(labels: list[str]) -> list[str]:
    """optim.lr=0.005 -> lr=0.005."""
    return _words(labels, lambda w: _key_word(w, lambda k, v: f"{k.rsplit('.', 1)[-1]}={v}"))


def _factor_pairs(labels: list[str]) -> list[str]:
    """A pair's second side less the words its first side has: `KN n=3 / KN n=4` -> `KN n=3 / n=4`."""
    factored = []
    for label in labels:
        match = re.search(r" (/|to) ", label)
        if match is None:
            factored.append(label)
            continue
        left, right = label[: match.start()], label[match.end() :]
        rest = [w for w in right.split() if w not in left.split()]
        factored.append(f"{left} {match.group(1)} {' '.join(rest)}" if rest else label)
    return factored


def _pair_values(labels: list[str]) -> list[str]:
    """A pair's second side, when it is only keys its first side sets, as their values alone: `mix=learned /
    mix=context` -> `mix=learned / context`."""
    shorter = []
    for label in labels:
        match = re.search(r" (/|to) ", label)
        right = label[match.end() :].split() if match else []
        left = {_key(w) for w in label[: match.start()].split()} - {""} if match else set()
        if right and all(_key(w) in left for w in right):
            label = f"{label[: match.end()]}{' '.join(w.split('=', 1)[1] for w in right)}"
        shorter.append(label)
    return shorter


def _abbreviate(labels: list[str]) -> list[str]:
    """The families' names, the keys and a few values shortened (NAMES, KEYS, VALUES)."""
    for name, short in NAMES.items():
        labels = [label.replace(name, short) for label in labels]
    return _words(labels, lambda w: _key_word(w, lambda k, v: f"{KEYS.get(k, k)}={VALUES.get(v, v)}"))


def _drop_keys(labels: list[str], limit: int) -> list[str]:
    """Whole keys left out, the rightmost first, while a label is too long and the rest still tell the labels apart
    (a key that changes together with another says nothing the other does not); never a key a label compares
    within itself (a pair's `n=3 / n=4`)."""
    place: dict[str, int] = {}
    for label in labels:
        for i, word in enumerate(label.split()):
            if key := _key(word):
                place[key] = max(place.get(key, i), i)
    for key in sorted(place, key=place.get, reverse=True):
        if all(len(label) <= limit for label in labels):
            break
        values = [{w for w in label.split() if _key(w) == key} for label in labels]
        if any(len(v) > 1 for v in values):
            continue
        fewer = _words(labels, lambda w, key=key: "" if _key(w) == key else w)
        if _keeps_apart(labels, fewer):
            labels = fewer
    return labels


def _truncate(labels: list[str], limit: int) -> list[str]:
    """Each label still too long cut to `limit` with "…": its end cut off, else (when that makes two equal) its
    middle, else numbered apart."""
    long = [len(label) > limit for label in labels]
    tail = limit // 3
    for cut in (
        lambda label: label[: limit - 1].rstrip() + "…",
        lambda label: label[: limit - 1 - tail].rstrip() + "…" + label[-tail:].lstrip(),
    ):
        shorter = [cut(label) if too_long else label for label, too_long in zip(labels, long)]
        if _keeps_apart(labels, shorter):
            return shorter
    numbered, seen = [], {}
    for label, too_long in zip(labels, long):
        number = seen.setdefault(label, len(seen) + 1) if too_long else 0
        tag = f"…#{number}"
        numbered.append(label[: limit - len(tag)].rstrip() + tag if too_long else label)
    return numbered


def fit_labels(labels: list[str], limit: int = LIMIT) -> list[str]:
    """A figure's labels, each at most `limit` characters and told apart as before: less the key=value words they
    all share, then, while one is longer, less the keys' prefixes (optim., trainer.), then abbreviated, then less
    the keys that tell no label apart from the others, then cut with "…". Each step keeps the labels apart, else it
    is skipped; the same labels always give the same result. (A pair, `A / B` or `A to B`, loses from B the words
    A has before its names are abbreviated, and B's keys before the cut, when A has them: `mix=learned / context`.)"""
    labels = short_labels(list(labels))
    for step in (_drop_prefixes, _factor_pairs, _abbreviate, lambda ls: _drop_keys(ls, limit), _pair_values):
        if all(len(label) <= limit for label in labels):
            return labels
        shorter = step(labels)
        labels = shorter if _keeps_apart(labels, shorter) else labels
    return _truncate(labels, limit)


def _wrap(text: str, width: int = LIMIT) -> str:
    return "\n".join(textwrap.wrap(text, width))


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
    figure = _figure(9, 1.3 + 0.3 * len(table))
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
    headers = [_wrap(f"{number}. {claim.text}: {claim.verdict}") for number, claim, _ in claims]
    heights = [math.ceil((header.count("\n") + 1) / 2) for header in headers]  # two lines of 7.5 pt to a row
    rows = sum(height + len(pairs) for height, (_, _, pairs) in zip(heights, claims))
    figure = _figure(9, 1.2 + 0.32 * rows)
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
    return _saved(figure, path)


def _sort_values(values: list[str]) -> list[str]:
    numeric = pd.to_numeric(pd.Series(values), errors="coerce")
    return [v for _, v in sorted(zip(numeric, values))] if numeric.notna().all() else sorted(values)


def valid_by_epoch(report: Report) -> Figure | None:
    """Validation perplexity per epoch of every trained MLP row: a thin line per seed with its best epoch (the
    checkpoint reported) marked, the seeds' mean in bold, one colour per row, the legend beside the axes (with the
    paper's validation perplexity of brown_recipe's targets, dashed); None when there is none."""
    curves = {row: seeds for row, seeds in report.history.items() if any(values for _, values in seeds)}
    if not curves:
        return None
    counts = [f" ({len(seeds)})" for seeds in curves.values()]
    names = dict(zip(curves, fit_labels(list(curves), LIMIT - max(map(len, counts)))))
    figure = _figure(9, 4.5)
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
    figure = _figure(8, 4.5)
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
    return _saved(figure, path)


def _group_name(group: pd.DataFrame, others: list[str]) -> list[str]:
    """What a group's rows share: the family's name and the other knobs that have a value."""
    first = group.iloc[0]
    return [first["family_label"]] + [f"{k}={first[k]}" for k in others if k != "family" and str(first[k]) != ""]


# --- the headline figures a study declares (studies.yaml `figures`) ------------------------------------------------


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
    HOW_TRAINED), with the same paired interval and its equivalence verdict within +-SAMPLED_MARGIN."""
    pairs = []
    for exact, sampled in both_ways(report.table):
        speedup, cost = speed_up(exact, sampled)
        in_fit = cost == "fit_minutes"
        difference = report.evidence.compare(sampled["label"], exact["label"])
        estimate = sampled["test_ppl"] / exact["test_ppl"] - 1
        if difference is None:
            pairs.append(SampledPair(exact["label"], estimate, None, None, None, speedup, in_fit))
        else:
            verdict = verdict_of(difference, EQUIVALENT, SAMPLED_MARGIN)
            low, high = difference.low, difference.high
            pairs.append(SampledPair(exact["label"], difference.estimate, low, high, verdict, speedup, in_fit))
    return pairs


def sampled_figure(report: Report) -> Figure | None:
    """brown_sampled's pairs, one line each: left, what sampling costs in test perplexity (sampled over exact, less
    1, with its paired 95% interval, against the +-SAMPLED_MARGIN band of the equivalence claim); right, what it
    saves (exact time over sampled time). None without a pair."""
    pairs = sampled_pairs(report)
    if not pairs:
        return None
    names = fit_labels([p.label for p in pairs])
    figure = _figure(9, 1.9 + 0.4 * len(pairs))
    cost, speed = figure.subplots(1, 2, sharey=True, width_ratios=[3, 2])
    y = np.arange(len(pairs), 0, -1)
    cost.axvspan(-SAMPLED_MARGIN * 100, SAMPLED_MARGIN * 100, color="tab:green", alpha=0.12, linewidth=0)
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
        seen[f"within ±{SAMPLED_MARGIN:.0%}: {pair.verdict}"] = Line2D([], [], marker="o", ls="", color=colour)
    reach = max(
        SAMPLED_MARGIN * 100 * 1.5,
        *(abs(v) * 100 * 1.1 for p in pairs for v in (p.estimate, p.low, p.high) if v is not None),
    )
    cost.set_xlim(-reach, reach)
    cost.set_yticks(y, names, fontsize=8)
    cost.set_ylim(0.4, len(pairs) + 0.6)
    cost.set_xlabel(
        f"test perplexity, sampled over exact, less 1 (%)\nbar: paired 95% interval; band: ±{SAMPLED_MARGIN:.0%}",
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
    figure = _figure(9, 4.5)
    ax = figure.add_subplot()
    before = None
    ticks = []
    for x, (step, value) in enumerate(zip(plan.steps, values)):
        ticks.append(_wrap(f"{x}. {step.name}", 20) + ("\n(not run)" if np.isnan(value) else ""))
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
    figure = _figure(9, 4.2)
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


# The headline figures a study may declare (studies.yaml `figures`), by name: the name is also the file's stem,
# <study>_<name>.png
HEADLINES = {"sampled_pairs": sampled_figure, "recipe_steps": recipe_figure, "speed_cost": speed_cost_figure}
