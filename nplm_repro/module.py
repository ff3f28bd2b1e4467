"""The LightningModule around eq. (1): loss, the two optimiser recipes, exact perplexity.

Recipes (`optim.recipe`):
- `paper`: SGD with eps_t = eps_0 / (1 + r t) (p.1147), t counting training examples. The paper updates
  after every word; we average the loss over a mini-batch of B words and use the step B * eps_0, so one
  mini-batch moves the weights as far as the paper's B single-word updates would (to first order), and
  weight decay lambda shrinks them by B * eps_0 * lambda per batch, as the paper's per-update decay does.
- `fast`: AdamW on batches of 256, its decoupled decay set to shrink the weights per training word as the
  paper's does; the learning rate drops by `plateau_factor` after an epoch without validation progress.
Weight decay applies to C, H, U, W, never to the biases b and d (p.1142).

Perplexity is exp(mean negative log-likelihood) over every token of a split, from the exact softmax,
with the per-token terms summed in float64.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from torch.nn import functional as F

from nplm_repro.model import NPLM

SPLIT_NAMES = ("train", "valid", "test")
PAPER_EPS0 = 1e-3  # the paper's learning rate per training word (p.1147)


class NPLMModule(L.LightningModule):
    def __init__(self, vocab_size: int, n: int, m: int, h: int, direct: bool, optim: dict[str, Any]) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = NPLM(vocab_size, n, m, h, direct)
        self.optim = dict(optim)
        self._nll = torch.zeros(len(SPLIT_NAMES), dtype=torch.float64)
        self._tokens = torch.zeros(len(SPLIT_NAMES), dtype=torch.int64)

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """Log-probabilities log P(w | context), [batch, |V|]."""
        return F.log_softmax(self.model(context).float(), dim=-1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        context, target = batch
        loss = F.cross_entropy(self.model(context), target)
        self._seen += len(target)
        self.tokens_per_s = self._seen / (time.perf_counter() - self._epoch_start)
        self.log("train_loss", loss, on_step=True, on_epoch=True, batch_size=len(target))
        self.log("tok/s", self.tokens_per_s, prog_bar=True, logger=False, batch_size=len(target))
        return loss

    def on_train_epoch_start(self) -> None:
        self._seen, self._epoch_start = 0, time.perf_counter()

    def on_train_epoch_end(self) -> None:
        self.log("train_tokens_per_s", self.tokens_per_s)

    # Exact perplexity: validation_step scores the valid split each epoch; test_step scores any split,
    # dataloader i being SPLIT_NAMES[i] (train, valid, test), for the reported checkpoint.
    def _accumulate(self, batch: tuple[torch.Tensor, torch.Tensor], slot: int) -> None:
        context, target = batch
        nll = F.cross_entropy(self.model(context).float(), target, reduction="none")
        self._nll[slot] += nll.double().sum().cpu()
        self._tokens[slot] += len(target)

    def _perplexity(self, slot: int) -> torch.Tensor:
        """A float64 tensor: a Python float would be logged as float32."""
        return torch.exp(self._nll[slot] / self._tokens[slot])

    def _reset(self) -> None:
        self._nll.zero_()
        self._tokens.zero_()

    def on_validation_epoch_start(self) -> None:
        self._reset()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._accumulate(batch, SPLIT_NAMES.index("valid"))

    def on_validation_epoch_end(self) -> None:
        self.log("valid_ppl_epoch", self._perplexity(SPLIT_NAMES.index("valid")), prog_bar=True)

    def on_test_epoch_start(self) -> None:
        self._reset()

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._accumulate(batch, dataloader_idx)

    def on_test_epoch_end(self) -> None:
        for slot, split in enumerate(SPLIT_NAMES):
            if self._tokens[slot]:
                self.log(f"{split}_ppl", self._perplexity(slot))
                self.log(f"{split}_tokens", self._tokens[slot].double())

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """P(w_t | context) of each target, float64, for mixing with another model token by token."""
        context, target = batch
        nll = F.cross_entropy(self.model(context).float(), target, reduction="none")
        return torch.exp(-nll.double())

    def configure_optimizers(self) -> dict[str, Any]:
        o = self.optim
        groups = [
            {"params": self.model.decayed(), "weight_decay": o["weight_decay"]},
            {"params": self.model.biases(), "weight_decay": 0.0},
        ]
        if o["recipe"] == "paper":
            batch = o["batch_size"]
            optimizer = torch.optim.SGD(groups, lr=o["lr"] * batch)
            schedule = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: 1.0 / (1.0 + o["decay_rate"] * step * batch)
            )
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
        if o["recipe"] == "fast":
            # AdamW shrinks the weights by lr * wd per step: this wd makes one batch of B words shrink them as
            # much as B of the paper's updates (eps_0 * lambda each), so weight_decay means the same in both.
            groups[0]["weight_decay"] = o["weight_decay"] * PAPER_EPS0 * o["batch_size"] / o["lr"]
            optimizer = torch.optim.AdamW(groups, lr=o["lr"])
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=o["plateau_factor"], patience=0)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "valid_ppl_epoch"}}
        raise ValueError(f"optim.recipe must be 'paper' or 'fast', not {o['recipe']!r}")


class ProgressBar(TQDMProgressBar):
    """Lightning's bar with readable numbers: tokens/s as an integer, perplexity with one decimal."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return {
            k: f"{v:,.0f}" if k == "tok/s" else f"{v:.1f}" if "ppl" in k and isinstance(v, float) else v
            for k, v in items.items()
        }
