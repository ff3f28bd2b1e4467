"""What a language model that reads a running stream shares (the LSTM, the Transformer): its output layer, its
three ways to train it, its two optimiser recipes and its exact evaluation.

The output layer is the MLP's: y = b + O h, with O the output word vectors (tied to the input embedding, or its
own) and h the network's last hidden vector at each position, through the same output layers (models/outputs.py):
exact (the float32 softmax, or its products in bfloat16 where `trainer.precision` resolves to bf16-mixed), sampled
(`optim=sampled`: the same importance sampling from the same bigram proposal, counted on the training stream), or
word classes (`model.output=classes`, §5.2's factored softmax, exact). Evaluation is the exact float32
distribution of every token, whatever trained it.

Recipes (`optim.recipe`):
- `sgd`: Zaremba et al. (2014): SGD on the batch's mean loss at rate `optim.lr`, the gradient's norm clipped at
  `optim.clip`, the rate multiplied by `optim.plateau_factor` after each epoch that does not improve validation.
- `adamw`: AdamW (decay `optim.weight_decay` on matrices only), the rate rising linearly over `optim.warmup` of
  the run's steps, then falling along a cosine to a tenth of `optim.lr` (`optim.cosine_floor`: absent 0.1, 0 to
  zero) at `trainer.max_epochs` (`plateau_factor` null: a fixed budget), or kept until an epoch does not improve
  validation and then multiplied by `optim.plateau_factor`, the run ended by early stopping (train to convergence,
  `trainer.max_epochs` a ceiling).
  Without a ceiling (`trainer.max_epochs=-1`) the rise spans the first epoch: the run's length is not known.
  With `optim.anneal_to_time: true` (and `plateau_factor` null) the rise and the cosine run along the time budget
  instead, `trainer.max_time`: the rate reaches a tenth when the fit's seconds (training and validation, the Timer's,
  as for every family) have spent it, so a row stopped at equal compute stops annealed, not at its peak.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.callbacks import Timer
from torch import nn

from nplm_repro.data.corpus import Corpus
from nplm_repro.data.streams import Batch, StreamBatches
from nplm_repro.errors import NplmError
from nplm_repro.models.language_module import LanguageModule, word_classes
from nplm_repro.models.outputs import Head, outputs_for
from nplm_repro.models.schedules import FLOOR, cosine, schedules, to_time_budget
from nplm_repro.rules import Rule, at_least, flag, number, one_of, optional

RECIPES = ("sgd", "adamw")


class SequenceModule(LanguageModule):
    """A subclass builds `self.embedding` (nn.Embedding), `self.b` and `self.O` (None when tied), calls
    `self._output_layer` (model.output=classes) and defines `hidden(x, state) -> (h, state)`, [B, T] ids to
    [B, T, width] vectors."""

    embedding: nn.Embedding
    b: nn.Parameter
    O: nn.Parameter | None
    evaluated = ("valid", "test")  # scoring the 800,000 training tokens would cost more than an epoch of training

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        return super().rules(cfg) | {
            "optim.recipe": one_of(*RECIPES),
            "optim.clip": optional(number(0, low_open=True)),
            "optim.warmup": optional(number(0, 1, high_open=True)),
            "optim.anneal_to_time": optional(flag()),  # absent (off) in every optim group: no stored run's key moves
            "optim.cosine_floor": optional(number(0, 1, high_open=True)),  # absent (0.1) likewise
            "model.width": at_least(1),
            "model.layers": at_least(1),
            "model.dropout": number(0, 1, high_open=True),
            "model.tie": flag(),
            "model.output": one_of(*outputs_for(cls.family)),  # the softmax over V, or §5.2's word classes
        }

    @classmethod
    def check(cls, cfg: Any) -> None:
        """The cosine of `adamw` without plateaus falls to its floor at the run's last step: a run without a
        ceiling (trainer.max_epochs=-1, no trainer.max_steps) has none. With `optim.anneal_to_time` it falls at
        trainer.max_time, which must then be given, and it is that cosine's (adamw, no plateaus)."""
        super().check(cfg)
        trainer, optim = cfg.trainer, cfg.optim
        fixed = optim.get("recipe") == "adamw" and optim.get("plateau_factor") is None  # the cosine, no plateaus
        if optim.get("anneal_to_time"):
            if not fixed:
                raise NplmError(
                    "optim.anneal_to_time=true ends adamw's cosine at trainer.max_time: it needs optim.recipe=adamw "
                    f"and optim.plateau_factor=null (here {optim.get('recipe')} and {optim.get('plateau_factor')})"
                )
            if trainer.get("max_time") is None:
                raise NplmError(
                    "optim.anneal_to_time=true anneals the rate to trainer.max_time, which is not set: give "
                    "trainer.max_time (DD:HH:MM:SS), or leave optim.anneal_to_time off"
                )
            return
        unbounded = trainer.get("max_epochs") == -1 and trainer.get("max_steps", -1) == -1
        if fixed and unbounded:
            raise NplmError(
                "trainer.max_epochs=-1 has no last epoch for optim.plateau_factor=null's cosine to fall to: give "
                "trainer.max_epochs, or a plateau_factor (the rate drops on plateaus, early stopping ends the run)"
            )

    def __init__(self, optim: dict[str, Any]) -> None:
        super().__init__()
        self.optim = dict(optim)
        self._state: Any = None  # a recurrent state carried from batch to batch (None: none yet, or no recurrence)
        self._eval_state: Any = None  # the same while a split is scored, from the split's start
        self._reset()

    # -- what the network defines --
    def hidden(self, x: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @classmethod
    def build(cls, cfg: Any, corpus: Corpus) -> SequenceModule:
        architecture = {k: v for k, v in cfg.model.items() if k != "_target_"} | word_classes(cfg.model, corpus)
        return cls(vocab_size=corpus.vocab_size, optim=dict(cfg.optim), **architecture)

    def carry(self, state: Any) -> Any:
        """The state the next batch starts from (None: none; a recurrent one, detached)."""
        return None

    # -- the output layer --
    @property
    def output_weight(self) -> torch.Tensor:
        return self.embedding.weight if self.O is None else self.O

    def _head(self, h: torch.Tensor, target: torch.Tensor | None, previous: torch.Tensor | None) -> Head:
        """y = b + O h at every position: h [..., width] flattened to rows."""
        rows = h.reshape(-1, h.shape[-1])
        weight = self.output_weight
        # sampled: O tied to the input embedding gets dense gradients from both, so its rows' gradients are dense
        return Head(target, self.b, lambda _: [(rows, weight)], previous=previous, sparse=False)

    # -- the interface callers ask (LanguageModule; `reads` is the network's: its StreamReading's length and kind) --
    def word_features(self) -> torch.Tensor:
        return self.embedding.weight.detach()

    @property
    def output_width(self) -> int:
        return self.embedding.embedding_dim

    @torch.no_grad()
    def next_logprobs(self, contexts: list[list[int]]) -> torch.Tensor:
        rows = []
        with self._float32():
            for ids in contexts:
                h, _ = self.hidden(torch.tensor([self.window(ids)], dtype=torch.int64))
                rows.append(self.layer.log_probs(self._head(h[:, -1], None, None))[0])
        return torch.stack(rows)

    def window(self, ids: list[int]) -> list[int]:
        """The part of a context the network reads (all of it, unless it has a window)."""
        return ids

    # -- training --
    def proposal_pairs(self, batches: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each token of the training stream and the token before it."""
        return (batches.inputs.cpu(), batches.targets.cpu()) if isinstance(batches, StreamBatches) else None

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self._state = None

    def head(self, batch: Batch, training: bool) -> Head:
        """Training: every position, the state carried from the last batch. Scoring: the scored positions only
        (half a sliding window's), the state carried from the split's start."""
        x, y, scored = batch
        if training:
            h, state = self.hidden(x, self._state)
            self._state = self.carry(state)
            return self._head(h, y.reshape(-1), x.reshape(-1))
        h, state = self.hidden(x, self._eval_state)
        self._eval_state = self.carry(state)
        keep = scored.reshape(-1)  # the output layer only where a token is scored
        return self._head(h.reshape(-1, h.shape[-1])[keep], y.reshape(-1)[keep], None)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """The gradient's norm clipped at `optim.clip` (part of the recipe, so of the config's optim group), by
        Lightning's own clipping; `trainer.gradient_clip_val` where the recipe sets none."""
        self.clip_gradients(optimizer, self.optim.get("clip") or gradient_clip_val, gradient_clip_algorithm or "norm")

    def configure_optimizers(self) -> tuple[list[torch.optim.Optimizer], list[dict[str, Any]]]:
        o = self.optim
        matrices = [p for p in self.parameters() if p.dim() >= 2]
        others = [p for p in self.parameters() if p.dim() < 2]
        groups = [{"params": matrices, "weight_decay": o["weight_decay"]}, {"params": others, "weight_decay": 0.0}]
        if o["recipe"] == "sgd":
            optimizer = torch.optim.SGD(groups, lr=o["lr"])
            return [optimizer], schedules(optimizer, None, o.get("plateau_factor"), 1)
        optimizer = torch.optim.AdamW(groups, lr=o["lr"], betas=(0.9, 0.98))
        floor = FLOOR if o.get("cosine_floor") is None else o["cosine_floor"]
        if o.get("anneal_to_time"):  # the cosine's end is trainer.max_time, whose Timer Lightning adds
            timer = next(c for c in self.trainer.callbacks if isinstance(c, Timer))
            return [optimizer], [to_time_budget(optimizer, timer, o.get("warmup") or 0.0, floor)]
        total = self.trainer.estimated_stepping_batches  # inf without a ceiling (trainer.max_epochs=-1)
        if math.isfinite(total):
            total = max(int(total), 1)
            warmup = max(int(o.get("warmup", 0.0) * total), 1)
        else:  # the run's length is unknown: the rise spans the first epoch (only plateaus run without a ceiling)
            self.trainer.fit_loop.setup_data()  # what estimated_stepping_batches does, but for a run without a ceiling
            epoch = math.ceil(self.trainer.num_training_batches / self.trainer.accumulate_grad_batches)
            warmup = max(epoch, 1) if o.get("warmup") else 1
        if o.get("plateau_factor") is not None:  # to convergence: the rise, then drops on plateaus until stopped
            return [optimizer], schedules(optimizer, None, o["plateau_factor"], 1, warmup)

        def rate(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return cosine((step - warmup) / max(total - warmup, 1), floor)

        return [optimizer], [{"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, rate), "interval": "step"}]

    # -- exact evaluation: every scored token once, a split's state from its start --
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if batch_idx == 0:
            self._eval_state = None

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if batch_idx == 0:
            self._eval_state = None
