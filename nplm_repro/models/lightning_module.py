"""The LightningModule around eq. (1): loss, the two optimiser recipes, exact perplexity.

Both recipes are SGD with weight decay, the learning rate `optim.lr` counted per training word:
- `paper`: eps_t = eps_0 / (1 + r t) (p.1147), eps_0 = 1e-3, t counting training words. The paper updates
  after every word; we average the loss over a mini-batch of B words and take the step B * eps_t, so one
  mini-batch moves the weights as far as the paper's B single-word updates would (to first order), and
  weight decay lambda shrinks them by B * eps_t * lambda per batch, as the paper's per-update decay does.
  Under DDP with W processes of B words each, one step averages W x B words, and B counts them all.
- `fast`: 5 times the paper's rate on batches of 256, multiplied by `plateau_factor` after each epoch that
  does not improve validation perplexity (early stopping ends training two such epochs later).
The decay and the drop are knobs either recipe can take (`schedules`), for going from one recipe to the other.
Weight decay applies to C, H, U, W, never to the biases b and d (p.1142).

Perplexity is exp(mean negative log-likelihood) over every token of a split, from the exact softmax of
float32 logits, with the per-token terms summed in float64.

`trainer.precision=bf16-mixed` trains with the output layer's products in bfloat16 (bf16_loss.py, about
3x faster on a CPU with bf16 units). `optim.output=sampled` trains in float32 with the output layer's gradient
estimated from `optim.samples` words drawn from a proposal (sampled_loss.py). Evaluation is the exact float32
softmax whatever the training used.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from torch.nn import functional as F

from nplm_repro.data.splits import SPLITS
from nplm_repro.data.windows import WindowBatches
from nplm_repro.errors import NplmError
from nplm_repro.models.bf16_loss import bf16_cross_entropy
from nplm_repro.models.nplm import NPLM
from nplm_repro.models.sampled_loss import Proposal, SparseSGD, sampled_cross_entropy


class NPLMModule(L.LightningModule):
    family = "mlp"  # its name in run keys and reports (nplm_repro.tracking.keys)

    def __init__(
        self,
        vocab_size: int,
        n: int,
        m: int,
        h: int,
        direct: bool,
        optim: dict[str, Any],
        features: str = "learned",
        lsi: torch.Tensor | None = None,
    ) -> None:
        """`features`: C learned with the rest, or frozen (models/features.py) at `lsi` (fixed_lsi, computed from
        the training split by the caller; a checkpoint restores it without) or at its random start (fixed_random)."""
        super().__init__()
        # kept for load_from_checkpoint (the state dict holds C); the run logs the config itself
        self.save_hyperparameters(ignore=["lsi"], logger=False)
        self.model = NPLM(vocab_size, n, m, h, direct)
        if lsi is not None:
            self.model.C.data.copy_(lsi)
        self.model.C.requires_grad_(features == "learned")
        self.optim = dict(optim)
        self.proposal: Proposal | None = None  # sampled training's, built from the training windows
        self._reset()

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """Log-probabilities log P(w | context), [batch, |V|], from float32 logits."""
        with self._float32():
            return F.log_softmax(self.model(context), dim=-1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        context, target = batch
        if self.optim.get("output", "exact") == "sampled":  # checkpoints from before sampling have no key
            with self._float32():
                q = self.proposal.distribution(context[:, 0])
                o = self.optim
                terms = self.model.output_terms(context, sparse=True)
                loss = sampled_cross_entropy(terms, self.model.b, target, q, o["samples"], o["estimator"])
        elif self.trainer.precision == "bf16-mixed":
            loss = bf16_cross_entropy(self.model.output_terms(context), self.model.b, target)
        else:
            loss = F.cross_entropy(self.model(context), target)
        # Logged by hand, not by self.log(on_step, on_epoch) on every batch: that costs about 4% of a step.
        self._seen += len(target)
        self._loss_sum += loss.detach() * len(target)
        if batch_idx % self.trainer.log_every_n_steps == 0:  # not every step: a GPU would wait for the check
            self._check_finite(loss)
            self.log("train_loss_step", loss)
        # The step is lr x batch_size words of mean loss: a short last batch of k words weighs k, not batch_size
        return loss if len(target) == self.optim["batch_size"] else loss * (len(target) / self.optim["batch_size"])

    def _check_finite(self, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            raise NplmError(
                f"training loss is {loss.item()} at epoch {self.current_epoch}, step {self.global_step}: "
                "the model diverged (try a smaller optim.lr)"
            )

    def on_train_start(self) -> None:
        """Sampled training draws from a proposal counted on the training windows (each target, its w_{t-1})."""
        batches = self.trainer.train_dataloader
        if self.optim.get("output", "exact") == "sampled" and isinstance(batches, WindowBatches):
            rows = batches.rows.cpu()
            self.proposal = Proposal(rows[:, -2], rows[:, -1], self.model.b.numel(), self.optim["proposal"])
            self.proposal.to(self.device)

    def on_train_epoch_start(self) -> None:
        if isinstance(self.trainer.train_dataloader, WindowBatches):  # epoch k's shuffle, also after a resume
            self.trainer.train_dataloader.set_epoch(self.current_epoch)
        self._windows_on_device(self.trainer.train_dataloader)
        self._seen, self._epoch_start = 0, time.perf_counter()
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)

    def _windows_on_device(self, loaders: object) -> None:
        """Move the windows to this module's device (a GPU) once, so no batch is copied from the host."""
        for batches in loaders if isinstance(loaders, (list, tuple)) else [loaders]:
            if isinstance(batches, WindowBatches):
                batches.to(self.device)

    def tokens_per_s(self) -> float:
        """Training tokens per second so far in this epoch."""
        return self._seen / max(time.perf_counter() - self._epoch_start, 1e-9)

    def on_train_epoch_end(self) -> None:
        self._check_finite(self._loss_sum)
        self.log("train_loss_epoch", self._loss_sum / max(self._seen, 1))
        self.log("train_tokens_per_s", self.tokens_per_s())

    # Exact perplexity: validation_step scores the valid split each epoch; test_step scores any split,
    # dataloader i being SPLITS[i] (train, valid, test), for the reported checkpoint.
    @contextlib.contextmanager
    def _float32(self) -> Iterator[None]:
        """Evaluate in float32 even when training runs under bf16 autocast."""
        with torch.autocast(self.device.type, enabled=False):
            yield

    def _token_nll(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        with self._float32():
            return F.cross_entropy(self.model(context), target, reduction="none")

    def _accumulate(self, batch: tuple[torch.Tensor, torch.Tensor], slot: int) -> torch.Tensor:
        nll = self._token_nll(*batch)
        self._nll[slot] += nll.double().sum()  # on the device: no wait for it per batch
        self._tokens[slot] += len(nll)
        return nll.detach()

    def _perplexity(self, slot: int) -> torch.Tensor:
        """A float64 tensor: a Python float would be logged as float32."""
        return torch.exp(self._nll[slot] / self._tokens[slot])

    def _reset(self) -> None:
        """New tensors, not zeroed ones: DDP's spawned processes would share the pickled ones' memory."""
        self._nll = torch.zeros(len(SPLITS), dtype=torch.float64, device=self.device)
        self._tokens = torch.zeros(len(SPLITS), dtype=torch.int64, device=self.device)

    def on_validation_epoch_start(self) -> None:
        self._reset()
        self._windows_on_device(self.trainer.val_dataloaders)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._accumulate(batch, SPLITS.index("valid"))

    def on_validation_epoch_end(self) -> None:
        # sync_dist: under DDP every process scores the whole split, so the mean of theirs is that number
        self.log("valid_ppl_epoch", self._perplexity(SPLITS.index("valid")), prog_bar=True, sync_dist=True)

    def on_test_epoch_start(self) -> None:
        self._reset()
        self._windows_on_device(self.trainer.test_dataloaders)

    def test_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int, dataloader_idx: int = 0
    ) -> torch.Tensor:
        """Adds the batch to its split's perplexity; returns each token's -ln P, which `KeptScores` keeps."""
        return self._accumulate(batch, dataloader_idx)

    def on_test_epoch_end(self) -> None:
        for slot, split in enumerate(SPLITS):
            if self._tokens[slot]:
                self.log(f"{split}_ppl", self._perplexity(slot), sync_dist=True)
                self.log(f"{split}_tokens", self._tokens[slot].double(), sync_dist=True)

    def configure_optimizers(self) -> tuple[list[torch.optim.Optimizer], list[dict[str, Any]]]:
        o = self.optim
        groups = [
            {"params": self.model.decayed(), "weight_decay": o["weight_decay"]},
            {"params": self.model.biases(), "weight_decay": 0.0},
        ]
        batch = o["batch_size"] * self.trainer.world_size  # DDP averages the processes' gradients: one batch of W x B
        # lr is per training word (module doc); fused: decay and step in one pass over each weight, not three
        if o.get("output", "exact") == "sampled":  # sparse gradients: the same update, on the sampled rows only
            optimizer = SparseSGD(groups, lr=o["lr"] * batch)
        else:
            optimizer = torch.optim.SGD(groups, lr=o["lr"] * batch, fused=True)
        return [optimizer], schedules(optimizer, o.get("decay_rate"), o.get("plateau_factor"), batch)


def schedules(
    optimizer: torch.optim.Optimizer, decay_rate: float | None, plateau_factor: float | None, batch: int
) -> list[dict[str, Any]]:
    """The recipes' two learning-rate knobs, each on when its key is set: the paper's eps_0 / (1 + r t) (`decay_rate`
    r, t counting training words; optim=paper) and the drop by `plateau_factor` after an epoch without validation
    progress (optim=fast). A recipe may take the other's knob (`+optim.plateau_factor=0.2` on paper, `+optim.decay_rate`
    on fast; `optim.plateau_factor=null` drops nothing): sweeps/brown_recipe.yaml moves from one recipe to the other
    one knob at a time. Each recipe alone keeps its scheduler, so its runs step exactly as before the knobs composed.
    """

    def decay(step: int) -> float:
        return 1.0 / (1.0 + decay_rate * step * batch)

    found = []
    if decay_rate is not None:
        if plateau_factor is None:
            found.append({"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, decay), "interval": "step"})
        else:  # the decay as a factor per step on the current rate, so that the drops, which scale it, stay in it
            steps = torch.optim.lr_scheduler.MultiplicativeLR(optimizer, lambda step: decay(step) / decay(step - 1))
            found.append({"scheduler": steps, "interval": "step"})
    if plateau_factor is not None:
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=plateau_factor, patience=0)
        found.append({"scheduler": plateau, "monitor": "valid_ppl_epoch"})
    return found


class ProgressBar(TQDMProgressBar):
    """Lightning's bar with readable numbers: tokens/s as an integer, perplexity with one decimal."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        items = {k: f"{v:.1f}" if "ppl" in k and isinstance(v, float) else v for k, v in items.items()}
        if trainer.training and isinstance(pl_module, NPLMModule):
            items["tok/s"] = f"{pl_module.tokens_per_s():,.0f}"
        return items


class KeptScores(Callback):
    """Every token's ln P from `Trainer.test`, one float32 array per kept dataloader, filled as batches come.

    The scores are the very terms the logged perplexities sum (float32 from the exact softmax), so
    exp(-mean(scores)) gives the logged perplexity. Preallocated: kept as a list of small per-batch tensors,
    they would sit between the |V|-wide blocks of the next batches, fragment the heap and fault its pages in anew.
    """

    def __init__(self) -> None:
        self.scores: dict[int, torch.Tensor] = {}
        self._filled: dict[int, int] = {}

    def expect(self, sizes: dict[int, int]) -> None:
        """Keep dataloader i's scores in an array of sizes[i] tokens (the others are scored, not kept)."""
        self.scores = {i: torch.empty(size, dtype=torch.float32) for i, size in sizes.items()}
        self._filled = dict.fromkeys(sizes, 0)

    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if dataloader_idx in self.scores:
            at = self._filled[dataloader_idx]
            self.scores[dataloader_idx][at : at + len(outputs)] = -outputs.float().cpu()
            self._filled[dataloader_idx] = at + len(outputs)

    def kept(self, index: int) -> torch.Tensor:
        if self._filled[index] != len(self.scores[index]):
            raise RuntimeError(f"dataloader {index}: {self._filled[index]} of {len(self.scores[index])} tokens scored")
        return self.scores[index]
