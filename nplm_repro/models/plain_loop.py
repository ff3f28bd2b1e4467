"""Eq. (1)'s training steps as the simplest PyTorch loop that computes the same thing: the arithmetic's own floor
(nplm-bench's `plain` lines; each train line's `x_plain` is its rate against the floor of its output layer).

A step here has no Lightning, no optimiser object, no output-layer strategy and no bookkeeping: the forward, the
backward and the update written out, on the module's own weights, with the same shapes, the same proposal,
estimator and update rule as the module's step (`SampledSoftmax` with `SparseSGD`; the exact softmax or the word
classes with `torch.optim.SGD`). What a module's step costs beyond this is the overhead a fast path should cut;
`tests/test_plain_loop.py` holds the floor to the module's step: the same weights after 20 steps, to float32
rounding. A floor that computed something else would be no floor.

- `SampledLoop` (optim.output=sampled): the k words drawn from the proposal for the batch, the rows of C, U (and W)
  and b that the step reads gathered as leaves (a word weight's times its scale: lazy decay, SparseSGD's), the
  gradient reaching only those leaves, and each added back to its rows with one `index_add_`; H and d dense. The
  learning rate stays `optim.lr` x batch (the fast recipe's within an epoch).
- `ExactLoop`: the loss (the float32 softmax over V, its products in bfloat16 under bf16-mixed, or the word-class
  layer, always float32), backward, then torch's fused SGD as a function, one call per group of weights.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn import functional as F
from torch.optim.sgd import sgd

from nplm_repro.models.bf16_loss import bf16_cross_entropy
from nplm_repro.models.classes import ClassOutput
from nplm_repro.models.nplm import NPLM
from nplm_repro.models.sampled_loss import ESTIMATORS, Proposal, SparseSGD


class SampledLoop:
    """Sampled training's step (sampled_loss.py's estimators, SparseSGD's update with its lazy decay) by hand."""

    def __init__(self, model: NPLM, proposal: Proposal, optim: dict[str, Any]) -> None:
        if optim["estimator"] not in ESTIMATORS:
            raise ValueError(f"estimator {optim['estimator']!r}: expected one of {', '.join(ESTIMATORS)}")
        self.model, self.proposal, self.optim = model, proposal, optim
        self.lr = optim["lr"] * optim["batch_size"]
        self.keep = 1.0 - self.lr * optim["weight_decay"]
        # each word weight's scale: it is kept as its true value / scale (SparseSGD's lazy decay)
        self.scale = {id(p): 1.0 for p in model.word_rows()}
        self.leaves: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (rows, their weight, indices)

    @torch.no_grad()
    def _rows(self, weight: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The rows of a weight that a step reads, as they truly are, as a leaf for autograd."""
        got = weight.index_select(0, rows)
        if self.scale.get(id(weight), 1.0) != 1.0:
            got *= self.scale[id(weight)]
        self.leaves.append((got, weight, rows))
        return got.requires_grad_(weight.requires_grad)

    def step(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """One step on a batch of windows: the batch's mean loss (before the update)."""
        model, samples, batch = self.model, self.optim["samples"], len(target)
        q = self.proposal.distribution(context[:, 0])
        words, drawn = torch.unique(torch.multinomial(q, samples, replacement=True), return_counts=True)
        out = torch.cat([target, words])  # the output rows: each row's target, then the drawn words
        self.leaves = []
        x = self._rows(model.C, context.flatten()).view(batch, -1)
        terms = [(x, self._rows(model.W, out))] if model.W is not None else []
        if model.H is not None:
            terms.append((torch.tanh(model.d + x @ model.H.T), self._rows(model.U, out)))
        b_rows = self._rows(model.b, out)
        y_t, y_s = b_rows[:batch], b_rows[batch:].expand(batch, -1)
        for inputs, rows in terms:
            y_t = y_t + (inputs * rows[:batch]).sum(1)
            y_s = torch.addmm(y_s, inputs, rows[batch:].T)
        loss = _estimate(self.optim["estimator"], y_t, y_s, target, q, words, drawn, samples)
        if batch != self.optim["batch_size"]:  # a short last batch weighs its words, as the module's `_weighed`
            loss = loss * (batch / self.optim["batch_size"])
        loss.backward()
        self._update()
        return loss.detach()

    @torch.no_grad()
    def _update(self) -> None:
        """SparseSGD's step, (1 - lr wd) p - lr g: a word weight's decay one factor on its scale, each gathered leaf's
        gradient added to its rows (a word weight's divided by its new scale), H and d whole."""
        lr, keep = self.lr, self.keep
        for weight in self.scale:
            self.scale[weight] *= keep
        for rows, weight, index in self.leaves:
            if rows.grad is not None:
                weight.index_add_(0, index, rows.grad, alpha=-lr / self.scale.get(id(weight), 1.0))
        self.leaves = []
        if min(self.scale.values(), default=1.0) < SparseSGD.SMALLEST:
            self.settle()
        for p, decay in ((self.model.H, keep), (self.model.d, 1.0)):
            if p is not None:
                if decay != 1.0:
                    p.mul_(decay)
                p.add_(p.grad, alpha=-lr)
                p.grad = None

    @torch.no_grad()
    def settle(self) -> None:
        """Every word weight made true: the weights as the module's state dict holds them."""
        for weight in self.model.word_rows():
            weight.mul_(self.scale[id(weight)])
            self.scale[id(weight)] = 1.0


def _estimate(
    estimator: str,
    y_t: torch.Tensor,
    y_s: torch.Tensor,
    target: torch.Tensor,
    q: torch.Tensor,
    words: torch.Tensor,
    drawn: torch.Tensor,
    samples: int,
) -> torch.Tensor:
    """The batch's mean loss from y at the targets and at the drawn words (sampled_loss.py's doc)."""
    if estimator == "importance":
        log_z = torch.logsumexp(y_s - q[words].log() + drawn.log(), 1) - math.log(samples)
        return (log_z - y_t).mean()
    corrected = y_s - (samples * q[words]).log()
    if estimator == "sampled_softmax":
        others = (corrected + drawn.log()).masked_fill(words[None, :] == target[:, None], -math.inf)
        logits = torch.cat([(y_t - (samples * q[target]).log())[:, None], others], 1)
        return -F.log_softmax(logits, 1)[:, 0].mean()
    positive = F.softplus(-(y_t - (samples * q[target]).log()))
    return (positive + (F.softplus(corrected) * drawn).sum(1)).mean()


class ExactLoop:
    """The exact step (the softmax over V, or word classes) and torch's SGD, as functions."""

    def __init__(self, model: NPLM, classes: ClassOutput | None, optim: dict[str, Any], precision: str) -> None:
        self.model, self.classes, self.optim = model, classes, optim
        self.bf16 = precision == "bf16-mixed" and classes is None  # the class layer computes in float32
        layer = [] if classes is None else [classes]
        self.groups = [
            (model.decayed() + [p for c in layer for p in c.Kc], optim["weight_decay"]),
            (model.biases() + [c.bc for c in layer], 0.0),
        ]

    def step(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        model, batch = self.model, len(target)
        with torch.autocast(context.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            if self.classes is not None:
                loss = -self.classes.token_logprob(model.output_terms(context), model.b, target).mean()
            elif self.bf16:
                loss = bf16_cross_entropy(model.output_terms(context), model.b, target)
            else:
                loss = F.cross_entropy(model(context), target)
        if batch != self.optim["batch_size"]:
            loss = loss * (batch / self.optim["batch_size"])
        loss.backward()
        lr = self.optim["lr"] * self.optim["batch_size"]
        with torch.no_grad():
            for params, decay in self.groups:
                trained = [p for p in params if p.grad is not None]
                grads = [p.grad for p in trained]
                sgd(
                    trained,
                    grads,
                    [None] * len(trained),
                    fused=True,
                    weight_decay=decay,
                    momentum=0.0,
                    lr=lr,
                    dampening=0.0,
                    nesterov=False,
                    maximize=False,
                )
                for p in trained:
                    p.grad = None
        return loss.detach()

    def settle(self) -> None:
        """Nothing is owed: every weight is updated whole each step."""
