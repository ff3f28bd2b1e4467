"""The n-gram baselines of Table 1 (paper §4.1, pp. 1147-1148): deleted-interpolation trigram, modified Kneser-Ney.

Both see the data exactly as the neural models do, so perplexities compare token for token: every token of
a split is a target, its context is the n-1 tokens before it in the stream (`windows.windows`, padded with
`<eot>` only before the stream starts), and the same vocabulary with `<unk>` as an ordinary word. Counts
come from the windows of the training span, one n-gram per training token.

Word sequences of any length get dense ids level by level (`GramIndex`), so every statistic below is an
np.bincount or a fancy index over those ids: no Python loop over tokens or n-grams, and no key overflow
(V^5 > 2^63 forbids packing a 5-gram into one int64).
The file is longer than most here because both models are built on that one index and scored the same way;
split apart, each half would need the other.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from nplm_repro.baselines.em import MixtureFit, fit_mixture, mixture_probs
from nplm_repro.data.corpus import END_OF_TEXT, Corpus
from nplm_repro.data.splits import SPLITS
from nplm_repro.data.windows import windows
from nplm_repro.errors import NplmError
from nplm_repro.family import Family, Job, Recorded, Tokens
from nplm_repro.perplexity import perplexity_of
from nplm_repro.rules import Rule, at_least
from nplm_repro.scores import KEPT_SPLITS, Scores

# ngram-count's defaults -gt1min 1 -gt2min 1 -gt3min 2 (and 2 for every higher order): with -kndiscount
# they drop the n-grams of order >= 3 whose (modified) count is 1, their mass going to the back-off.
SRILM_MIN_COUNTS = (1, 1, 2)


def split_windows(corpus: Corpus, split: str, n: int) -> np.ndarray:
    """[size, n] int64 rows (w_{t-n+1}, ..., w_t) for every token t of the split, as every model scores."""
    start, end = corpus.bounds[split]
    return windows(corpus.ids, start, end, n, corpus.vocab.index(END_OF_TEXT)).numpy()


@dataclass(frozen=True)
class Codes:
    """Ids of the sequences around each token: `targets[L]` = its L words ending at w_t (L = 0..n),
    `contexts[L]` = the L words before it (L = 0..n-1); level 0 is the empty sequence (id 0) and -1
    marks a sequence never seen in training."""

    targets: list[np.ndarray]
    contexts: list[np.ndarray]


class GramIndex:
    """Dense ids for the sequences of 1..n words seen in training windows (as targets or as contexts).

    An L-gram's key is (its oldest word) * size(L-1) + (id of its newest L-1 words), which stays below
    V * size(L-1) for any n; its level-L id is its rank among the sorted keys. Level 1 is the whole
    vocabulary (id = word), so a word absent from training still has an id with count 0.
    """

    def __init__(self, rows: np.ndarray, vocab_size: int) -> None:
        n = rows.shape[1]
        self.order = n
        self.tables = [np.zeros(1, dtype=np.int64), np.arange(vocab_size, dtype=np.int64)]
        target, context = rows[:, -1], rows[:, -2]
        for level in range(2, n + 1):
            keys = [self._keys(level, rows[:, n - level], target)]
            if level < n:
                keys.append(self._keys(level, rows[:, n - 1 - level], context))
            self.tables.append(np.unique(np.concatenate(keys)))
            target = np.searchsorted(self.tables[level], keys[0])
            if level < n:
                context = np.searchsorted(self.tables[level], keys[1])

    def size(self, level: int) -> int:
        return len(self.tables[level])

    def suffix(self, level: int) -> np.ndarray:
        """For each level-L id, the id of its newest L-1 words (the next lower order's n-gram)."""
        return self.tables[level] % self.size(level - 1)

    def _keys(self, level: int, oldest: np.ndarray, newer: np.ndarray) -> np.ndarray:
        return oldest.astype(np.int64) * self.size(level - 1) + newer

    def _find(self, level: int, oldest: np.ndarray, newer: np.ndarray) -> np.ndarray:
        table, keys = self.tables[level], self._keys(level, oldest, newer)
        at = np.searchsorted(table, keys).clip(max=len(table) - 1)
        return np.where((newer >= 0) & (table[at] == keys), at, -1)

    def encode(self, rows: np.ndarray) -> Codes:
        """Ids of every suffix of each row's target n-gram and of its context (-1 if unseen)."""
        n = self.order
        if rows.shape[1] != n:
            raise NplmError(f"rows of {rows.shape[1]} words for an index of order {n}")
        empty = np.zeros(len(rows), dtype=np.int64)
        targets, contexts = [empty], [empty]
        for level in range(1, n + 1):
            targets.append(self._find(level, rows[:, n - level], targets[-1]))
            if level < n:
                contexts.append(self._find(level, rows[:, n - 1 - level], contexts[-1]))
        return Codes(targets, contexts)


class NgramModel(Family):
    """A counted family (nplm_repro/family.py): `fit(corpus)` counts on its training split, then a probability for
    every token of a split (`window_probs` of each token's window of `order` ids)."""

    order: int
    colour = "C1"
    fingerprint: str | None = None

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        return {"model.n": at_least(2)}

    @classmethod
    def fit_run(cls, cfg: Any, corpus: Corpus, logger: Any, job: Job) -> tuple[dict[str, float], Scores]:
        return fit_ngram(cfg, corpus, logger)

    @classmethod
    def score_run(cls, run: Recorded, tokens: Tokens) -> np.ndarray:
        model = cls.counted(run)
        return np.log(model.window_probs(tokens.rows(model.order)))

    @classmethod
    def reach(cls, run: Recorded) -> int:
        return cls.counted(run).order - 1

    @staticmethod
    def counted(run: Recorded) -> NgramModel:
        """The run's model counted again (counting is deterministic), once per rebuilt run."""
        return run.memo("counted", lambda: instantiate(run.cfg.model, _convert_="all").fit(run.corpus))

    def fit(self, corpus: Corpus) -> NgramModel:
        raise NotImplementedError

    def window_probs(self, rows: np.ndarray) -> np.ndarray:
        """P(w_t | w_{t-n+1..t-1}) for each row (w_{t-n+1}, ..., w_t) of an int array [M, order]."""
        raise NotImplementedError

    def describe(self) -> dict[str, object]:
        """Flat {name: value} of what was counted and fitted, for MLflow params."""
        raise NotImplementedError

    def _windows(self, corpus: Corpus, split: str) -> np.ndarray:
        if self.fingerprint is None:
            raise NplmError(f"{type(self).__name__} must be fitted before scoring")
        if corpus.fingerprint != self.fingerprint:
            raise NplmError(f"{type(self).__name__} was fitted on another corpus (fingerprint {self.fingerprint})")
        return split_windows(corpus, split, self.order)

    def token_probs(self, corpus: Corpus, split: str) -> np.ndarray:
        """float64 [size of split]: the probability of every token of the split given its stream context."""
        return self.window_probs(self._windows(corpus, split))

    def perplexity(self, corpus: Corpus, split: str) -> float:
        return perplexity_of(self.token_probs(corpus, split))


class DeletedInterpolation(NgramModel):
    """The paper's "Del. Int." trigram (Jelinek-Mercer): P = sum_i alpha_i(q_t) p_i, i = 0..3.

    p0 = 1/|V|; p1, p2, p3 are the unigram, bigram, trigram relative frequencies in training. The paper
    leaves open what a relative frequency is when its context never occurs in training:
    - unseen="lower" (default): it takes the next lower order's value (p3 := p2, p2 := p1), so every
      component, hence P, is a distribution over the vocabulary for every context. In the bin of unseen
      trigram contexts p3 = p2, so there only alpha_2 + alpha_3 is identified (EM keeps their 1:1 start).
    - unseen="zero": it is 0 and the bin's weights learn to rely on lower orders. A context whose last
      word is absent from training (possible: the vocabulary counts the whole stream) then gets total
      mass below 1. This is how the corpus's independent reference numbers were measured (tests/test_ngram.py).

    The weights depend on the bin q_t = ceil(-ln((1 + c(w_{t-2}, w_{t-1})) / T)) of the context's training
    count (footnote 4; T training tokens; natural log, the base being unstated: 15 bins on Brown, of
    which 5..14 occur), and are fitted by EM on the validation split, which is not counted. A bin with
    no validation token keeps uniform weights.
    """

    family = "deleted_interpolation"
    label = "Del. Int."

    order = 3

    def __init__(self, n: int = 3, unseen: str = "lower", tol: float = 1e-6, max_iter: int = 1000) -> None:
        if n != 3:
            raise NplmError(f"model.n={n}: deleted interpolation is the paper's trigram, n = 3")
        if unseen not in ("lower", "zero"):
            raise NplmError(f"DeletedInterpolation: unseen must be 'lower' or 'zero', not {unseen!r}")
        self.unseen, self.tol, self.max_iter = unseen, tol, max_iter

    def fit(self, corpus: Corpus) -> DeletedInterpolation:
        rows = split_windows(corpus, "train", 3)
        self.vocab_size, self.train_tokens = corpus.vocab_size, len(rows)
        self.index = GramIndex(rows, corpus.vocab_size)
        codes = self.index.encode(rows)
        self.counts = [np.bincount(codes.targets[lv], minlength=self.index.size(lv)) for lv in range(4)]
        self.context_counts = [np.bincount(codes.contexts[lv], minlength=self.index.size(lv)) for lv in range(3)]
        self.n_bins = int(self._bins(np.zeros(1))[0]) + 1  # a never-seen context has the largest bin
        self.fingerprint = corpus.fingerprint
        valid = self._windows(corpus, "valid")
        self.mixture: MixtureFit = fit_mixture(
            self.window_components(valid), self.window_bins(valid), self.n_bins, self.tol, self.max_iter
        )
        return self

    def _bins(self, context_count: np.ndarray) -> np.ndarray:
        return np.ceil(-np.log((1.0 + context_count) / self.train_tokens)).clip(min=0).astype(np.int64)

    def window_bins(self, rows: np.ndarray) -> np.ndarray:
        """q_t of each row: the bin of its two-word context's training count."""
        context = self.index.encode(rows).contexts[2]
        return self._bins(np.where(context >= 0, self.context_counts[2][context], 0))

    def window_components(self, rows: np.ndarray) -> np.ndarray:
        """[M, 4] float64: p0, p1, p2, p3 of each row's target."""
        codes = self.index.encode(rows)
        columns = [np.full(len(rows), 1.0 / self.vocab_size)]
        for level in (1, 2, 3):
            target, context = codes.targets[level], codes.contexts[level - 1]
            seen = np.where(context >= 0, self.context_counts[level - 1][context], 0)
            hits = np.where(target >= 0, self.counts[level][target], 0)
            fallback = columns[-1] if self.unseen == "lower" else 0.0
            columns.append(np.where(seen > 0, hits / np.maximum(seen, 1), fallback))
        return np.stack(columns, 1)

    def window_probs(self, rows: np.ndarray) -> np.ndarray:
        return mixture_probs(self.window_components(rows), self.mixture.weights, self.window_bins(rows))

    def token_bins(self, corpus: Corpus, split: str) -> np.ndarray:
        """int64 [size of split]: q_t of every token, to mix another model with this one per bin."""
        return self.window_bins(self._windows(corpus, split))

    def components(self, corpus: Corpus, split: str) -> np.ndarray:
        """float64 [size of split, 4]: p0..p3 of every token of the split."""
        return self.window_components(self._windows(corpus, split))

    def describe(self) -> dict[str, object]:
        fit = self.mixture
        info: dict[str, object] = {
            "model": "deleted_interpolation",
            "order": 3,
            "unseen": self.unseen,
            "vocab_size": self.vocab_size,
            "train_tokens": self.train_tokens,
            "bins": self.n_bins,
            "em.tol": self.tol,
            "em.iterations": fit.iterations,
            "em.converged": bool(fit.converged),
            "em.valid_log_likelihood": float(fit.log_likelihoods[-1]),
        }
        for level in (1, 2, 3):
            info[f"{level}gram.types"] = int((self.counts[level] > 0).sum())
        for q in np.flatnonzero(fit.tokens_per_bin):
            info[f"alpha.q{q:02d}"] = " ".join(f"{w:.4f}" for w in fit.weights[q])
            info[f"valid_tokens.q{q:02d}"] = int(fit.tokens_per_bin[q])
        return info


def kn_discounts(count: np.ndarray, level: int) -> tuple[tuple[int, ...], tuple[float, float, float]]:
    """Count-of-counts n1..n4 of one order's counts and its D1, D2, D3+ (Chen & Goodman, eq. 26)."""
    n1, n2, n3, n4 = (int((count == r).sum()) for r in (1, 2, 3, 4))
    if min(n1, n2, n3, n4) == 0:
        raise NplmError(f"Kneser-Ney order {level}: count-of-counts n1..n4 = {n1, n2, n3, n4} has a 0; too little data")
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    if min(d) < 0:
        raise NplmError(f"Kneser-Ney order {level}: negative discount {d} from count-of-counts {n1, n2, n3, n4}")
    return (n1, n2, n3, n4), d


class KneserNey(NgramModel):
    """Modified Kneser-Ney n-gram (Chen & Goodman 1999) as SRILM's `ngram-count -kndiscount` builds it.

    At each order the highest uses raw counts, lower orders continuation counts (number of distinct words
    seen before the n-gram); three discounts D1, D2, D3+ per order come from that order's count-of-counts.
    An n-gram is explicit if its count reaches the order's min count (`min_counts[order-1]`, the last
    value repeating; SRILM's defaults drop singletons of order >= 3, their mass going to the back-off;
    `min_counts=(1,)` keeps everything). Explicit: p = (c - D(c)) / c(h), plus, with `interpolate` (SRILM's
    `-interpolate`), gamma(h) p_lower with gamma(h) = sum_w D(c(h w)) / c(h) over all counted w. Any other
    word backs off: p = bow(h) p_lower, bow(h) = (1 - sum p(w|h)) / (1 - sum p_lower(w|h)) over the
    explicit w, which normalises every context exactly. Unigrams: the leftover mass goes uniformly to the
    words with no unigram count (never seen in training: the vocabulary counts the whole stream), or to
    all words if there are none, as SRILM's `distributeProb` does; with `interpolate` the explicit
    unigrams are interpolated with 1/|V|, which comes to the same thing.
    Not reproduced: SRILM's fix-ups for degenerate contexts (no back-off mass left), which need
    discounts of 0 and do not occur here.
    """

    family = "kneser_ney"
    label = "Kneser-Ney back-off"

    def __init__(
        self,
        n: int = 3,
        interpolate: bool = False,
        min_counts: Sequence[int] = SRILM_MIN_COUNTS,
        borrow_discounts: bool = False,
    ) -> None:
        if n < 2:
            raise NplmError(f"model.n={n}: Kneser-Ney needs n >= 2")
        self.order, self.interpolate, self.borrow_discounts = n, interpolate, borrow_discounts
        self.min_counts = tuple(max(1, min_counts[min(i, len(min_counts) - 1)]) for i in range(n))

    def fit(self, corpus: Corpus) -> KneserNey:
        n, rows = self.order, split_windows(corpus, "train", self.order)
        self.vocab_size, self.train_tokens = corpus.vocab_size, len(rows)
        self.index = GramIndex(rows, corpus.vocab_size)
        codes = self.index.encode(rows)
        sizes = [self.index.size(level) for level in range(n + 1)]
        raw = [np.bincount(codes.targets[level], minlength=sizes[level]) for level in range(n + 1)]
        self.stats: dict[int, dict[str, object]] = {}
        self.probs: dict[int, np.ndarray] = {}  # level -> p of each explicit n-gram id (0 elsewhere)
        self.explicit: dict[int, np.ndarray] = {}
        self.bows: dict[int, np.ndarray] = {}  # level -> bow of each context id (of level - 1)
        counts = {n: raw[n]}  # continuation counts below the top order: distinct words seen before the n-gram
        counts |= {
            lv: np.bincount(self.index.suffix(lv + 1)[raw[lv + 1] > 0], minlength=sizes[lv]) for lv in range(1, n)
        }
        discounts, self.discounts_from = self._discounts(counts)
        full = np.array([1.0 / self.vocab_size])  # order 0: uniform; `full` = P of every id of the level
        for level in range(1, n + 1):
            count = counts[level]
            context = np.full(sizes[level], -1)
            context[codes.targets[level]] = codes.contexts[level - 1]
            lower = full[self.index.suffix(level)]
            counts_of_counts, d = discounts[level]
            discount = np.array([0.0, *d])[np.minimum(count, 3)]
            counted, keep = count > 0, count >= self.min_counts[level - 1]
            total = np.bincount(context[counted], weights=count[counted], minlength=sizes[level - 1])
            prob = np.zeros(sizes[level])
            prob[keep] = (count - discount)[keep] / total[context[keep]]
            if self.interpolate:
                mass = np.bincount(context[counted], weights=discount[counted], minlength=sizes[level - 1])
                prob[keep] += mass[context[keep]] / total[context[keep]] * lower[keep]
            self.stats[level] = dict(zip(("n1", "n2", "n3", "n4", "D1", "D2", "D3+"), (*counts_of_counts, *d)))
            self.stats[level] |= {"types": int(counted.sum()), "ngrams": int(keep.sum())}
            if level == 1:
                left, zero = 1.0 - prob.sum(), ~keep
                full = np.where(keep, prob, left / zero.sum()) if zero.any() else prob + left / self.vocab_size
                self.unigram = full
                self.stats[1]["zerotons"] = int(zero.sum())
            else:
                spent = np.bincount(context[keep], weights=prob[keep], minlength=sizes[level - 1])
                spent_lower = np.bincount(context[keep], weights=lower[keep], minlength=sizes[level - 1])
                bow = (1.0 - spent) / (1.0 - spent_lower)
                full = np.where(keep, prob, np.where(context >= 0, bow[context], 0.0) * lower)
                self.probs[level], self.explicit[level], self.bows[level] = prob, keep, bow
        self.fingerprint = corpus.fingerprint
        return self

    def _discounts(self, counts: dict[int, np.ndarray]) -> tuple[dict[int, tuple], dict[int, int]]:
        """D1, D2, D3+ of every order, and {order: order it borrowed from} when `borrow_discounts`.

        Chen & Goodman's estimate needs count-of-counts n1..n4 > 0, which fails where every type is seen
        often (a class unigram follows hundreds of distinct classes; SRILM stops there with "one of required
        modified KneserNey count-of-counts is zero"). With `borrow_discounts` such an order takes the
        discounts of the nearest higher order that has them; otherwise the error stands.
        """
        found: dict[int, tuple] = {}
        for level, count in counts.items():
            try:
                found[level] = kn_discounts(count, level)
            except NplmError:
                if not self.borrow_discounts:
                    raise
        sources: dict[int, int] = {}
        for level in sorted(set(counts) - set(found)):
            higher = [h for h in sorted(found) if h > level]
            if not higher:
                raise NplmError(
                    f"Kneser-Ney: discounts cannot be estimated at order {level} nor above (too little data)"
                )
            sources[level] = higher[0]
            coc = tuple(int((counts[level] == r).sum()) for r in (1, 2, 3, 4))
            found[level] = (coc, found[higher[0]][1])
        return found, sources

    def window_probs(self, rows: np.ndarray) -> np.ndarray:
        """Back-off scoring, lowest order first: keep the explicit probability, else bow(h) * the lower one."""
        codes = self.index.encode(rows)
        p = self.unigram[rows[:, -1]]
        for level in range(2, self.order + 1):
            target, context = codes.targets[level], codes.contexts[level - 1]
            explicit = (target >= 0) & self.explicit[level][target]
            bow = np.where(context >= 0, self.bows[level][context], 1.0)
            p = np.where(explicit, self.probs[level][target], bow * p)
        return p

    def describe(self) -> dict[str, object]:
        info: dict[str, object] = {
            "model": "kneser_ney_" + ("interpolated" if self.interpolate else "backoff"),
            "order": self.order,
            "interpolate": self.interpolate,
            "min_counts": ",".join(map(str, self.min_counts)),
            **{f"{level}gram.discounts_from": f"{src}gram" for level, src in self.discounts_from.items()},
            "vocab_size": self.vocab_size,
            "train_tokens": self.train_tokens,
        }
        for level, stats in self.stats.items():
            info |= {f"{level}gram.{name}": value for name, value in stats.items()}
        return info


def fit_ngram(cfg: DictConfig, corpus: Corpus, logger: Logger) -> tuple[dict[str, float], Scores]:
    """Count on train (weights by EM on valid where the model has them), score every split; returns the metrics and
    the kept scores of valid and test."""
    model: NgramModel = instantiate(cfg.model, _convert_="all")
    start = time.perf_counter()
    model.fit(corpus)
    metrics = {"fit_seconds": time.perf_counter() - start}
    kept = {}
    for split in SPLITS:
        probs = model.token_probs(corpus, split)
        metrics[f"{split}_ppl"] = perplexity_of(probs)
        metrics[f"{split}_tokens"] = float(corpus.size(split))
        if split in KEPT_SPLITS:
            kept[split] = np.log(probs)
    metrics["score_seconds"] = time.perf_counter() - start - metrics["fit_seconds"]
    logger.log_hyperparams({f"fit.{k}".replace("+", "plus"): v for k, v in model.describe().items()})
    logger.log_metrics(metrics)
    return metrics, Scores.of(corpus.text_names(), kept, {s: corpus.text_ids(s) for s in kept})
