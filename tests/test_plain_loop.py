"""The plain loop (nplm_repro/models/plain_loop.py), nplm-bench's floor of a training step, computes what the module's
step computes: from the same weights, on the same batches, with the same draws, 20 steps of each leave the same
weights to float32 rounding. A floor that computed something else would be no floor."""

import copy
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import composed, data_slice

from nplm_repro.data.load import load_corpus
from nplm_repro.models.training import build_module

STEPS = 20
LAYERS = {  # each output layer the bench has a plain line for
    "sampled": ["optim=sampled"],
    "classes": ["model.output=classes", "model.class_method=frequency"],
    "exact": [],
}


@pytest.mark.parametrize("layer", LAYERS)
def test_the_plain_loop_leaves_the_weights_of_the_modules_step(
    layer: str, tiny_brown_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLP9's shapes (batches of 256, k = 500 drawn words from the bigram proposal for sampled training) on 8,000
    tokens of the tiny corpus: the module trained 20 steps in a real Trainer, and the plain loop 20 steps from the
    same initial weights, each starting from the same generator state (the draws)."""
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path))
    cfg = composed(f"data.path={tiny_brown_path}", *data_slice(8_000, 1_500, 1_000), "experiment=mlp9", *LAYERS[layer])
    corpus = load_corpus(cfg.data)
    torch.manual_seed(0)
    module = build_module(cfg, corpus)
    start = copy.deepcopy(module.state_dict())
    trainer = L.Trainer(
        max_steps=STEPS,
        precision="32-true",
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    torch.manual_seed(1)
    trainer.fit(module, module.reads.batches(corpus, "train", cfg.optim.batch_size, True, cfg.seed))
    stepped = module.state_dict()  # every row brought up to date (lazy decay)

    plain = build_module(cfg, corpus)
    plain.load_state_dict(start)
    batches = plain.reads.batches(corpus, "train", cfg.optim.batch_size, True, cfg.seed)
    loop = plain.plain_loop("32-true", batches)
    torch.manual_seed(1)
    for _, (context, target) in zip(range(STEPS), batches, strict=False):  # 31 batches an epoch: one epoch's first 20
        loop.step(context, target)
    loop.settle()
    for name, weights in plain.state_dict().items():
        if weights.is_floating_point():
            assert (stepped[name] - start[name]).abs().max() > 1e-3, name  # the step moved it
            torch.testing.assert_close(weights, stepped[name], rtol=1e-5, atol=1e-6, msg=name)
