"""95% intervals from the runs' kept scores (nplm_repro/scores.py), by a bootstrap over the split's texts.

Tokens of one text are not independent (its topic, its author), so a resample draws whole texts with
replacement, never tokens. One set of resamples (`Bootstrap`, fixed seed) serves every row of a report: a
perplexity's interval, and the *paired* interval of a comparison, whose two sides see the same resampled texts.
A row with several seeds takes, in each resample, the mean of its seeds' perplexities, as the table does.
Percentile intervals, from one vectorised product (resamples x texts) per row: no Python loop over resamples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nplm_repro.scores import KEPT_SPLITS
from nplm_repro.storage.archive import ArchiveSource

RESAMPLES = 2000
SEED = 2003  # fixed: a report rebuilt from the same runs gives the same intervals
LEVEL = 0.95


@dataclass(frozen=True)
class TextSums:
    """One run's kept scores of one split, summed per text of the split: all a resample needs."""

    texts: tuple[int, ...]  # the texts of the split (indices into the corpus's texts), in order
    logprob: np.ndarray  # float64 [texts]
    tokens: np.ndarray  # float64 [texts]

    def perplexity(self, weights: np.ndarray | None = None) -> np.ndarray | float:
        """exp(-ln P / tokens) over all texts, or per resample for `weights` [resamples, texts] (times drawn)."""
        if weights is None:
            return float(np.exp(-self.logprob.sum() / self.tokens.sum()))
        return np.exp(-(weights @ self.logprob) / (weights @ self.tokens))


class Bootstrap:
    """`resamples` draws of the split's texts with replacement, as counts: weights[b, d] = times text d is drawn."""

    def __init__(self, texts: int, resamples: int = RESAMPLES, seed: int = SEED) -> None:
        picks = np.random.default_rng(seed).integers(0, texts, size=(resamples, texts))
        self.weights = np.zeros((resamples, texts))
        np.add.at(self.weights, (np.arange(resamples)[:, None], picks), 1.0)

    def row(self, seeds: list[TextSums]) -> tuple[float, np.ndarray]:
        """A row's perplexity (mean over its seeds) and its value in every resample."""
        point = float(np.mean([s.perplexity() for s in seeds]))
        return point, np.mean([s.perplexity(self.weights) for s in seeds], axis=0)


def interval(resampled: np.ndarray) -> tuple[float, float]:
    """The central LEVEL percentile interval of a statistic's resampled values."""
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(resampled, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class Difference:
    """baseline over model, less 1 (0.2: the baseline's perplexity 20% higher), with its paired interval."""

    estimate: float
    low: float
    high: float


class Evidence:
    """The kept scores behind a report's rows, per row label and split, and the resamples that compare them.

    A row has an interval only when every seed shown has kept scores; otherwise `missing` says which runs lack them
    (made before runs kept scores: `nplm-score RUN --log` attaches them)."""

    def __init__(self, sums: dict[str, dict[str, list[TextSums]]], missing: dict[str, list[str]]) -> None:
        self.sums, self.missing = sums, missing
        self._bootstrap: dict[str, Bootstrap] = {}
        self._texts: dict[str, tuple[int, ...]] = {}
        self._rows: dict[tuple[str, str], tuple[float, np.ndarray]] = {}

    @classmethod
    def read(cls, source: ArchiveSource, table: pd.DataFrame) -> Evidence:
        """The per-text sums of the kept scores of every run shown in `table` (its `label` and space-separated
        `run_ids`)."""
        sums: dict[str, dict[str, list[TextSums]]] = {}
        missing: dict[str, list[str]] = {}
        for row in table.itertuples():
            shown = getattr(row, "run_ids", "")
            run_ids = shown.split() if isinstance(shown, str) and row.status == "finished" else []
            kept = {run_id: source.text_sums(run_id) for run_id in run_ids}
            lacking = [run_id for run_id, found in kept.items() if found is None]
            if lacking:
                missing[row.label] = lacking
            elif run_ids:
                sums[row.label] = {
                    s: [TextSums(tuple(k[s][0].tolist()), k[s][1], k[s][2]) for k in kept.values() if s in k]
                    for s in KEPT_SPLITS
                }
        return cls(sums, missing)

    def describe(self) -> str:
        """How many texts each split resampled, and how often."""
        splits = ", ".join(f"{len(texts)} {split} texts" for split, texts in self._texts.items()) or "no kept scores"
        return f"{splits}, {RESAMPLES:,} resamples, seed {SEED}"

    def has(self, label: str) -> bool:
        return label in self.sums

    def _resampler(self, split: str, texts: tuple[int, ...]) -> Bootstrap:
        if split not in self._bootstrap:
            self._bootstrap[split], self._texts[split] = Bootstrap(len(texts)), texts
        if self._texts[split] != texts:
            raise ValueError(f"rows of one report have different {split} texts: they are not of one data")
        return self._bootstrap[split]

    def _row(self, label: str, split: str) -> tuple[float, np.ndarray]:
        if (label, split) not in self._rows:
            seeds = self.sums[label][split]
            self._rows[label, split] = self._resampler(split, seeds[0].texts).row(seeds)
        return self._rows[label, split]

    def perplexity(self, label: str, split: str) -> tuple[float, float] | None:
        """The row's 95% interval on the split, or None without kept scores."""
        if not self.has(label) or not self.sums[label][split]:
            return None
        return interval(self._row(label, split)[1])

    def compare(self, baseline: str, model: str, split: str = "test") -> Difference | None:
        """Paired: the same resampled texts for both rows. None unless both have kept scores."""
        if not (self.has(baseline) and self.has(model)):
            return None
        (b, b_resampled), (m, m_resampled) = self._row(baseline, split), self._row(model, split)
        return Difference(b / m - 1, *interval(b_resampled / m_resampled - 1))
