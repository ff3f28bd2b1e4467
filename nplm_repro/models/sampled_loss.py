"""Sampled training of eq. (1): the output layer's gradient from k words drawn from a proposal, not all of V.

The gradient of -log P(t | context) is -dy_t + E_{w ~ P(. | context)}[dy_w]. The first term, the target's, is
computed exactly. The second needs all |V| outputs; Bengio & Senecal (AISTATS 2003; IEEE Trans. Neural Networks
19(4), 2008) estimate it by importance sampling from a cheap proposal q: draw w_1..w_k from q, and weigh each
dy_{w_j} by r_j / sum(r), r_j = exp(y_{w_j}) / q(w_j) (self-normalised, hence slightly biased). The k words are
drawn once per batch and shared by its B rows, so the products are B x k, not B x |V|; a word drawn c times
is computed once, with weight c.

Three estimators, all of this shape (`optim.estimator`):
- `importance`: Bengio & Senecal's, above. The loss is -y_t + log(1/k sum_j r_j), an estimate of -log P(t).
- `sampled_softmax`: Jean et al. (2015), a softmax over the target and the drawn words with the log-proposal
  correction, y - log(k q); a drawn word equal to a row's target is left out of that row.
- `nce`: noise-contrastive estimation (Mnih & Teh 2012), the target against k noise words, each scored
  y - log(k q) as a logit; it trains the model to be self-normalised rather than estimating the gradient.

Two proposals (`optim.proposal`):
- `unigram`: the training words' frequencies, as Bengio & Senecal (2003).
- `bigram`: for each batch, the mean over its rows of an interpolated bigram P(w | w_{t-1}) of the training
  split (0.9 bigram, 0.1 unigram): close to what the model predicts for this batch, in the spirit of
  Bengio & Senecal's (2008) n-gram proposal, and still one distribution shared by the batch.
Only training uses this: validation, early stopping and every reported perplexity use the exact softmax.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch.nn import functional as F

ESTIMATORS = ("importance", "sampled_softmax", "nce")
PROPOSALS = ("unigram", "bigram")
BIGRAM_WEIGHT = 0.9


class Proposal:
    """q(w) over V from the training windows: fixed (unigram) or one per batch (bigram, from its contexts)."""

    def __init__(self, previous: torch.Tensor, target: torch.Tensor, vocab_size: int, kind: str = "unigram") -> None:
        """From the training windows' last two columns: each target and the word before it."""
        if kind not in PROPOSALS:
            raise ValueError(f"proposal {kind!r}: expected one of {', '.join(PROPOSALS)}")
        self.kind = kind
        counts = torch.bincount(target, minlength=vocab_size).double() + 1.0  # add-one: every word can be drawn
        self.unigram = (counts / counts.sum()).float()
        if kind == "bigram":
            # The bigram as a sparse |V| x |V| matrix, row w, column v: P(w | v), so that the batch's mixture of
            # its rows' bigrams is one sparse product with the histogram of their previous words.
            pairs, seen = torch.unique(target * vocab_size + previous, return_counts=True)
            following, before = pairs // vocab_size, pairs % vocab_size
            totals = torch.bincount(before, weights=seen.double(), minlength=vocab_size)
            self.has_bigram = (totals > 0).float()  # a word never followed in train: its rows' share is unigram
            rows = torch.cat(
                [torch.zeros(1, dtype=torch.long), torch.cumsum(torch.bincount(following, minlength=vocab_size), 0)]
            )
            with warnings.catch_warnings():  # "sparse CSR support is in beta": the product we use is not
                warnings.simplefilter("ignore", UserWarning)
                self.bigram = torch.sparse_csr_tensor(  # int32 indices: with int64, each product copies them
                    rows.int(), before.int(), (seen.double() / totals[before]).float(), (vocab_size, vocab_size)
                )

    def to(self, device: torch.device) -> Proposal:
        for name in ("unigram", "has_bigram", "bigram"):
            if hasattr(self, name):
                setattr(self, name, getattr(self, name).to(device))
        return self

    def distribution(self, previous: torch.Tensor) -> torch.Tensor:
        """q over V for a batch whose rows' previous words are `previous` [B]."""
        if self.kind == "unigram":
            return self.unigram
        share = (
            torch.bincount(previous, minlength=len(self.unigram)) * self.has_bigram * (BIGRAM_WEIGHT / len(previous))
        )
        return torch.addmv(self.unigram, self.bigram, share, beta=1.0 - float(share.sum()))


Outputs = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Rows = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (weight, index) -> the weight's rows at index


def sparse_rows(weight: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows `index` of `weight`, their gradient sparse (only these rows, for SparseSGD to update in place)."""
    return F.embedding(index, weight, sparse=True)


def dense_rows(weight: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows `index` of `weight`, their gradient dense: an output matrix tied to the input embedding gets one
    from both."""
    return F.embedding(index, weight)


def layer_outputs(
    terms: list[tuple[torch.Tensor, torch.Tensor]], b: torch.Tensor, target: torch.Tensor, rows: Rows = sparse_rows
) -> Outputs:
    """For drawn `words`: y_t of each row's own target [B], and y at `words` for every row [B, len(words)], of the
    output layer y = b + sum input @ weight.T, from its rows of those words only, read by `rows` (SparseSGD.rows in
    training: lazy decay applied, gradients sparse)."""

    def outputs(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.cat([target, words])
        y = b[ids]
        y_t, y_s = y[: len(target)], y[len(target) :].expand(len(target), -1)
        for inputs, weight in terms:
            gathered = rows(weight, ids)
            y_t = y_t + (inputs * gathered[: len(target)]).sum(1)
            y_s = torch.addmm(y_s, inputs, gathered[len(target) :].T)
        return y_t, y_s

    return outputs


class Sample(NamedTuple):
    """The distinct words of k draws from a proposal, how many times each was drawn, and k."""

    words: torch.Tensor
    drawn: torch.Tensor
    samples: int


def draw(q: torch.Tensor, samples: int) -> Sample:
    """k = `samples` words from q [|V|], with replacement, shared by a batch."""
    return Sample(*torch.unique(torch.multinomial(q, samples, replacement=True), return_counts=True), samples)


def sampled_cross_entropy(
    outputs: Outputs, target: torch.Tensor, q: torch.Tensor, sample: Sample, estimator: str = "importance"
) -> torch.Tensor:
    """The batch-mean loss whose gradient estimates that of cross-entropy of the softmax of a model's outputs y
    over V, from `sample` (`draw`: k words drawn from q [|V|], shared by the batch): `outputs(words)` computes y at
    each row's target and at the drawn words only (`layer_outputs` for eq. (1)'s output layer)."""
    words, drawn, samples = sample
    log_q = q[words].log()
    y_t, y_s = outputs(words)
    if estimator == "importance":
        log_z = torch.logsumexp(y_s - log_q + drawn.log(), 1) - math.log(samples)  # log of (1/k) sum_j r_j
        return (log_z - y_t).mean()
    corrected = y_s - (samples * q[words]).log()
    if estimator == "sampled_softmax":
        hits = words[None, :] == target[:, None]
        others = (corrected + drawn.log()).masked_fill(hits, -math.inf)
        logits = torch.cat([(y_t - (samples * q[target]).log())[:, None], others], 1)
        return -F.log_softmax(logits, 1)[:, 0].mean()
    if estimator == "nce":
        positive = F.softplus(-(y_t - (samples * q[target]).log()))
        return (positive + (F.softplus(corrected) * drawn).sum(1)).mean()
    raise ValueError(f"estimator {estimator!r}: expected one of {', '.join(ESTIMATORS)}")


class SparseSGD(torch.optim.Optimizer):
    """SGD with weight decay, p <- (1 - lr wd) p - lr g, that touches only the rows a step reads or changes.

    A sparse gradient is added to its rows only. The decay of the `lazy` weights (the |V|-row matrices: C, U, W) is
    one number a weight: scaling every row each step is a |V|-wide pass through memory, the very cost that sampling
    avoids. Such a weight is kept as p / s, s being the product of the decay factors 1 - lr wd of the steps since it
    was last settled: a step multiplies s by its factor and adds -lr g / s to the rows it changed, which is eager
    decay's update of every row, up to rounding, however the learning rate changed meanwhile. A step reads a lazy
    weight's rows through `rows` (the kept rows times s); `settle()` multiplies each lazy weight by its s and sets s
    to 1, and runs before anything else reads the weights: `state_dict` settles first, so a checkpoint holds the
    true weights, and so does the module before validation and at the end of training. The param groups are those
    given, lazy or not, so a checkpoint of plain SGD-shaped groups loads.
    """

    SMALLEST = 1e-6  # a scale below this is settled: the kept weight would be a million times the true one

    def __init__(self, params: Any, lr: float, weight_decay: float = 0.0, lazy: Iterable[torch.Tensor] = ()) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})
        self._scale = {id(p): 1.0 for p in lazy}  # each lazy weight's s

    def rows(self, weight: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The rows `index` of `weight` as they are (a lazy weight's kept rows times its s), their gradient sparse:
        how a sampled step reads the word rows (`Rows`)."""
        got = F.embedding(index, weight, sparse=True)
        scale = self._scale.get(id(weight), 1.0)
        return got if scale == 1.0 else got * scale

    @torch.no_grad()
    def settle(self) -> None:
        """Every lazy weight made true."""
        for group in self.param_groups:
            for p in group["params"]:
                if self._scale.get(id(p), 1.0) != 1.0:
                    self._settle(p)

    def _settle(self, p: torch.Tensor) -> None:
        """A lazy weight made true: multiplied by its s, which starts again at 1."""
        p.mul_(self._scale[id(p)])
        self._scale[id(p)] = 1.0

    def state_dict(self) -> dict[str, Any]:
        self.settle()
        return super().state_dict()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, decay = group["lr"], group["weight_decay"]
            keep = 1.0 - lr * decay
            for p in group["params"]:
                lazy = bool(decay) and id(p) in self._scale
                if lazy:  # this step's decay, of every row; a row read through `rows` had its gradient times s
                    before = self._scale[id(p)]
                    self._scale[id(p)] = before * keep
                if p.grad is None:
                    continue
                if lazy and not p.grad.is_sparse:
                    raise ValueError("SparseSGD: a lazy weight needs a sparse gradient (only its rows)")
                if decay and not lazy:
                    p.mul_(keep)
                alpha = -lr / (before * self._scale[id(p)]) if lazy else -lr
                if p.grad.is_sparse:
                    p.index_add_(0, p.grad._indices()[0], p.grad._values(), alpha=alpha)
                else:
                    p.add_(p.grad, alpha=alpha)
                if lazy and self._scale[id(p)] < self.SMALLEST:
                    self._settle(p)
        return loss
