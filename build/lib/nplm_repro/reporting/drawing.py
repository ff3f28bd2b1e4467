"""What every figure of the report shares, so that each keeps the same rules: a figure of its own laid out with
room for its labels (`new_figure`), legends beside the axes (LEGEND), the verdicts' colours, one way to save it
(`save`, PNG and SVG, the same bytes for the same runs), and labels that name a row by what tells it apart from the
rest of its figure, at most LIMIT characters a line (`fit_labels`). tests/test_figures.py holds the rules, measured
from matplotlib's own extents: no text overlaps another, legends never sit on the data.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from nplm_repro.reporting.claims import FAILS, HOLDS, INCONCLUSIVE

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


def new_figure(width: float, height: float) -> Figure:
    """A figure of its own (no pyplot state), laid out by matplotlib's constrained layout so that titles, tick
    labels and the legends beside the axes get room of their own."""
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def saved(figure: Figure | None, path: Path | None) -> Figure | None:
    """The figure, saved to `path` too when a caller names one (a figure drawn alone, outside a report)."""
    if figure is not None and path is not None:
        save(figure, path)
    return figure


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


def wrap(text: str, width: int = LIMIT) -> str:
    """`text` in lines of at most `width` characters: a title or a tick label too long for one line."""
    return "\n".join(textwrap.wrap(text, width))
