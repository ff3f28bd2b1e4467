"""Word classes for the class-based back-off rows of Table 1 (p. 1149): the exchange algorithm and its cache.

- **Word classes k(w)** (Brown et al. 1992) are clustered on the training split by the exchange algorithm
  (Kneser & Ney 1993; Martin, Liermann & Ney 1998), which maximises the same class-bigram likelihood as
  Brown et al.'s agglomerative merging. Start: the c-1 most frequent training words each in a class of
  its own, every other word in the last class. Then, in passes over the words from most to least
  frequent, each word moves to the class that most increases the training likelihood, until a pass moves
  no word (or `max_passes`). A word alone in its class stays, so no class empties. There is no randomness:
  the result depends on the training stream and c only. For one word the gain of every class is a
  handful of numpy operations over the classes of its neighbours (counts are integers, x log x is a
  table lookup). Brown's 17,113 training words, one core: 30 s of CPU for c = 150, 40 s for c = 500,
  90 s for c = 2000 (20 to 30 passes). Why not PyPI's `brown-clustering` (0.1.6, numba): its
  agglomerative merging spends O(V^2) in pure Python plus O(c^2) per word: about 5 min for c = 150,
  and by extrapolation half an hour for c = 500 and hours for c = 2000.
- **Clusterings are cached** under `cache_dir` (default `$NPLM_CACHE`, else `~/.cache/nplm_repro`), one
  .npz per (corpus fingerprint, method, c, max_passes), written atomically; the n = 3, 4, 5 rows of c =
  500 share one.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nplm_repro.cache import cache_root
from nplm_repro.data.corpus import Corpus
from nplm_repro.errors import NplmError

log = logging.getLogger(__name__)

METHODS = ("exchange",)
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
    seconds: float  # wall-clock
    cpu_seconds: float  # CPU time of the process: comparable on a loaded machine
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
    """Bigram counts of distinct word pairs (self-pairs apart) in CSR form, by first and by second word."""
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


class ClassBigrams:
    """The class-bigram counts N(g, h) of a word stream under a word -> class map, kept exact as single words
    change class, and the exact change of the class-bigram log-likelihood that moving a word would make.

    Log-likelihood (natural log) of the stream's bigrams under P(h | g) P(w | h), all relative frequencies:
    sum_{g,h} N(g,h) log N(g,h) - sum_g N(g.) log N(g.) - sum_h N(.h) log N(.h) + sum_w N(.w) log N(.w).
    `classes[w]` must be in 0..c-1 for every word of the stream (-1 for words absent from it).
    """

    def __init__(self, ids: np.ndarray, classes: np.ndarray, c: int) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        self.c, self.classes = c, np.array(classes, dtype=np.int64)
        if self.classes[ids].min() < 0 or self.classes.max() >= c:
            raise NplmError(f"every word of the stream needs a class in 0..{c - 1}")
        size, prev, nxt = len(self.classes), ids[:-1], ids[1:]
        adjacency = _adjacency(prev, nxt, size)
        self.succ_ptr, self.succ, self.succ_n, self.pred_ptr, self.pred, self.pred_n, self.self_loops = adjacency
        self.out_n, self.in_n = np.bincount(prev, minlength=size), np.bincount(nxt, minlength=size)
        self.table = _xlogx(len(ids))  # counts are integers: x log x by lookup
        g, h = self.classes[prev], self.classes[nxt]
        self.pair = np.bincount(g * c + h, minlength=c * c).reshape(c, c)  # N(g, h)
        self.pair_t = self.pair.T.copy()  # N(h, g): gathering rows of both is faster than columns of one
        self.left = np.bincount(g, minlength=c)  # N(g .)
        self.right = np.bincount(h, minlength=c)  # N(. h)
        self.members = np.bincount(self.classes[self.classes >= 0], minlength=c)
        self.constant = self.table[self.in_n].sum()  # the P(w | class) numerators: no move changes them

    def log_likelihood(self) -> float:
        t = self.table
        return float(t[self.pair].sum() - t[self.left].sum() - t[self.right].sum() + self.constant)

    def neighbours(self, word: int) -> tuple[np.ndarray, np.ndarray]:
        """Over the classes: bigram counts from `word` to each class, and from each class to `word` (self-pairs apart)."""
        span = slice(self.succ_ptr[word], self.succ_ptr[word + 1])
        to = np.bincount(self.classes[self.succ[span]], weights=self.succ_n[span], minlength=self.c)
        span = slice(self.pred_ptr[word], self.pred_ptr[word + 1])
        came = np.bincount(self.classes[self.pred[span]], weights=self.pred_n[span], minlength=self.c)
        return to.astype(np.int64), came.astype(np.int64)

    def _shift(self, word: int, k: int, to: np.ndarray, came: np.ndarray, sign: int) -> None:
        """Add (sign +1) or remove (-1) the bigrams of `word` to/from class k's row and column."""
        loops = sign * self.self_loops[word]
        self.pair[k, :] += sign * to
        self.pair[:, k] += sign * came
        self.pair[k, k] += loops
        self.pair_t[:, k] += sign * to
        self.pair_t[k, :] += sign * came
        self.pair_t[k, k] += loops
        self.left[k] += sign * self.out_n[word]
        self.right[k] += sign * self.in_n[word]

    def _insertion_gains(self, word: int, to: np.ndarray, came: np.ndarray) -> np.ndarray:
        """For `word` removed from every class: the log-likelihood change of inserting it into each class k
        (row k gains `to`, column k gains `came`, N(k, k) also the word's self-pairs)."""
        t = self.table
        cols, rows = np.flatnonzero(to), np.flatnonzero(came)
        block = self.pair_t[cols]  # block[j, k] = N(k, cols[j])
        gain = (t[block + to[cols, None]] - t[block]).sum(0)
        block = self.pair[rows]  # block[j, k] = N(rows[j], k)
        gain += (t[block + came[rows, None]] - t[block]).sum(0)
        diag = np.diagonal(self.pair)  # both sums above counted N(k, k) once each: make it one joint change
        gain += t[diag + to + came + self.self_loops[word]] - t[diag + to] - t[diag + came] + t[diag]
        gain -= t[self.left + self.out_n[word]] - t[self.left] + t[self.right + self.in_n[word]] - t[self.right]
        return gain

    def gains(self, word: int) -> np.ndarray:
        """The change of the log-likelihood if `word` moved to each class (0 for its own); nothing moves."""
        old = self.classes[word]
        to, came = self.neighbours(word)
        self._shift(word, old, to, came, -1)
        gain = self._insertion_gains(word, to, came)
        self._shift(word, old, to, came, +1)
        return gain - gain[old]

    def improve(self, word: int, tolerance: float = 1e-6) -> bool:
        """Move `word` to the class that raises the log-likelihood most, if by more than `tolerance` and its
        class keeps a word; whether it moved."""
        old = self.classes[word]
        if self.members[old] == 1:
            return False
        to, came = self.neighbours(word)
        self._shift(word, old, to, came, -1)
        gain = self._insertion_gains(word, to, came)
        best = int(np.argmax(gain))
        if not gain[best] > gain[old] + tolerance:  # ties and rounding noise: stay
            best = old
        self._shift(word, best, to, came, +1)
        if best == old:
            return False
        self.classes[word] = best
        self.members[old] -= 1
        self.members[best] += 1
        return True


def starting_classes(ids: np.ndarray, vocab_size: int, c: int) -> np.ndarray:
    """The c-1 most frequent words of the stream each alone (ties: lower id first), the others in class c-1;
    -1 for words absent from the stream."""
    counts = np.bincount(ids, minlength=vocab_size)
    seen = np.flatnonzero(counts)
    if not 1 <= c <= len(seen):
        raise NplmError(
            f"{c} classes of {len(seen):,} distinct words: the number of classes must be in 1..{len(seen):,}"
        )
    classes = np.full(vocab_size, -1, dtype=np.int64)
    classes[seen[np.lexsort((seen, -counts[seen]))]] = np.minimum(np.arange(len(seen)), c - 1)
    return classes


def exchange_clustering(ids: np.ndarray, vocab_size: int, c: int, max_passes: int = 100) -> Clustering:
    """Exchange algorithm on the class-bigram likelihood of the stream `ids` (see the module docstring):
    from `starting_classes`, passes over the words from most to least frequent, each moving to its best
    class, until a pass moves no word or `max_passes`."""
    start, cpu_start = time.perf_counter(), time.process_time()
    ids = np.asarray(ids, dtype=np.int64)
    state = ClassBigrams(ids, starting_classes(ids, vocab_size, c), c)
    counts = np.bincount(ids, minlength=vocab_size)
    seen = np.flatnonzero(counts)
    by_frequency = seen[np.lexsort((seen, -counts[seen]))].tolist()
    likelihoods, moves = [state.log_likelihood()], []
    for p in range(max_passes):
        moves.append(sum(state.improve(word) for word in by_frequency))
        likelihoods.append(state.log_likelihood())
        log.info(
            "exchange c=%d pass %d: %d words moved, class-bigram training perplexity %.3f",
            c,
            p + 1,
            moves[-1],
            np.exp(-likelihoods[-1] / (len(ids) - 1)),
        )
        if moves[-1] == 0:
            break
    return Clustering(
        classes=state.classes,
        method="exchange",
        c=c,
        seconds=time.perf_counter() - start,
        cpu_seconds=time.process_time() - cpu_start,
        log_likelihoods=np.array(likelihoods),
        moves=np.array(moves, dtype=np.int64),
        converged=bool(moves) and moves[-1] == 0,
    )


def cache_path(corpus: Corpus, c: int, method: str, max_passes: int, cache_dir: str | os.PathLike | None) -> Path:
    """The cache file of one clustering: everything the classes depend on is in its name."""
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
                cpu_seconds=float(saved["cpu_seconds"]),
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
                cpu_seconds=clustering.cpu_seconds,
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
    log.info(
        "clustered into %d classes in %.1f s (%.1f s CPU), %d passes",
        c,
        clustering.seconds,
        clustering.cpu_seconds,
        clustering.passes,
    )
    if cache:
        _save(path, clustering, corpus)
    return clustering, False


OUTPUT_METHODS = ("exchange", "frequency")  # model.class_method of a word-class output layer


def frequency_bins(counts: np.ndarray, c: int) -> np.ndarray:
    """Mikolov et al.'s (2011) classes, as their RNNLM toolkit assigns them: words from most to least frequent (ties:
    lower id first) fill class 0, 1, ... in turn, a class closing once the words so far hold (class + 1) / c of the
    training tokens. Frequent words sit in small classes, rare ones in large; fewer than c when a word alone holds
    more than a share."""
    total = max(1, int(counts.sum()))
    classes = np.empty(len(counts), dtype=np.int64)
    current, seen = 0, 0
    for word in np.lexsort((np.arange(len(counts)), -counts)):
        seen += int(counts[word])
        classes[word] = current
        if seen / total > (current + 1) / c and current < c - 1:
            current += 1
    return classes


def output_classes(corpus: Corpus, c: int, method: str) -> np.ndarray:
    """The class of every word of the vocabulary for a word-class output layer (§5.2 of the paper), classes
    0..c'-1 all non-empty (c' <= c): `exchange`, the class-based back-off's clustering (cached), a word absent from
    training joining the largest class; `frequency`, `frequency_bins` of the training counts."""
    if method not in OUTPUT_METHODS:
        raise NplmError(f"model.class_method={method!r} is not known (known: {', '.join(OUTPUT_METHODS)})")
    start, end = corpus.bounds["train"]
    if method == "frequency":
        found = frequency_bins(np.bincount(corpus.ids[start:end].numpy(), minlength=corpus.vocab_size), c)
    else:
        found = cluster_words(corpus, c)[0].classes.copy()
        found[found < 0] = np.bincount(found[found >= 0]).argmax()
    return np.unique(found, return_inverse=True)[1].astype(np.int64)  # renumbered: no empty class
