"""The n-gram baselines and the EM mixture: hand computations on tiny streams, brute force on a Brown-format
corpus (tests/data/tiny_brown.zip), and the reference perplexities on the real Brown."""

from __future__ import annotations

from collections import Counter, defaultdict
from fractions import Fraction as F
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from nplm_repro.baselines.em import fit_mixture, mixture_probs
from nplm_repro.baselines.ngram import DeletedInterpolation, GramIndex, KneserNey, split_windows
from nplm_repro.data.brown import prepare_brown
from nplm_repro.data.corpus import END_OF_TEXT, UNK, Corpus
from nplm_repro.data.splits import split_bounds
from nplm_repro.errors import NplmError


def tiny_corpus(train: str, valid: str, test: str) -> Corpus:
    """A corpus from whitespace-separated words; vocabulary = its words (sorted), then <eot>, <unk>."""
    words = f"{train} {valid} {test}".split()
    vocab = (*sorted(set(words) - {END_OF_TEXT}), END_OF_TEXT, UNK)
    ids = torch.tensor([vocab.index(w) for w in words])
    return Corpus("tiny", vocab, ids, split_bounds(len(words), len(train.split()), len(valid.split()), None))


def rows_of(corpus: Corpus, *windows: str) -> np.ndarray:
    return np.array([[corpus.vocab.index(w) for w in window.split()] for window in windows])


@pytest.fixture(scope="module")
def small(tiny_brown_path: Path) -> Corpus:
    """About 11k tokens in Brown's format (synthetic): every n-gram order has counts of 1, 2, 3 and 4."""
    return prepare_brown(str(tiny_brown_path), train=4_000, valid=4_400, test=2_000)


@pytest.fixture(scope="module")
def full(brown: Corpus) -> Corpus:
    """The full Brown stream (conftest's session fixture)."""
    return brown


# --- EM -----------------------------------------------------------------------------------------------


def random_components(seed: int, tokens: int = 3000, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.random((tokens, k)) ** 3  # skewed, some near 0
    probs[rng.random((tokens, k)) < 0.2] = 0.0
    probs[:, 0] = np.maximum(probs[:, 0], 1e-3)  # every token possible under component 0
    return probs, rng.integers(0, 4, tokens)


def test_em_never_lowers_likelihood():
    probs, bins = random_components(0)
    fit = fit_mixture(probs, bins, tol=0.0, max_iter=200)  # tol 0: until the likelihood stops moving at all
    steps = np.diff(fit.log_likelihoods)
    assert len(fit.log_likelihoods) == fit.iterations + 1 > 10
    assert (steps >= -1e-12 * abs(fit.log_likelihoods[-1])).all()
    assert fit.log_likelihoods[-1] > fit.log_likelihoods[0] + 1.0
    np.testing.assert_allclose(fit.weights.sum(1), 1.0, atol=1e-12)
    assert fit.log_likelihoods[-1] == pytest.approx(np.log(mixture_probs(probs, fit.weights, bins)).sum())


def test_em_reaches_the_maximum_likelihood_weight():
    probs, _ = random_components(1, k=2)
    fit = fit_mixture(probs, tol=1e-12)
    grid = np.linspace(0.0, 1.0, 2001)[1:-1]
    likelihoods = np.log(probs[:, :1] * grid + probs[:, 1:] * (1 - grid)).sum(0)
    assert fit.converged
    assert fit.weights[0, 0] == pytest.approx(grid[np.argmax(likelihoods)], abs=1e-3)
    assert fit.log_likelihoods[-1] >= likelihoods.max() - 1e-9


def test_em_fits_each_bin_on_its_own_tokens():
    probs, bins = random_components(2)
    together = fit_mixture(probs, bins, tol=0.0, max_iter=10)
    for b in range(4):
        alone = fit_mixture(probs[bins == b], tol=0.0, max_iter=10)
        assert alone.iterations == together.iterations == 10
        np.testing.assert_allclose(together.weights[b], alone.weights[0], rtol=1e-12)
    assert together.tokens_per_bin.tolist() == np.bincount(bins).tolist()


def test_fixed_half_mixture_is_the_average():
    probs, _ = random_components(3, k=2)
    np.testing.assert_allclose(mixture_probs(probs, np.array([0.5, 0.5])), probs.mean(1), rtol=1e-15)


# --- deleted interpolation ----------------------------------------------------------------------------

# train a b a b c <eot> a b: T = 8; counts c(a) = c(b) = 3, c(c) = c(<eot>) = 1; as contexts a: 3 (always
# followed by b), b: 2 (a, c), c: 1, <eot>: 2 (one of them the padding before the stream);
# trigram contexts (a b): 2 (-> a, -> c), (b a): 1 (-> b), (b c): 1 (-> <eot>), (c b) never.
TINY_DI = ("a b a b c <eot> a b", "a b c b", "a c")


def test_deleted_interpolation_matches_hand_computation():
    corpus = tiny_corpus(*TINY_DI)
    model = DeletedInterpolation().fit(corpus)
    p0 = 1 / 5
    assert model.n_bins == 4  # ceil(ln 8) = 3
    #   window (w_{t-2}, w_{t-1}, w_t) -> p1, p2, p3, q = ceil(-ln((1 + c(w_{t-2} w_{t-1})) / 8))
    np.testing.assert_allclose(
        model.components(corpus, "valid"),
        [
            [p0, 3 / 8, 1 / 2, 1 / 2],  # (a b a): q = ceil(-ln 3/8) = 1
            [p0, 3 / 8, 1, 1],  # (b a b): q = ceil(-ln 2/8) = 2
            [p0, 1 / 8, 1 / 2, 1 / 2],  # (a b c): q = 1
            [p0, 3 / 8, 0, 0],
        ],  # (b c b): q = 2
    )
    assert model.token_bins(corpus, "valid").tolist() == [1, 2, 1, 2]
    # (c b a): context (c b) unseen, q = ceil(-ln 1/8) = 3, p3 falls back to p2; (b a c): seen, q = 2
    np.testing.assert_allclose(model.components(corpus, "test"), [[p0, 3 / 8, 1 / 2, 1 / 2], [p0, 1 / 8, 0, 0]])
    assert model.token_bins(corpus, "test").tolist() == [3, 2]
    zero = DeletedInterpolation(unseen="zero").fit(corpus)
    np.testing.assert_allclose(zero.components(corpus, "test")[0], [p0, 3 / 8, 1 / 2, 0])

    weights, components = model.mixture.weights, model.components(corpus, "valid")
    expected = (weights[[1, 2, 1, 2]] * components).sum(1)
    np.testing.assert_allclose(model.token_probs(corpus, "valid"), expected, rtol=1e-14)
    np.testing.assert_allclose(weights[3], 0.25)  # no validation token in bin 3: weights stay uniform
    assert model.mixture.tokens_per_bin.tolist() == [0, 2, 2, 0]


def unseen_in_training(corpus: Corpus) -> int:
    start, end = corpus.bounds["train"]
    return int(np.flatnonzero(np.bincount(corpus.ids[start:end].numpy(), minlength=corpus.vocab_size) == 0)[0])


def all_words_after(corpus: Corpus, context: np.ndarray) -> np.ndarray:
    return np.column_stack([np.tile(context, (corpus.vocab_size, 1)), np.arange(corpus.vocab_size)])


def test_deleted_interpolation_distribution_sums_to_one(small):
    model = DeletedInterpolation().fit(small)
    valid = split_windows(small, "valid", 3)
    unseen = unseen_in_training(small)
    contexts = [valid[i, :2] for i in (0, 1, 500, 4321)] + [np.array([valid[7, 0], unseen])]
    for context in contexts:
        assert model.window_probs(all_words_after(small, context)).sum() == pytest.approx(1.0, abs=1e-12)
    # with zero components, a context ending in a word never seen in training loses p2 and p3's mass
    zero = DeletedInterpolation(unseen="zero").fit(small)
    assert zero.window_probs(all_words_after(small, contexts[-1])).sum() < 0.99


def test_deleted_interpolation_reproduces_reference_perplexities(full):
    """The Brown corpus's reference numbers (shipped beside it): 31.9 / 358.9 / 332.6, measured by an independent implementation (zeros)."""
    zero = DeletedInterpolation(unseen="zero").fit(full)
    assert [round(zero.perplexity(full, s), 1) for s in ("train", "valid", "test")] == [31.9, 358.9, 332.6]
    lower = DeletedInterpolation().fit(full)
    assert [round(lower.perplexity(full, s)) for s in ("train", "valid", "test")] == [32, 356, 330]
    assert 10 <= lower.mixture.iterations < 1000 and lower.mixture.converged


# --- modified Kneser-Ney ------------------------------------------------------------------------------

# train a b a b a b a b c b d b e c e c e b d c (20 tokens; <eot> before it):
#   bigram counts: (a b) 4, (b a) 3, (b d) (e c) (c e) 2, (<eot> a) (b c) (c b) (d b) (b e) (e b) (d c) 1
#       -> n1..n4 = 7, 3, 1, 1
#   continuation counts (distinct words before): a {<eot>, b} 2, b {a, c, d, e} 4, c {b, e, d} 3, d {b} 1,
#       e {b, c} 2, <eot> and <unk> 0 -> n1..n4 = 1, 2, 1, 1; total 12
TINY_KN = ("a b a b a b a b c b d b e c e c e b d c", "b a", "b b")


def test_discounts_from_count_of_counts():
    model = KneserNey(n=2, min_counts=(1,)).fit(tiny_corpus(*TINY_KN))
    # Y = n1 / (n1 + 2 n2); D1 = 1 - 2Y n2/n1; D2 = 2 - 3Y n3/n2; D3+ = 3 - 4Y n4/n3
    y2, y1 = F(7, 13), F(1, 5)
    bigram = (1 - 2 * y2 * F(3, 7), 2 - 3 * y2 * F(1, 3), 3 - 4 * y2)  # 7/13, 19/13, 11/13
    unigram = (1 - 2 * y1 * 2, 2 - 3 * y1 * F(1, 2), 3 - 4 * y1)  # 1/5, 17/10, 11/5
    for level, counts, discounts in ((2, (7, 3, 1, 1), bigram), (1, (1, 2, 1, 1), unigram)):
        stats = model.stats[level]
        assert (stats["n1"], stats["n2"], stats["n3"], stats["n4"]) == counts
        assert (stats["D1"], stats["D2"], stats["D3+"]) == pytest.approx([float(d) for d in discounts], rel=1e-14)


def test_kneser_ney_matches_hand_computation():
    corpus = tiny_corpus(*TINY_KN)
    rows = rows_of(corpus, "b a", "b d", "b b", f"b {END_OF_TEXT}")
    # unigrams (c - D) / 12: a 1/40, b 3/20, c 1/15, d 1/15, e 1/40 (sum 1/3); the other 2/3 goes to the
    # two zerotons <eot> and <unk>. After b (a 3, c 1, d 2, e 1; total 7): p(a|b) = (3 - 11/13)/7 = 4/13,
    # p(d|b) = (2 - 19/13)/7 = 1/13, p(c|b) = p(e|b) = 6/91 (sum 47/91);
    # bow(b) = (1 - 47/91) / (1 - (1/40 + 1/15 + 1/15 + 1/40)) = 2640/4459
    backoff = KneserNey(n=2, min_counts=(1,)).fit(corpus)
    bow = F(2640, 4459)
    expected = [F(4, 13), F(1, 13), bow * F(3, 20), bow * F(1, 3)]
    np.testing.assert_allclose(backoff.window_probs(rows), [float(p) for p in expected], rtol=1e-13)
    # interpolated: gamma(b) = (D1*2 + D2*1 + D3*1)/7 = 44/91; unigram gamma = (D1*1 + D2*2 + D3*2)/12 = 2/3
    interpolated = KneserNey(n=2, interpolate=True, min_counts=(1,)).fit(corpus)
    uniform = F(2, 3) / 7
    expected = [
        F(4, 13) + F(44, 91) * (F(1, 40) + uniform),
        F(1, 13) + F(44, 91) * (F(1, 15) + uniform),
        F(44, 91) * (F(3, 20) + uniform),
        F(44, 91) * uniform,
    ]
    np.testing.assert_allclose(interpolated.window_probs(rows), [float(p) for p in expected], rtol=1e-13)


KN_VARIANTS = [(3, False, (1, 1, 2)), (3, True, (1, 1, 2)), (4, False, (1,)), (5, False, (1, 1, 2)), (5, True, (1,))]


@pytest.mark.parametrize(("order", "interpolate", "min_counts"), KN_VARIANTS)
def test_kneser_ney_distribution_sums_to_one(small, order, interpolate, min_counts):
    model = KneserNey(order, interpolate, min_counts).fit(small)
    valid = split_windows(small, "valid", order)
    unseen = unseen_in_training(small)
    contexts = [valid[i, :-1] for i in (0, 1, 2, 500, 4321, -1)]
    contexts += [np.full(order - 1, unseen), np.full(order - 1, small.vocab.index(END_OF_TEXT))]
    for context in contexts:
        assert model.window_probs(all_words_after(small, context)).sum() == pytest.approx(1.0, abs=1e-9)


def slow_kneser_ney(train: list[int], pad: int, vocab_size: int, n: int, interpolate: bool, min_counts):
    """Straightforward dictionary version of the same model, one n-gram at a time."""
    padded = [pad] * (n - 1) + train
    raw = {k: Counter(tuple(padded[i - k + 1 : i + 1]) for i in range(n - 1, len(padded))) for k in range(1, n + 1)}
    counts = {n: raw[n]} | {k: Counter(g[1:] for g in raw[k + 1]) for k in range(1, n)}
    discount, total, mass, explicit, children = {}, defaultdict(int), defaultdict(float), {}, defaultdict(list)
    for k, c in counts.items():
        n1, n2, n3, n4 = (sum(v == r for v in c.values()) for r in (1, 2, 3, 4))
        y = n1 / (n1 + 2 * n2)
        discount[k] = {1: 1 - 2 * y * n2 / n1, 2: 2 - 3 * y * n3 / n2, 3: 3 - 4 * y * n4 / n3}
        explicit[k] = {g for g, v in c.items() if v >= min_counts[min(k - 1, len(min_counts) - 1)]}
        for g, v in c.items():
            total[g[:-1]] += v
            mass[g[:-1]] += discount[k][min(v, 3)]
            if g in explicit[k]:
                children[g[:-1]].append(g)

    @cache
    def prob(g: tuple) -> float:
        k, h = len(g), g[:-1]
        lower = prob(g[1:]) if k > 1 else 1 / vocab_size
        if g in explicit[k]:
            p = (counts[k][g] - discount[k][min(counts[k][g], 3)]) / total[h]
            return p + mass[h] / total[h] * lower if interpolate else p
        if k == 1:
            zerotons = vocab_size - len(explicit[1])
            return (1 - sum(prob(u) for u in explicit[1])) / zerotons
        return bow(h) * lower

    @cache
    def bow(h: tuple) -> float:
        return (1 - sum(prob(g) for g in children[h])) / (1 - sum(prob(g[1:]) for g in children[h]))

    return lambda row: prob(tuple(int(w) for w in row))


@pytest.mark.parametrize(("order", "interpolate", "min_counts"), KN_VARIANTS)
def test_kneser_ney_vectorised_scoring_matches_slow_computation(small, order, interpolate, min_counts):
    model = KneserNey(order, interpolate, min_counts).fit(small)
    start, end = small.bounds["train"]
    slow = slow_kneser_ney(
        small.ids[start:end].tolist(), small.vocab.index(END_OF_TEXT), small.vocab_size, order, interpolate, min_counts
    )
    rows = np.concatenate([split_windows(small, "train", order)[:50], split_windows(small, "valid", order)[:200]])
    np.testing.assert_allclose(model.window_probs(rows), [slow(row) for row in rows], rtol=1e-10)


def test_gram_ids_are_exact_for_five_grams_over_a_large_vocabulary():
    """V^5 > 2^63: ids must tell apart 5-grams that any packing into one int64 would have to merge."""
    rng = np.random.default_rng(0)
    vocab_size = 30_000
    rows = rng.choice([0, 1, vocab_size - 2, vocab_size - 1], size=(5000, 5))
    ids = GramIndex(rows, vocab_size).encode(rows).targets[5]
    _, groups = np.unique(rows, axis=0, return_inverse=True)
    assert (ids >= 0).all()
    assert len(np.unique(ids)) == groups.max() + 1
    assert (np.unique(np.column_stack([ids, groups.ravel()]), axis=0).shape[0]) == groups.max() + 1
    other = rows.copy()
    other[:, 0] = 2  # a word never seen in that position: the 5-gram is unknown
    assert (GramIndex(rows, vocab_size).encode(other).targets[5] == -1).all()


# --- both models --------------------------------------------------------------------------------------


def test_scoring_another_corpus_is_refused(small):
    model = DeletedInterpolation().fit(tiny_corpus(*TINY_DI))
    with pytest.raises(NplmError, match="another corpus"):
        model.token_probs(small, "valid")


# valid / test perplexity measured with this implementation (SRILM's default cutoffs)
KN_FULL_BROWN = {
    (3, False): (346.0, 325.0),
    (3, True): (331.7, 309.9),
    (5, False): (347.6, 326.0),
    (5, True): (329.6, 307.6),
}


@pytest.mark.slow
@pytest.mark.parametrize(("order", "interpolate"), list(KN_FULL_BROWN))
def test_kneser_ney_on_full_brown_is_near_srilm_numbers(full, order, interpolate):
    """Table 1, p. 1149 (SRILM, a slightly different vocabulary): valid/test 334/323 (n=3), 332/321 (n=5)."""
    model = KneserNey(order, interpolate).fit(full)
    valid, test = model.perplexity(full, "valid"), model.perplexity(full, "test")
    assert (valid, test) == pytest.approx(KN_FULL_BROWN[order, interpolate], abs=0.06)
    assert abs(valid / (334 if order == 3 else 332) - 1) < 0.05 and abs(test / (323 if order == 3 else 321) - 1) < 0.05
