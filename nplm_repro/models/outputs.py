"""The output layer, one interface for every family: what a training step, an evaluation and a question ask of it.

A family computes the inputs of its output layer, a `Head`: each row's target, and the (input, weight) terms of
y = b + sum of input @ weight.T (eq. (1)'s (x, W) and (tanh(d + Hx), U); a sequence model's (h, O)), or its own
logits and sampled outputs where y is no such sum (§5.1's energy network). An `OutputLayer` turns a Head into

- `loss`: the training loss, the batch's mean -ln P(target), exact or estimated;
- `token_nll`: each row's exact -ln P(target), float32 (evaluation: every reported perplexity);
- `log_probs`: ln P(w) of every word w of V (generation, the MLflow Model).

Four layers, one chosen per run by `choose` from the config and the precision the trainer resolved:

| layer | model.output | optim.output | its training loss |
|---|---|---|---|
| `Softmax` | standard, energy | exact | the float32 softmax over V |
| `Bf16Softmax` | standard | exact, under bf16-mixed | the same, its three products in bfloat16 (bf16_loss.py) |
| `SampledSoftmax` | standard, energy | sampled | importance sampling from a proposal (sampled_loss.py) |
| `Classes` | classes | exact | a word-class softmax, a token's class's rows only (classes.py), in float32 |

The three softmax layers share the exact distribution; `Classes` is its own (P(class) P(word | class)), exact too.

This module owns the two keys' words too, so that nothing else compares their strings: `OUTPUTS`, what each value of
`model.output` is (`output_of` reads it), and `TRAININGS`, what each value of `optim.output` is (`training_of`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from nplm_repro.models.bf16_loss import bf16_cross_entropy
from nplm_repro.models.classes import ClassOutput, Terms
from nplm_repro.models.energy import EnergyNPLM
from nplm_repro.models.sampled_loss import (
    Outputs,
    Proposal,
    Rows,
    dense_rows,
    draw,
    layer_outputs,
    sampled_cross_entropy,
    sparse_rows,
)
from nplm_repro.rules import Rule


@dataclass(frozen=True)
class Output:
    """A value of `model.output`: the distribution a model gives, and what the code around a model asks of it, so that
    no caller tests the name. `families`: the families that build it (None: every trained family); `network`: the
    network that computes it in place of the family's own (eq. (1)'s arguments), whose y is no sum of products and
    which gives its own logits and sampled outputs; `needs`: what the rest of `model` must satisfy (the rule's test
    of `model`, and what it expects); `exact_only`: why it trains exactly only (None: it trains sampled too);
    `word_classes`: a word-class layer (models/classes.py), its class keys and classes from the training split;
    `plain_loop`: nplm-bench's plain loop (models/plain_loop.py) computes its step; `scores_train`: a run scores the
    training split too (a slow scorer leaves it out: no report needs it)."""

    name: str
    families: tuple[str, ...] | None = None
    network: type[nn.Module] | None = None
    needs: Rule | None = None
    exact_only: str | None = None
    word_classes: bool = False
    plain_loop: bool = True
    scores_train: bool = True

    @property
    def trains_sampled(self) -> bool:
        """Whether `optim.output=sampled` may train it."""
        return self.exact_only is None

    @property
    def own_scores(self) -> bool:
        """Whether its network gives its own logits and sampled outputs (its y is no sum of products)."""
        return self.network is not None

    def allows(self, family: str) -> bool:
        """Whether `family` (a Family's `family`) builds this output."""
        return self.families is None or family in self.families


OUTPUTS: dict[str, Output] = {
    o.name: o
    for o in (
        Output("standard"),  # eq. (1)'s softmax over V, or a sequence model's over its hidden vectors
        Output(  # §5.1: the output word a feature vector too (models/energy.py); eq. (1)'s feed-forward network only
            "energy",
            families=("mlp",),
            network=EnergyNPLM,
            needs=(lambda model: model.h >= 1, "model.h >= 1 (its energy is v . tanh(d + Hx))"),
            plain_loop=False,  # its step is its own network's, no output layer of eq. (1)
            scores_train=False,  # |V| x h tanh a token: train's 800,000 would take as long as the rest of the run
        ),
        Output(  # §5.2: a word-class softmax (models/classes.py)
            "classes",
            exact_only="its point is an exact softmax that costs |classes| + |class size| rows, not a sampled one",
            word_classes=True,
        ),
    )
}


def outputs_for(family: str) -> tuple[str, ...]:
    """The values of `model.output` that `family` builds, in OUTPUTS's order (its rule's words)."""
    return tuple(name for name, output in OUTPUTS.items() if output.allows(family))


def output_of(model: Any) -> Output:
    """What `model.output` of a model config (or a module's arguments) is. Absent: the softmax, as every run before
    the key was. A value no output has reads as the softmax too: its rule (`model.output`) refuses it, and the rules
    are gathered before any value is checked."""
    return OUTPUTS.get(model.get("output", "standard"), OUTPUTS["standard"])


@dataclass(frozen=True)
class Training:
    """A value of `optim.output`: how training computes the output layer's gradient. `sampled`: estimated from words
    drawn from a proposal (sampled_loss.py), with sparse updates (SparseSGD) and its own keys (optim.samples,
    optim.proposal, optim.estimator); `precision`: the precision it computes in whatever `trainer.precision` says
    (None: the one the trainer resolves)."""

    name: str
    sampled: bool = False
    precision: str | None = None


TRAININGS: dict[str, Training] = {
    t.name: t
    for t in (
        Training("exact"),  # the softmax's whole gradient, in the run's precision
        Training("sampled", sampled=True, precision="32-true"),  # its products are B x k: bfloat16 would not pay
    )
}


def training_of(optim: Any) -> Training:
    """What `optim.output` of an optim config (or a module's `optim`) is. Absent: exact, as every run and checkpoint
    before sampled training was. A value no training has reads as exact too: its rule (`optim.output`) refuses it,
    and the rules are gathered before any value is checked."""
    return TRAININGS.get(optim.get("output", "exact"), TRAININGS["exact"])


@dataclass
class Head:
    """What the output layer reads of a batch. `terms(rows)`: the (input, weight) terms, computed when asked, the
    word rows they read read by `rows` (a sampled step's SparseSGD.rows: lazy decay applied, gradients sparse;
    None: as they are). `logits` and `outputs`: the family's own (y over V, y at drawn words), where it computes
    them otherwise (eq. (1)'s forward) or where y is no sum of products (the energy network, which has no terms);
    when absent, computed from the terms. `previous`: each row's previous word (the bigram proposal's)."""

    target: torch.Tensor | None  # None: a question (log_probs), no target
    b: torch.Tensor
    terms: Callable[[Rows | None], Terms] | None = None  # None: a family with its own logits and outputs
    previous: torch.Tensor | None = None
    logits: Callable[[], torch.Tensor] | None = None
    outputs: Callable[[torch.Tensor, torch.Tensor, Rows], tuple[torch.Tensor, torch.Tensor]] | None = None
    sparse: bool = True  # a sampled step reads the word rows by its `rows` (False: tied to the input embedding)

    def all_logits(self) -> torch.Tensor:
        """y over V, [B, |V|]."""
        if self.logits is not None:
            return self.logits()
        y = self.b
        for inputs, weight in self.linear():
            y = torch.addmm(y, inputs, weight.T)
        return y

    def sampled_outputs(self, rows: Rows) -> Outputs:
        """For drawn words: y at each row's target and at the words (sampled_loss.layer_outputs), the word rows read
        by `rows` (dense where this head's are not sparse)."""
        rows = rows if self.sparse else dense_rows
        if self.outputs is not None:
            return functools.partial(self.outputs, self.target, rows=rows)
        return layer_outputs(self.linear(rows), self.b, self.target, rows)

    def linear(self, rows: Rows | None = None) -> Terms:
        """The terms; a layer that needs them (bfloat16 products, word classes) needs a family that has them."""
        if self.terms is None:
            raise ValueError(
                "this output layer needs y = b + sum of input @ weight.T, and this family has no such terms"
            )
        return self.terms(rows)


class OutputLayer:
    """The exact softmax's evaluation, shared by the layers that train it three ways."""

    name = ""

    def loss(self, head: Head) -> torch.Tensor:
        raise NotImplementedError

    def token_nll(self, head: Head) -> torch.Tensor:
        return F.cross_entropy(head.all_logits().float(), head.target, reduction="none")

    def log_probs(self, head: Head) -> torch.Tensor:
        return F.log_softmax(head.all_logits().float(), dim=-1)


class Softmax(OutputLayer):
    name = "exact float32"

    def loss(self, head: Head) -> torch.Tensor:
        return F.cross_entropy(head.all_logits(), head.target)


class Bf16Softmax(OutputLayer):
    name = "exact bfloat16"

    def loss(self, head: Head) -> torch.Tensor:
        if head.terms is None:  # a family's own logits (the energy network): no products to run in bfloat16
            return F.cross_entropy(head.logits(), head.target)
        return bf16_cross_entropy(head.linear(), head.b, head.target)


class SampledSoftmax(OutputLayer):
    """`rows(weight, index)` reads the word rows a step reads (SparseSGD.rows: its lazy decay applied)."""

    name = "sampled"

    def __init__(self, proposal: Proposal, samples: int, estimator: str, rows: Rows):
        self.proposal, self.samples, self.estimator, self.rows = proposal, samples, estimator, rows

    def loss(self, head: Head) -> torch.Tensor:
        with torch.autocast(head.target.device.type, enabled=False):  # its products are B x k: float32
            q = self.proposal.distribution(head.previous)
            sample = draw(q, self.samples)
            return sampled_cross_entropy(head.sampled_outputs(self.rows), head.target, q, sample, self.estimator)


class Classes(OutputLayer):
    name = "word classes"

    def __init__(self, classes: ClassOutput) -> None:
        self.classes = classes

    def loss(self, head: Head) -> torch.Tensor:
        return self.token_nll(head).mean()

    def token_nll(self, head: Head) -> torch.Tensor:
        """In float32 whatever the precision: its products are a token's class's rows, too small for bfloat16 to pay
        (MLP9 trained 0.8 times as fast under bf16-mixed as in float32, docs/performance.md); a sequence model's
        hidden vectors, computed before, keep the precision they were computed in."""
        with torch.autocast(head.target.device.type, enabled=False):
            terms = [(inputs.float(), weight) for inputs, weight in head.linear()]
            return -self.classes.token_logprob(terms, head.b, head.target)

    def log_probs(self, head: Head) -> torch.Tensor:
        return self.classes.log_probs(head.linear(), head.b)


def choose(
    classes: ClassOutput | None,
    optim: dict[str, Any],
    precision: str,
    proposal: Proposal | None,
    rows: Rows | None = None,
) -> OutputLayer:
    """The layer a run trains with (the module's table): its classes if it has them, else the softmax, sampled
    (`optim.output`, `training_of`; its word rows read by `rows`, SparseSGD.rows where that trains the module, else
    with sparse gradients), in bfloat16 (`precision` bf16-mixed) or float32."""
    if classes is not None:
        return Classes(classes)
    if training_of(optim).sampled:
        if proposal is None:
            raise ValueError("sampled training needs its proposal (counted when training starts)")
        return SampledSoftmax(proposal, optim["samples"], optim["estimator"], rows or sparse_rows)
    return Bf16Softmax() if precision == "bf16-mixed" else Softmax()
