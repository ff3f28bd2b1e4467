"""The map of a model's word features, as points and as the figure drawn from them: the MAP_WORDS most frequent
words of the training split on the first two principal components of their rows of C. The points are what a run
keeps (features/map.json) and what its study's archive ships; the figure is drawn from them alone, at training
time and when a report is rebuilt from its archive. Torch-free: the report draws it."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from matplotlib.figure import Figure

MAP_WORDS, LABELLED = 300, 200  # words on the map; the most frequent of them that may carry a label
DIGITS = 6  # significant digits a point keeps: far finer than a pixel of the figure


def map_points(rows: np.ndarray, words: list[str], title: str) -> dict[str, Any]:
    """The words' feature `rows` (most frequent first) on their first two principal components, with each
    component's share of their variance and the figure's title."""
    centred = rows - rows.mean(axis=0)
    _, singular, axes = np.linalg.svd(centred, full_matrices=False)
    xy = centred @ axes[:2].T
    share = singular[:2] ** 2 / (singular**2).sum()
    return {
        "title": title,
        "words": list(words),
        "xy": [[float(f"{v:.{DIGITS}g}") for v in point] for point in xy],
        "share": [float(f"{v:.{DIGITS}g}") for v in share],
    }


def draw(points: dict[str, Any]) -> bytes:
    """The map as PNG bytes, from `map_points`' points."""
    xy, words, share = np.array(points["xy"], dtype=np.float64), points["words"], points["share"]
    figure = Figure(figsize=(11, 8.5))
    ax = figure.add_subplot()
    ax.scatter(xy[:, 0], xy[:, 1], s=6, color="0.6")
    named = labels_apart(xy[:LABELLED])
    for i in named:
        ax.annotate(words[i], xy[i], fontsize=7, xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel(f"first principal component of the word features ({share[0]:.0%} of the variance of these words)")
    ax.set_ylabel(f"second ({share[1]:.0%})")
    ax.set_title(f"{points['title']}: the {len(words)} most frequent words, {len(named)} of them named", fontsize=10)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def labels_apart(xy: np.ndarray, width: float = 0.06, height: float = 0.025) -> list[int]:
    """Which points get a label, most frequent first: those whose label (a box of `width` x `height` of the plot's
    span) would overlap no label already placed."""
    span = np.ptp(xy, axis=0) + 1e-12
    placed: list[np.ndarray] = []
    chosen = []
    for i, point in enumerate(xy / span):
        if all(abs(point[0] - p[0]) > width or abs(point[1] - p[1]) > height for p in placed):
            placed.append(point)
            chosen.append(i)
    return chosen
