"""The class-based back-off n-gram: exchange clustering, its cache, and P(w | h) = P(class | classes) P(w | class)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import composed
from hydra.utils import instantiate

from nplm_repro.baselines.class_ngram import ClassBackoff
from nplm_repro.baselines.ngram import KneserNey, split_windows
from nplm_repro.cache import CACHE_ENV, cache_root
from nplm_repro.data.brown import prepare_brown
from nplm_repro.data.clustering import ClassBigrams, cache_path, cluster_words, exchange_clustering
from nplm_repro.data.corpus import END_OF_TEXT, UNK, Corpus
from nplm_repro.errors import NplmError
from nplm_repro.tracking.config_checks import check_config

C = 30  # classes on the small slice


@pytest.fixture(scope="module")
def small(brown_path: Path) -> Corpus:
    return prepare_brown(str(brown_path), train=30_000, valid=6_000, test=6_000)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One clustering cache for the module: the small slice is clustered once, every order reuses it."""
    return tmp_path_factory.mktemp("classes")


@pytest.fixture(scope="module")
def fitted(small: Corpus, cache: Path) -> ClassBackoff:
    return ClassBackoff(n=3, c=C, cache_dir=str(cache)).fit(small)


def train_ids(corpus: Corpus) -> np.ndarray:
    start, end = corpus.bounds["train"]
    return corpus.ids[start:end].numpy()


def class_bigram_log_likelihood(ids: np.ndarray, classes: np.ndarray) -> float:
    """sum_t log P(g_t | g_{t-1}) P(w_t | g_t), relative frequencies over the stream's bigrams, token by token."""
    prev, nxt = ids[:-1], ids[1:]
    g, h = classes[prev], classes[nxt]
    k = int(classes.max()) + 1
    pair, before = np.bincount(g * k + h, minlength=k * k), np.bincount(g, minlength=k)
    after_word, after_class = np.bincount(nxt), np.bincount(h, minlength=k)
    return float(np.log(pair[g * k + h] / before[g] * after_word[nxt] / after_class[h]).sum())


def starting_classes(ids: np.ndarray, vocab_size: int, c: int) -> np.ndarray:
    """The documented start: the c-1 most frequent words alone (ties: lower id first), the rest in class c-1."""
    counts = Counter(ids.tolist())
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    classes = np.full(vocab_size, -1)
    for rank, word in enumerate(ranked):
        classes[word] = min(rank, c - 1)
    return classes


def all_words_after(corpus: Corpus, context: np.ndarray) -> np.ndarray:
    return np.column_stack([np.tile(context, (corpus.vocab_size, 1)), np.arange(corpus.vocab_size)])


def unseen_in_training(corpus: Corpus) -> np.ndarray:
    return np.flatnonzero(np.bincount(train_ids(corpus), minlength=corpus.vocab_size) == 0)


# --- the exchange clustering ---------------------------------------------------------------------------


def test_clustering_is_deterministic_and_gives_every_training_word_one_class(small):
    ids = train_ids(small)
    first = exchange_clustering(ids, small.vocab_size, C, max_passes=2)
    second = exchange_clustering(ids.copy(), small.vocab_size, C, max_passes=2)
    np.testing.assert_array_equal(first.classes, second.classes)
    np.testing.assert_array_equal(first.log_likelihoods, second.log_likelihoods)
    assert first.classes.shape == (small.vocab_size,)
    seen = np.bincount(ids, minlength=small.vocab_size) > 0
    assert ((first.classes >= 0) & (first.classes < C))[seen].all()
    assert (first.classes[~seen] == -1).all() and (~seen).sum() > 0
    assert np.array_equal(np.unique(first.classes[seen]), np.arange(C))  # no class left empty
    assert first.moves[0] > 0  # it did move words: the comparison is not between two starting points


def test_exchange_never_lowers_the_class_bigram_likelihood(fitted, small):
    clustering, ids = fitted.clustering, train_ids(small)
    assert clustering.converged and clustering.passes >= 2
    steps = np.diff(clustering.log_likelihoods)
    assert (steps[:-1] > 0).all() and steps[-1] == 0  # the last pass moved no word
    start = starting_classes(ids, small.vocab_size, C)
    assert clustering.log_likelihoods[0] == pytest.approx(class_bigram_log_likelihood(ids, start), rel=1e-10)
    final = clustering.log_likelihoods[-1]
    assert final == pytest.approx(class_bigram_log_likelihood(ids, clustering.classes), rel=1e-10)
    assert final > clustering.log_likelihoods[0] + 1000.0


def spread_words(ids: np.ndarray, vocab_size: int, how_many: int) -> list[int]:
    """Words of the stream from the most frequent to the rarest, about evenly on a log scale of rank."""
    counts = np.bincount(ids, minlength=vocab_size)
    seen = np.flatnonzero(counts)
    by_frequency = seen[np.argsort(-counts[seen], kind="stable")]
    return by_frequency[np.unique(np.geomspace(1, len(by_frequency), how_many).astype(int)) - 1].tolist()


def test_predicted_gain_of_every_move_is_the_likelihood_change(fitted, small):
    ids = train_ids(small)
    for classes in (starting_classes(ids, small.vocab_size, C), fitted.clustering.classes):
        state = ClassBigrams(ids, classes, C)
        base = class_bigram_log_likelihood(ids, classes)
        assert state.log_likelihood() == pytest.approx(base, rel=1e-10)
        for word in spread_words(ids, small.vocab_size, 8):
            brute = []
            for k in range(C):
                moved = classes.copy()
                moved[word] = k
                brute.append(class_bigram_log_likelihood(ids, moved) - base)
            np.testing.assert_allclose(state.gains(word), brute, rtol=0, atol=1e-5)
        assert state.log_likelihood() == pytest.approx(base, rel=1e-10)  # gains() moved nothing


def test_converged_clustering_is_a_local_optimum_of_single_word_moves(fitted, small):
    ids, classes = train_ids(small), fitted.clustering.classes
    best = class_bigram_log_likelihood(ids, classes)
    sizes = np.bincount(classes[classes >= 0], minlength=C)
    words = [w for w in spread_words(ids, small.vocab_size, 16) if sizes[classes[w]] > 1]
    assert len(words) >= 10
    for word in words:
        for k in range(C):
            if k != classes[word]:
                moved = classes.copy()
                moved[word] = k
                assert class_bigram_log_likelihood(ids, moved) <= best + 1e-5


def test_more_classes_than_training_words_is_refused(small):
    with pytest.raises(NplmError, match=r"^100000 classes of [\d,]+ distinct words: the number of classes must be"):
        ClassBackoff(c=100_000, cache=False).fit(small)


# --- the cache ----------------------------------------------------------------------------------------


def test_cache_returns_the_same_classes(small, tmp_path):
    fresh, cached = cluster_words(small, 12, max_passes=3, cache_dir=tmp_path)
    path = cache_path(small, 12, "exchange", 3, tmp_path)
    assert not cached and path.exists()
    again, cached = cluster_words(small, 12, max_passes=3, cache_dir=tmp_path)
    assert cached
    np.testing.assert_array_equal(again.classes, fresh.classes)
    np.testing.assert_array_equal(again.log_likelihoods, fresh.log_likelihoods)
    assert (again.seconds, again.passes, again.converged) == (fresh.seconds, fresh.passes, fresh.converged)
    # the key has the corpus fingerprint, c and the passes: any other is clustered afresh
    assert cache_path(small, 13, "exchange", 3, tmp_path) != path
    assert cache_path(small, 12, "exchange", 4, tmp_path) != path
    other = prepare_brown_slice(small, train=20_000)
    assert cache_path(other, 12, "exchange", 3, tmp_path) != path
    # a file that is not a clustering of this corpus is ignored (clustered again and replaced)
    path.write_bytes(b"not an npz")
    redone, cached = cluster_words(small, 12, max_passes=3, cache_dir=tmp_path)
    assert not cached
    np.testing.assert_array_equal(redone.classes, fresh.classes)
    assert cluster_words(small, 12, max_passes=3, cache_dir=tmp_path)[1]


def prepare_brown_slice(corpus: Corpus, train: int) -> Corpus:
    """The same stream with another training span (so another fingerprint)."""
    valid = corpus.bounds["valid"][1] - corpus.bounds["valid"][0]
    bounds = {"train": (0, train), "valid": (train, train + valid), "test": (train + valid, train + 2 * valid)}
    return Corpus(corpus.name, corpus.vocab, corpus.ids, bounds, corpus.counts)


def test_cache_directory_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "given") == tmp_path / "given"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_root() == Path("~/.cache/nplm_repro").expanduser()


# --- the model ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("order", "interpolate", "min_counts"), [(3, False, (1, 1, 2)), (2, False, (1,)), (4, True, (1,))]
)
def test_distribution_sums_to_one_over_the_vocabulary(small, cache, order, interpolate, min_counts):
    model = ClassBackoff(n=order, c=C, interpolate=interpolate, min_counts=min_counts, cache_dir=str(cache)).fit(small)
    valid = split_windows(small, "valid", order)
    unseen = unseen_in_training(small)
    unk, eot = small.vocab.index(UNK), small.vocab.index(END_OF_TEXT)
    contexts = [valid[i, :-1] for i in (0, 1, 2, 777, 4321)]
    contexts += [np.full(order - 1, unseen[0]), np.full(order - 1, unk), np.full(order - 1, eot)]
    contexts += [np.array([unk, unseen[-1], eot][: order - 1])]
    for context in contexts:
        probs = model.window_probs(all_words_after(small, context))
        assert (probs > 0).all()  # words never seen in training and <unk> included
        assert probs.sum() == pytest.approx(1.0, abs=1e-9)


def test_probability_is_class_ngram_times_word_given_class_by_hand(brown_path, tmp_path):
    """On a slice where every class order has its own discounts, the model is plain KneserNey on the class
    stream times relative frequencies counted here."""
    corpus = prepare_brown(str(brown_path), train=3_000, valid=1_500, test=1_000, max_unk_freq=0)
    model = ClassBackoff(n=3, c=300, cache_dir=str(tmp_path)).fit(corpus)
    assert model.discounts_from == {}
    word_class = model.word_class
    ids = corpus.ids.numpy()
    start, end = corpus.bounds["train"]
    names = [f"k{k}" for k in range(word_class.max() + 1)]
    names[word_class[corpus.vocab.index(END_OF_TEXT)]] = END_OF_TEXT
    classes = Corpus("by-hand", tuple(names), torch.tensor([word_class[w] for w in ids]), corpus.bounds, {})
    class_model = KneserNey(3).fit(classes)
    train = Counter(ids[start:end].tolist())
    unseen = [w for w in range(corpus.vocab_size) if train[w] == 0]
    assert unseen and all(word_class[w] == 300 for w in unseen)

    def word_given_class(w: int) -> float:
        if train[w] == 0:
            return 1 / len(unseen)
        return train[w] / sum(train[v] for v in train if word_class[v] == word_class[w])

    rows = split_windows(corpus, "valid", 3)
    picked = [0, 1, 2, 100, 999] + [i for i in range(len(rows)) if train[rows[i, -1]] == 0][:3]
    for i in picked:
        row = rows[i]
        expected = class_model.window_probs(word_class[row][None])[0] * word_given_class(row[-1])
        assert model.window_probs(row[None])[0] == pytest.approx(expected, rel=1e-12)


def test_class_unigram_discounts_are_borrowed_from_the_class_bigram_level(fitted, small):
    """Every class follows many distinct classes: no class unigram has continuation count 1..4, so modified
    Kneser-Ney has no discounts of its own there (KneserNey refuses unless told to borrow) and takes the bigram level's."""
    with pytest.raises(NplmError, match="order 1"):
        KneserNey(3).fit(fitted.class_corpus)
    assert KneserNey(3, borrow_discounts=True).fit(fitted.class_corpus).discounts_from == {1: 2}
    stats = fitted.class_model.stats
    assert (stats[1]["n1"], stats[1]["n2"], stats[1]["n3"], stats[1]["n4"]) == (0, 0, 0, 0)
    assert fitted.discounts_from == {1: 2}
    assert [stats[1][d] for d in ("D1", "D2", "D3+")] == [stats[2][d] for d in ("D1", "D2", "D3+")]
    assert fitted.describe()["class_kn.1gram.discounts_from"] == "2gram"


def test_scoring_another_corpus_is_refused(fitted, small):
    with pytest.raises(NplmError, match="another corpus"):
        fitted.token_probs(prepare_brown_slice(small, train=20_000), "valid")


def test_describe_is_flat_with_valid_mlflow_param_names(fitted, small, cache):
    info = fitted.describe()
    assert all(re.fullmatch(r"[A-Za-z0-9_\-. /]+", key) for key in info)
    assert all(isinstance(v, (str, int, float, bool)) for v in info.values())
    assert info["classes"] == C and info["order"] == 3 and info["clustering.method"] == "exchange"
    assert info["clustering.converged"] is True
    assert info["clustering.train_bigram_ppl"] < info["clustering.train_bigram_ppl_start"]
    assert info["unseen_words"] == len(unseen_in_training(small)) > 0
    assert "class_kn.3gram.D3plus" in info
    again = ClassBackoff(n=3, c=C, cache_dir=str(cache)).fit(small)  # the same clustering, from the cache
    assert again.describe()["clustering.cached"] is True
    assert again.describe()["clustering.seconds"] == info["clustering.seconds"]


# --- configs ------------------------------------------------------------------------------------------

CLASS_ROWS = {
    "class_n3_c150": (3, 150),
    "class_n3_c200": (3, 200),
    "class_n3_c500": (3, 500),
    "class_n3_c1000": (3, 1000),
    "class_n3_c2000": (3, 2000),
    "class_n4_c500": (4, 500),
    "class_n5_c500": (5, 500),
}


@pytest.mark.parametrize("row", list(CLASS_ROWS))
def test_experiment_files_set_the_class_based_rows(row):
    cfg = composed(f"experiment={row}")
    check_config(cfg)
    model = instantiate(cfg.model, _convert_="all")
    assert cfg.row == "class-based back-off"
    assert isinstance(model, ClassBackoff) and (model.order, model.c) == CLASS_ROWS[row]
    assert not model.interpolate and model.min_counts == (1, 1, 2) and model.method == "exchange"


# valid / test perplexity measured with this implementation on the full Brown stream
CLASS_FULL_BROWN = {(3, 500): (334.49, 309.59)}


@pytest.mark.slow
@pytest.mark.parametrize(("order", "c"), list(CLASS_FULL_BROWN))
def test_class_based_backoff_on_full_brown_is_near_the_papers_numbers(brown, tmp_path, order, c):
    """Table 1, p. 1149 (SRILM classes and smoothing, a slightly different vocabulary): n=3, c=500: 326 / 312."""
    model = ClassBackoff(n=order, c=c, cache_dir=str(tmp_path)).fit(brown)
    valid, test = model.perplexity(brown, "valid"), model.perplexity(brown, "test")
    assert (valid, test) == pytest.approx(CLASS_FULL_BROWN[order, c], abs=0.06)
    assert abs(valid / 326 - 1) < 0.05 and abs(test / 312 - 1) < 0.05
