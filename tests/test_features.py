"""model.features: the fixed word features (models/features.py) are what they say, and stay fixed in training."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import scipy.linalg
import torch
from helpers import composed
from omegaconf import open_dict

from nplm_repro.data.brown import prepare_brown
from nplm_repro.data.windows import loader
from nplm_repro.models.features import cooccurrence, lsi_features
from nplm_repro.models.training import build_module
from nplm_repro.tracking.keys import config_key, model_key


def test_cooccurrence_counts_each_pair_within_the_window_on_both_sides() -> None:
    """ids 0 1 2 0, window 1: the pairs (0,1) (1,2) (2,0), each both ways; log(1 + count)."""
    counts = cooccurrence(np.array([0, 1, 2, 0]), vocab_size=4, window=1).toarray()
    expected = np.zeros((4, 4))
    for a, b in [(0, 1), (1, 2), (2, 0)]:
        expected[a, b] += 1
        expected[b, a] += 1
    np.testing.assert_allclose(counts, np.log1p(expected))
    wider = cooccurrence(np.array([0, 1, 2, 0]), vocab_size=4, window=2).toarray()
    assert wider[0, 2] == pytest.approx(math.log(1 + 2))  # 0 . 2 at distance 2, and 2 0 at distance 1
    assert wider[0, 0] == pytest.approx(math.log(1 + 0))  # the two 0s are 3 apart


def test_fixed_lsi_spans_the_top_singular_subspace_of_its_counts(tiny_brown_path: Path) -> None:
    corpus = prepare_brown(str(tiny_brown_path), train=3000, valid=500, test=700)
    start, end = corpus.bounds["train"]
    ids, m = corpus.ids[start:end].numpy(), 8
    features = lsi_features(ids, corpus.vocab_size, window=2, m=m, seed=1).double().numpy()
    u, _, _ = np.linalg.svd(cooccurrence(ids, corpus.vocab_size, window=2).toarray())
    top = u[:, :m] @ u[:, :m].T
    basis = scipy.linalg.orth(features)
    assert basis.shape[1] == m
    np.testing.assert_allclose(basis @ basis.T, top, atol=1e-5)
    # each column has the spread of a column of the random start, U(-1/sqrt(m), 1/sqrt(m))
    np.testing.assert_allclose(np.sqrt((features**2).mean(axis=0)), 1 / math.sqrt(3 * m), rtol=1e-5)


@pytest.mark.parametrize("optim", ["fast", "sampled"])
@pytest.mark.parametrize("features", ["fixed_lsi", "fixed_random", "learned"])
def test_fixed_features_do_not_move_in_training(features: str, optim: str, tiny_brown_path: Path) -> None:
    """Frozen C: no gradient and no weight decay, so bit-identical after an epoch; learned C moves."""
    cfg = composed("experiment=mlp5", f"optim={optim}", f"model.features={features}", "model.n=3", "model.m=8")
    corpus = prepare_brown(str(tiny_brown_path), train=3000, valid=500, test=700)
    torch.manual_seed(0)
    module = build_module(cfg, corpus)
    before = module.model.C.detach().clone()
    if features == "fixed_lsi":
        start, end = corpus.bounds["train"]
        lsi = lsi_features(corpus.ids[start:end].numpy(), corpus.vocab_size, window=2, m=8, seed=cfg.seed)
        assert torch.equal(before, lsi)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(module, loader(corpus, "train", n=3, batch_size=64, shuffle=True), loader(corpus, "valid", 3, 512))
    assert torch.equal(module.model.C, before) == (features != "learned")
    assert not torch.equal(module.model.H, module.model.H.new_zeros(module.model.H.shape))


def test_learned_features_keep_the_run_keys_of_before_the_knob() -> None:
    """model.features=learned is the model before the knob: its keys leave it out; the fixed ones are new keys."""
    learned, fixed = composed("experiment=mlp5"), composed("experiment=mlp5", "model.features=fixed_random")
    bare = composed("experiment=mlp5")
    with open_dict(bare):
        del bare.model["features"]  # a config from before the knob
    assert config_key(learned, "f") == config_key(bare, "f")
    assert model_key(learned, "f") == model_key(bare, "f")
    assert config_key(fixed, "f") != config_key(learned, "f")
    assert model_key(fixed, "f") != model_key(learned, "f")


def test_neighbours_are_listed_only_among_words_trained_often_by_centred_cosine() -> None:
    """Rare words' rows share one direction (representation degeneration): raw cosines put every rare word at 0.95
    from every other. Centred, and among words seen 50 times, a frequent word's neighbour is the one that moves with
    it, and no rare word is listed."""
    from nplm_repro.models.use import nearest

    torch.manual_seed(0)
    shared = torch.randn(8)
    rows = shared + 0.05 * torch.randn(6, 8)  # six rare words, all near the shared direction
    frequent = torch.randn(4, 8)
    frequent[1] = frequent[0] + 0.1 * torch.randn(8)  # word 7 moves with word 6
    features = torch.cat([rows, frequent])
    among = torch.tensor([False] * 6 + [True] * 4)
    (near,) = nearest(features, [6], k=2, among=among)
    assert near[0][0] == 7 and all(i >= 6 for i, _ in near)
    raw = torch.nn.functional.normalize(features, dim=1)
    assert float(raw[0] @ raw[1]) > 0.95  # what the uncentred lists showed for rare words
