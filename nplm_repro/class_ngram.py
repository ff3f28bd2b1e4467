"""Class-based back-off n-gram, the "class-based back-off" rows of Table 1 (PAPER.md section 5).

    P(w_t | w_{t-n+1..t-1}) = P(k(w_t) | k(w_{t-n+1}), ..., k(w_{t-1})) * P(w_t | k(w_t))

- **Word classes k(w)** (Brown et al. 1992) are clustered on the training split by the exchange algorithm
  (Kneser & Ney 1993; Martin, Liermann & Ney 1998), which maximises the same class-bigram likelihood as
  Brown et al.'s agglomerative merging. Start: the c-1 most frequent training words each in a class of
  its own, every other word in the last class. Then, in passes over the words from most to least
  frequent, each word moves to the class that most increases the training likelihood, until a pass moves
  no word (or `max_passes`). A word alone in its class stays, so no class empties. There is no randomness:
  the result depends on the training stream and c only. For one word the gain of every class is a
  handful of numpy operations over the classes of its neighbours (counts are integers, x log x is a
  table lookup), so clustering Brown's 17,113 training words takes about 1 min for c = 500 and 3 min for
  c = 2000 on one loaded core. Why not PyPI's `brown-clustering` (0.1.6, numba): its agglomerative
  merging spends O(V^2) in pure Python plus O(c^2) per word: 5 min for c = 150 here, more for 500 and
  hours for 2000.
- **Clusterings are cached** under `cache_dir` (default `$NPLM_CACHE`, else `~/.cache/nplm_repro`), one
  .npz per (corpus fingerprint, method, c, max_passes), written atomically; the n = 3, 4, 5 rows of c =
  500 share one.
- **The class n-gram** is the project's `ngram.KneserNey` (modified Kneser-Ney, SRILM's back-off) fitted on
  the class stream: a `Corpus` whose tokens are the classes of the word stream, same split bounds, so it
  is counted and scored exactly like the word models (every token a target, stream context, padded with
  the class of `<eot>` before the stream starts; that class is *named* `<eot>` for this reason).
  **Degenerate discounts**: Chen & Goodman's discounts need count-of-counts n1..n4 > 0, and at the class
  unigram level they are all 0 (every class follows hundreds of distinct classes), where SRILM's
  `ngram-count -kndiscount` stops with "one of required modified KneserNey count-of-counts is zero".
  Such an order takes the three discounts of the nearest higher order that has them (the class bigram
  level), which is recorded in `describe()` (`class_kn.1gram.discounts_from`).
- **P(w | class)** is the relative frequency of w among the training tokens of its class. Words never seen
  in training (794 on Brown: the vocabulary counts the whole stream) form one extra class `<unseen>`,
  uniform over its words. It never occurs in training, so the class n-gram gives it the unigram's
  left-over mass (via back-off) like any zeroton: exactly what SRILM does with words that are in the LM's
  vocabulary but in no class, each a zeroton of its own (the probabilities are the same).
- The model is normalised over the vocabulary for any history: the class n-gram over the classes, and
  each class's word distribution.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nplm_repro import ngram
from nplm_repro.corpus import END_OF_TEXT, Corpus
from nplm_repro.errors import NplmError
from nplm_repro.ngram import SRILM_MIN_COUNTS, KneserNey, NgramModel

log = logging.getLogger(__name__)

METHODS = ("exchange",)
UNSEEN_CLASS = "<unseen>"
CACHE_ENV = "NPLM_CACHE"
CACHE_FORMAT = 1  # bump when the algorithm changes what it returns for the same inputs


@dataclass(frozen=True)
class Clustering:
    """Classes of a vocabulary's words and how they were found.

    `classes[w]` is w's class in 0..c-1, or -1 for a word absent from the clustered stream.
    `log_likelihoods[0]` is the natural-log class-bigram likelihood of the stream at the start, then one
    per pass; `moves[p]` is the number of words that changed class in pass p.
    """

    classes: np.ndarray
    method: str
    c: int
    seconds: float
    log_likelihoods: np.ndarray
    moves: np.ndarray
    converged: bool  # the last pass moved no word

    @property
    def passes(self) -> int:
        return len(self.moves)


def _xlogx(limit: int) -> np.ndarray:
    """x log x for x = 0..limit (0 log 0 = 0): the likelihood of integer counts by table lookup."""
    x = np.arange(limit + 1, dtype=np.float64)
    table = np.zeros(limit + 1)
    table[1:] = x[1:] * np.log(x[1:])
    return table


def _adjacency(prev: np.ndarray, nxt: np.ndarray, size: int) -> tuple[np.ndarray, ...]:
    """Bigram counts of distinct word pairs in CSR form, once by first word and once by second word."""
    keys, counts = np.unique(prev * size + nxt, return_counts=True)
    first, second = keys // size, keys % size
    self_loops = np.zeros(size, dtype=np.int64)
    same = first == second
    self_loops[first[same]] = counts[same]
    first, second, counts = first[~same], second[~same], counts[~same]
    succ_ptr = np.concatenate([[0], np.cumsum(np.bincount(first, minlength=size))])
    order = np.lexsort((first, second))
    pred_ptr = np.concatenate([[0], np.cumsum(np.bincount(second, minlength=size))])
    return succ_ptr, second, counts, pred_ptr, first[order], counts[order], self_loops


def exchange_clustering(ids: np.ndarray, vocab_size: int, c: int, max_passes: int = 100) -> Clustering:
    """Exchange algorithm on the class-bigram likelihood of the stream `ids` (see the module docstring).

    Objective (natural log, up to a constant): sum_{g,h} N(g,h) log N(g,h) - sum_g N(g.) log N(g.)
    - sum_h N(.h) log N(.h), N(g,h) counting the bigrams of the stream from class g to class h.
    """
    start = time.perf_counter()
    ids = np.asarray(ids, dtype=np.int64)
    counts = np.bincount(ids, minlength=vocab_size)
    seen = np.flatnonzero(counts)
    by_frequency = seen[np.lexsort((seen, -counts[seen]))]
    size = len(by_frequency)
    if not 1 <= c <= size:
        raise NplmError(f"model.c={c}: the training split has {size:,} distinct words; c must be in 1..{size:,}")
    local = np.full(vocab_size, -1)
    local[by_frequency] = np.arange(size)
    stream = local[ids]
    prev, nxt = stream[:-1], stream[1:]
    succ_ptr, succ, succ_n, pred_ptr, pred, pred_n, self_loops = _adjacency(prev, nxt, size)
    out_n, in_n = np.bincount(prev, minlength=size), np.bincount(nxt, minlength=size)

    cls = np.minimum(np.arange(size), c - 1)  # rank r -> class r; the rest share the last class
    table = _xlogx(len(ids))
    pair = np.bincount(cls[prev] * c + cls[nxt], minlength=c * c).reshape(c, c)  # N(g, h)
    pair_t = pair.T.copy()  # N(h, g): gathering rows of both is faster than columns of one
    left = np.bincount(cls, weights=out_n, minlength=c).astype(np.int64)  # N(g .)
    right = np.bincount(cls, weights=in_n, minlength=c).astype(np.int64)  # N(. h)
    members = np.bincount(cls, minlength=c)
    constant = table[in_n].sum()  # sum_w N(. w) log N(. w): the P(w | class) part, fixed

    def log_likelihood() -> float:
        return float(table[pair].sum() - table[left].sum() - table[right].sum() + constant)

    def move(word: int, to: int, r: np.ndarray, lft: np.ndarray, sign: int) -> None:
        pair[to, :] += sign * r
        pair[:, to] += sign * lft
        pair[to, to] += sign * self_loops[word]
        pair_t[:, to] += sign * r
        pair_t[to, :] += sign * lft
        pair_t[to, to] += sign * self_loops[word]
        left[to] += sign * out_n[word]
        right[to] += sign * in_n[word]

    likelihoods, moves = [log_likelihood()], []
    for p in range(max_passes):
        moved = 0
        for word in range(size):
            old = cls[word]
            if members[old] == 1:
                continue
            span = slice(succ_ptr[word], succ_ptr[word + 1])
            r = np.bincount(cls[succ[span]], weights=succ_n[span], minlength=c).astype(np.int64)
            span = slice(pred_ptr[word], pred_ptr[word + 1])
            lft = np.bincount(cls[pred[span]], weights=pred_n[span], minlength=c).astype(np.int64)
            move(word, old, r, lft, -1)
            # gain[k] = change of the objective if `word` joins class k (row k gains r, column k gains lft,
            # N(k, k) also the word's self-bigrams)
            to_r, to_l = np.flatnonzero(r), np.flatnonzero(lft)
            rows = pair_t[to_r]
            gain = (table[rows + r[to_r, None]] - table[rows]).sum(0)
            rows = pair[to_l]
            gain += (table[rows + lft[to_l, None]] - table[rows]).sum(0)
            diag = np.diagonal(pair)
            gain += table[diag + r + lft + self_loops[word]] - table[diag + r] - table[diag + lft] + table[diag]
            gain -= table[left + out_n[word]] - table[left] + table[right + in_n[word]] - table[right]
            best = int(np.argmax(gain))
            if not gain[best] > gain[old] + 1e-6:  # ties and rounding noise: stay
                best = old
            move(word, best, r, lft, +1)
            if best != old:
                moved += 1
                members[old] -= 1
                members[best] += 1
                cls[word] = best
        likelihoods.append(log_likelihood())
        moves.append(moved)
        log.info(
            "exchange c=%d pass %d: %d words moved, class-bigram training perplexity %.3f",
            c,
            p + 1,
            moved,
            np.exp(-likelihoods[-1] / len(prev)),
        )
        if moved == 0:
            break
    classes = np.full(vocab_size, -1, dtype=np.int64)
    classes[by_frequency] = cls
    return Clustering(
        classes=classes,
        method="exchange",
        c=c,
        seconds=time.perf_counter() - start,
        log_likelihoods=np.array(likelihoods),
        moves=np.array(moves, dtype=np.int64),
        converged=bool(moves) and moves[-1] == 0,
    )


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else $NPLM_CACHE, else ~/.cache/nplm_repro."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or "~/.cache/nplm_repro").expanduser()


def cache_path(corpus: Corpus, c: int, method: str, max_passes: int, cache_dir: str | os.PathLike | None) -> Path:
    return cache_root(cache_dir) / f"classes-{corpus.fingerprint}-{method}-c{c}-passes{max_passes}.npz"


def _load(path: Path, corpus: Corpus, c: int, method: str) -> Clustering | None:
    try:
        with np.load(path) as saved:
            ok = (
                int(saved["format"]) == CACHE_FORMAT
                and str(saved["fingerprint"]) == corpus.fingerprint
                and str(saved["method"]) == method
                and int(saved["c"]) == c
                and saved["classes"].shape == (corpus.vocab_size,)
            )
            if not ok:
                log.warning("%s does not match this corpus and config; clustering again", path)
                return None
            return Clustering(
                classes=saved["classes"].astype(np.int64),
                method=method,
                c=c,
                seconds=float(saved["seconds"]),
                log_likelihoods=saved["log_likelihoods"].astype(np.float64),
                moves=saved["moves"].astype(np.int64),
                converged=bool(saved["converged"]),
            )
    except (OSError, KeyError, ValueError) as error:
        log.warning("cannot read the cached clustering %s (%s); clustering again", path, error)
        return None


def _save(path: Path, clustering: Clustering, corpus: Corpus) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        with open(partial, "wb") as f:
            np.savez(
                f,
                format=CACHE_FORMAT,
                fingerprint=corpus.fingerprint,
                method=clustering.method,
                c=clustering.c,
                classes=clustering.classes,
                seconds=clustering.seconds,
                log_likelihoods=clustering.log_likelihoods,
                moves=clustering.moves,
                converged=clustering.converged,
            )
        os.replace(partial, path)  # atomic: a parallel job sees the old state or the whole file
    except OSError as error:
        log.warning("cannot cache the clustering at %s (%s)", path, error)


def cluster_words(
    corpus: Corpus,
    c: int,
    method: str = "exchange",
    max_passes: int = 100,
    cache: bool = True,
    cache_dir: str | os.PathLike | None = None,
) -> tuple[Clustering, bool]:
    """Classes of the words of the training split (-1: absent from it), and whether they came from the cache."""
    if method not in METHODS:
        raise NplmError(f"model.method={method!r} is not known (known: {', '.join(METHODS)})")
    path = cache_path(corpus, c, method, max_passes, cache_dir)
    if cache and path.exists():
        found = _load(path, corpus, c, method)
        if found is not None:
            log.info("classes from the cache: %s", path)
            return found, True
    start, end = corpus.bounds["train"]
    clustering = exchange_clustering(corpus.ids[start:end].numpy(), corpus.vocab_size, c, max_passes)
    log.info("clustered into %d classes in %.1f s, %d passes", c, clustering.seconds, clustering.passes)
    if cache:
        _save(path, clustering, corpus)
    return clustering, False


@contextlib.contextmanager
def _discount_fallback(borrowed: dict[int, tuple[float, ...]], failed: set[int]) -> Iterator[None]:
    """While fitting a KneserNey: orders in `borrowed` get those discounts; an order whose own cannot be
    estimated is added to `failed` (and gets placeholders, to be replaced by a second fit)."""
    estimate = ngram.kn_discounts

    def discounts(count: np.ndarray, level: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        if level in borrowed:
            return tuple(int((count == r).sum()) for r in (1, 2, 3, 4)), borrowed[level]
        try:
            return estimate(count, level)
        except NplmError:
            failed.add(level)
            return (0, 0, 0, 0), (1.0, 1.0, 1.0)

    ngram.kn_discounts = discounts
    try:
        yield
    finally:
        ngram.kn_discounts = estimate


def fit_class_kneser_ney(
    classes: Corpus, n: int, interpolate: bool, min_counts: Sequence[int]
) -> tuple[KneserNey, dict[int, int]]:
    """ngram.KneserNey on a class stream; orders whose discounts cannot be estimated take those of the
    nearest higher order that has them. Returns the model and {order: order its discounts come from}."""
    failed: set[int] = set()
    with _discount_fallback({}, failed):
        model = KneserNey(n, interpolate, min_counts).fit(classes)
    if not failed:
        return model, {}
    sources: dict[int, int] = {}
    for level in sorted(failed):
        higher = [h for h in range(level + 1, n + 1) if h not in failed]
        if not higher:
            raise NplmError(
                f"class n-gram: modified Kneser-Ney discounts cannot be estimated at order {level} nor above "
                f"(too few classes or tokens)"
            )
        sources[level] = higher[0]
    borrowed = {level: tuple(model.stats[src][d] for d in ("D1", "D2", "D3+")) for level, src in sources.items()}
    with _discount_fallback(borrowed, set()):
        model = KneserNey(n, interpolate, min_counts).fit(classes)
    return model, sources


class ClassBackoff(NgramModel):
    """P(w | h) = P_KN(class(w) | classes of h) * P(w | class(w)); see the module docstring.

    n: order; c: number of classes of training words (plus `<unseen>` if some vocabulary words never occur
    in training); interpolate, min_counts: as ngram.KneserNey, for the class n-gram; method, max_passes:
    the clustering (exchange, passes until no word moves or max_passes); cache, cache_dir: the clustering
    cache (cache_dir None = $NPLM_CACHE or ~/.cache/nplm_repro).
    """

    def __init__(
        self,
        n: int = 3,
        c: int = 500,
        interpolate: bool = False,
        min_counts: Sequence[int] = SRILM_MIN_COUNTS,
        method: str = "exchange",
        max_passes: int = 100,
        cache: bool = True,
        cache_dir: str | None = None,
    ) -> None:
        if n < 2:
            raise NplmError(f"model.n={n}: a class-based back-off n-gram needs n >= 2")
        if c < 1:
            raise NplmError(f"model.c={c}: the number of classes must be >= 1")
        if method not in METHODS:
            raise NplmError(f"model.method={method!r} is not known (known: {', '.join(METHODS)})")
        if max_passes < 0:
            raise NplmError(f"model.max_passes={max_passes}: must be >= 0")
        self.order, self.c, self.interpolate, self.min_counts = n, c, interpolate, tuple(min_counts)
        self.method, self.max_passes, self.cache, self.cache_dir = method, max_passes, cache, cache_dir

    def fit(self, corpus: Corpus) -> ClassBackoff:
        self.clustering, self.cached = cluster_words(
            corpus, self.c, self.method, self.max_passes, self.cache, self.cache_dir
        )
        unseen = self.clustering.classes < 0
        self.unseen_words = int(unseen.sum())
        self.word_class = np.where(unseen, self.c, self.clustering.classes)  # [V] class of every word
        names = [f"class{k}" for k in range(self.c)] + ([UNSEEN_CLASS] if self.unseen_words else [])
        names[self.word_class[corpus.vocab.index(END_OF_TEXT)]] = END_OF_TEXT  # the stream's padding
        self.class_names = tuple(names)
        self.class_corpus = Corpus(
            f"{corpus.name}-classes",
            self.class_names,
            torch.from_numpy(self.word_class[corpus.ids.numpy()]),
            dict(corpus.bounds),
            dict(corpus.counts),
        )
        self.class_model, self.discounts_from = fit_class_kneser_ney(
            self.class_corpus, self.order, self.interpolate, self.min_counts
        )
        start, end = corpus.bounds["train"]
        words = np.bincount(corpus.ids[start:end].numpy(), minlength=corpus.vocab_size).astype(np.float64)
        per_class = np.bincount(self.word_class, weights=words, minlength=len(names))
        if self.unseen_words:  # uniform over <unseen>
            words[unseen] = 1.0
            per_class[self.c] = float(self.unseen_words)
        self.word_given_class = words / per_class[self.word_class]
        self.vocab_size, self.train_tokens = corpus.vocab_size, end - start
        self.fingerprint = corpus.fingerprint
        return self

    def class_rows(self, rows: np.ndarray) -> np.ndarray:
        """The windows with every word replaced by its class."""
        return self.word_class[rows]

    def window_probs(self, rows: np.ndarray) -> np.ndarray:
        return self.class_model.window_probs(self.class_rows(rows)) * self.word_given_class[rows[:, -1]]

    def describe(self) -> dict[str, object]:
        clustering = self.clustering
        per_token = self.train_tokens - 1  # bigrams of the training stream
        info: dict[str, object] = {
            "model": "class_based_" + ("interpolated" if self.interpolate else "backoff"),
            "order": self.order,
            "classes": self.c,
            "interpolate": self.interpolate,
            "min_counts": ",".join(map(str, self.class_model.min_counts)),
            "vocab_size": self.vocab_size,
            "train_tokens": self.train_tokens,
            "unseen_words": self.unseen_words,
            "clustering.method": clustering.method,
            "clustering.seconds": round(clustering.seconds, 2),
            "clustering.cached": self.cached,
            "clustering.passes": clustering.passes,
            "clustering.max_passes": self.max_passes,
            "clustering.converged": clustering.converged,
            "clustering.moves": " ".join(map(str, clustering.moves.tolist())),
            "clustering.train_bigram_ppl_start": float(np.exp(-clustering.log_likelihoods[0] / per_token)),
            "clustering.train_bigram_ppl": float(np.exp(-clustering.log_likelihoods[-1] / per_token)),
        }
        for level, stats in self.class_model.stats.items():
            for name, value in stats.items():
                info[f"class_kn.{level}gram.{name.replace('+', 'plus')}"] = value
        for level, source in self.discounts_from.items():
            info[f"class_kn.{level}gram.discounts_from"] = f"{source}gram"
        return {k: v.item() if isinstance(v, np.generic) else v for k, v in info.items()}
