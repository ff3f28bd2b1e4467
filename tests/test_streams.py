"""A stream model's batches and exact evaluation: every token of a split scored exactly once, in order, with the
context promised (data/streams.py, models/sequence.py)."""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from helpers import TINY_BROWN, composed, data_slice

from nplm_repro.data.corpus import Corpus
from nplm_repro.data.load import load_corpus
from nplm_repro.data.streams import Bptt, Chunks, Sliding, inputs_targets
from nplm_repro.models.language_module import LanguageModule
from nplm_repro.models.training import build_module, score_splits

TOKENS = torch.arange(1, 101)


def test_sliding_windows_score_every_token_once_with_half_a_window_of_context() -> None:
    inputs = torch.arange(0, 100)
    windows = Sliding(inputs, TOKENS, rows=3, length=16, stride=8)
    scored, context = [], []
    for x, y, keep in windows:
        for row_x, row_y, row_keep in zip(x, y, keep):
            for position in torch.nonzero(row_keep).flatten():
                scored.append(int(row_y[position]))
                context.append(int(position))  # tokens of the window before it
    assert scored == TOKENS.tolist()
    assert all(c >= 8 or t - 1 == c for t, c in zip(scored, context))  # half a window, or all that precedes


def test_bptt_evaluation_is_one_row_in_order_and_training_rows_are_contiguous() -> None:
    inputs = torch.arange(0, 100)
    assert torch.cat([y[0] for _, y, _ in Bptt(inputs, TOKENS, rows=1, length=7)]).tolist() == TOKENS.tolist()
    batches = list(Bptt(inputs, TOKENS, rows=4, length=5))
    rows = torch.cat([y for _, y, _ in batches], dim=1)
    assert rows.tolist() == TOKENS.view(4, 25).tolist()  # row r continues itself from batch to batch


def test_chunks_are_whole_windows_of_the_stream_reshuffled_each_pass() -> None:
    chunks = Chunks(torch.arange(0, 100), TOKENS, rows=2, length=10, seed=3)
    first = [y for _, y, _ in chunks]
    second = [y for _, y, _ in chunks]
    for x, y in zip(first, first):
        assert torch.all(y[:, 1:] - y[:, :-1] == 1)  # contiguous tokens
    assert sum(len(y) for y in first) == 10 and not all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("experiment", ["lstm", "transformer"])
def test_exact_evaluation_equals_the_softmax_of_each_token_from_the_splits_start(experiment: str) -> None:
    """The kept score of every token is log softmax of the model run on the split from its start (LSTM: the state
    carried through the whole split; Transformer: the window before the token), checked token by token."""
    cfg = composed(
        f"experiment={experiment}",
        f"data.path={TINY_BROWN}",
        *data_slice(3_000, 600, 600),
        "data.eval_batch_size=64",
        "model.width=16",
        "model.layers=1",
        "model.output=standard",  # y = b + O h over all of V, which the test writes out
        "trainer.precision=32-true",
        *(["model.heads=2", "model.context=32"] * (experiment == "transformer")),
    )
    L.seed_everything(1)
    corpus = load_corpus(cfg.data)
    module = build_module(cfg, corpus).eval()
    kept = score_splits(cfg, module, corpus, ["test"])["test"]
    inputs, targets = inputs_targets(corpus, "test")
    assert len(kept) == corpus.size("test")

    def logits(h: torch.Tensor) -> torch.Tensor:  # y = b + O h, written out
        return torch.addmm(module.b, h.reshape(-1, h.shape[-1]), module.output_weight.T)

    with torch.no_grad():
        if experiment == "lstm":
            h, _ = module.hidden(inputs[None])
            expected = torch.log_softmax(logits(h), -1)[torch.arange(len(targets)), targets]
        else:  # the token at t sees the window that scored it: from the window's start to t
            picks = [0, 1, 15, 16, 17, 40, len(targets) - 1]
            starts = {t: Sliding(inputs, targets, 1, 32, 16) for t in picks}
            expected = []
            for t in picks:
                windows = starts[t]
                start = next(
                    s
                    for s, done in zip(windows.starts, [0, *(s + 32 for s in windows.starts[:-1])])
                    if s <= t < s + 32 and t >= done
                )
                h, _ = module.hidden(inputs[None, start : t + 1])
                expected.append(float(torch.log_softmax(logits(h[:, -1:]), -1)[0, targets[t]]))
            kept, expected = kept[picks], torch.tensor(expected)
    np.testing.assert_allclose(kept, np.asarray(expected, dtype=np.float32), rtol=1e-4, atol=1e-4)


def small_stream_model(experiment: str, *overrides: str) -> tuple[LanguageModule, Corpus]:
    """A one-layer model 16 wide (an LSTM, or a Transformer of 16-token windows) on 3,000 tokens of the tiny corpus,
    seeded, and that corpus."""
    cfg = composed(
        f"experiment={experiment}",
        *overrides,
        f"data.path={TINY_BROWN}",
        *data_slice(3_000, 600, 600),
        "model.width=16",
        "model.layers=1",
        "optim.batch_size=4",
        *(["model.heads=2", "model.context=16"] * (experiment == "transformer")),
    )
    L.seed_everything(1)
    corpus = load_corpus(cfg.data)
    return build_module(cfg, corpus), corpus


def three_steps(module: LanguageModule, corpus: Corpus, **trainer: Any) -> None:
    """Three training steps of batches of 4, nothing validated, logged or kept."""
    L.Trainer(
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        **trainer,
    ).fit(module, module.reads.batches(corpus, "train", 4, shuffle=True, seed=1))


@pytest.mark.parametrize("experiment", ["lstm", "transformer"])
@pytest.mark.parametrize("how", [("optim=fast", "32-true"), ("optim=fast", "bf16-mixed"), ("optim=sampled", "32-true")])
def test_each_output_layer_trains_the_stream_models(experiment: str, how: tuple[str, str]) -> None:
    """Exact in float32, exact with bfloat16 products, sampled: each takes steps with a finite loss that move the
    output vectors (tied to the embedding)."""
    optim, precision = how
    module, corpus = small_stream_model(experiment, optim, "optim.samples=50")
    before = module.output_weight.detach().clone()
    three_steps(module, corpus, precision=precision)
    assert np.isfinite(float(module._loss_sum)) and module._seen > 0
    assert not torch.equal(before, module.output_weight.detach())


def test_the_recipes_clip_bounds_the_gradients_norm() -> None:
    """optim.clip goes through Lightning's clipping: after each step the gradient's norm is at most the clip."""
    module, corpus = small_stream_model("lstm", "optim.clip=0.01", "trainer.precision=32-true")
    norms = []

    class Norm(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

    three_steps(module, corpus, callbacks=[Norm()])
    assert len(norms) == 3 and max(norms) <= 0.01 * (1 + 1e-5)
