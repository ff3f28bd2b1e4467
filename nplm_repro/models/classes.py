"""A word-class output layer for eq. (1) (§5.2 of Bengio et al. 2003, as Goodman 2001 and Mikolov et al. 2011 built it).

    P(w | context) = P(k(w) | context) P(w | k(w), context),

both factors softmaxes of the same output inputs z (eq. (1)'s x, when direct, and tanh(d + Hx)): over the classes,
y_k = bc_k + sum_terms z . Kc_k (the class layer, `Kc`, `bc`), and over the words of one class, eq. (1)'s own
y_w = b_w + W_w . x + U_w . tanh(d + Hx) restricted to them. It is an exact, normalised distribution over V.

A token's loss needs its class's row of the class layer and the rows of its class's words only: about |classes| +
|class size| output rows instead of |V|, 45 to 67 times fewer multiply-adds for MLP9 on Brown (exchange, frequency
classes). A batch's rows are grouped
by class and each class the batch holds is one small product (`_LogNormalisers`); `log_probs` (generation, the
MLflow Model) still computes every word.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.autograd import Function
from torch.nn import functional as F

from nplm_repro.models.nplm import _uniform

Terms = list[tuple[torch.Tensor, torch.Tensor]]  # (input [B, width], its output weight [|V|, width]): NPLM.output_terms


class ClassOutput(nn.Module):
    """The class layer and the class of every word; `classes` None: a placeholder that a state dict fills."""

    def __init__(self, vocab_size: int, count: int, widths: list[int], classes: torch.Tensor | None = None) -> None:
        super().__init__()
        self.Kc = nn.ParameterList(_uniform(count, width, fan_in=sum(widths)) for width in widths)
        self.bc = nn.Parameter(torch.zeros(count))
        for name, size in (("word_class", vocab_size), ("order", vocab_size), ("start", count), ("size", count)):
            self.register_buffer(name, torch.zeros(size, dtype=torch.int64))
        if classes is not None:
            self.assign(classes)

    @torch.no_grad()
    def assign(self, classes: torch.Tensor) -> None:
        """Words sorted by class (`order`) and each class's span of that order (`start`, `size`): a class's words
        are one slice of `order`."""
        self.word_class.copy_(classes)
        self.order.copy_(torch.argsort(classes, stable=True))
        self.size.copy_(torch.bincount(classes, minlength=len(self.size)))
        self.start.copy_(torch.cumsum(self.size, 0) - self.size)

    def _class_logprobs(self, terms: Terms) -> torch.Tensor:
        y = self.bc
        for (inputs, _), weight in zip(terms, self.Kc):
            y = torch.addmm(y, inputs, weight.T)
        return F.log_softmax(y, 1)

    def token_logprob(self, terms: Terms, b: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """ln P(target | context) of each row [B], from its class's rows only."""
        k = self.word_class[target]
        y_t = b.index_select(0, target)
        for inputs, weight in terms:
            y_t = y_t + (inputs * weight.index_select(0, target)).sum(1)
        # the batch's rows grouped by class, and the words of each class it holds, in the same order
        by_class = torch.argsort(k, stable=True)
        present, tokens = torch.unique_consecutive(k[by_class], return_counts=True)
        sizes = self.size[present]
        spans = torch.repeat_interleave(self.start[present] - (torch.cumsum(sizes, 0) - sizes), sizes)
        words = self.order[spans + torch.arange(int(sizes.sum()), device=target.device)]
        pairs = [t for inputs, weight in terms for t in (inputs.index_select(0, by_class), weight)]
        log_z = _LogNormalisers.apply(words, tokens.tolist(), sizes.tolist(), b, *pairs)
        log_z = torch.empty_like(log_z).index_copy(0, by_class, log_z)  # back in the batch's order
        return self._class_logprobs(terms).gather(1, k[:, None])[:, 0] + y_t - log_z

    def log_probs(self, terms: Terms, b: torch.Tensor) -> torch.Tensor:
        """ln P(w | context) of every word [B, |V|]."""
        y = b
        for inputs, weight in terms:
            y = torch.addmm(y, inputs, weight.T)
        k = self.word_class.expand(len(y), -1)
        top = y.new_full((len(y), len(self.size)), -torch.inf).scatter_reduce(1, k, y, "amax")
        sums = torch.zeros_like(top).scatter_add_(1, k, torch.exp(y - top.gather(1, k)))
        log_z = (top + sums.log()).gather(1, k)
        return self._class_logprobs(terms).gather(1, k) + y - log_z


class _LogNormalisers(Function):
    """log of the sum over the words w of its class of exp(y_w), for every row of a batch sorted by class: one
    product per class the batch holds (its rows against its words), so no (row, word) pair is gathered with its
    inputs, and the gradient reaches only those words' rows. `words`: the classes' words, class after class;
    `tokens`, `sizes`: rows and words per class; then b, and (input, weight) pairs, each input's rows sorted by class.
    A batch of 256 holds 88 to 96 of 134 classes, so a step makes about 90 small products each way: Python's loop
    costs more than their arithmetic (docs/performance.md)."""

    @staticmethod
    def forward(ctx, words, tokens, sizes, b, *pairs):  # type: ignore[override]
        with torch.autocast(words.device.type, enabled=False):  # small products: float32, as the backward's
            return _LogNormalisers._forward(ctx, words, tokens, sizes, b, *(p.float() for p in pairs))

    @staticmethod
    def _forward(ctx, words, tokens, sizes, b, *pairs):  # type: ignore[no-untyped-def]
        inputs, weights = pairs[0::2], pairs[1::2]
        gathered = [weight.index_select(0, words) for weight in weights]
        xs = [x.split(tokens) for x in inputs]
        os = [g.split(sizes) for g in gathered]
        bs = b.index_select(0, words).split(sizes)
        trains = any(ctx.needs_input_grad)
        log_z, probs = [], []
        for c in range(len(tokens)):
            y = torch.addmm(bs[c], xs[0][c], os[0][c].T)
            for i in range(1, len(inputs)):
                y.addmm_(xs[i][c], os[i][c].T)
            norm = torch.logsumexp(y, 1)
            log_z.append(norm)
            if trains:  # the softmax within the class: the gradient's weights
                probs.append(y.sub_(norm[:, None]).exp_())
        ctx.save_for_backward(words, *inputs, *gathered)
        ctx.shape = tokens, sizes, len(b), [w.shape[0] for w in weights]
        ctx.probs = probs
        return torch.cat(log_z)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        tokens, sizes, vocab, heights = ctx.shape
        words, *saved = ctx.saved_tensors
        inputs, gathered = saved[: len(heights)], saved[len(heights) :]
        d_inputs = [torch.empty_like(x) for x in inputs]
        d_gathered = [torch.zeros_like(g) for g in gathered]
        d_b = grad.new_zeros(len(words))
        xs, os = [x.split(tokens) for x in inputs], [g.split(sizes) for g in gathered]
        dxs, dos = [d.split(tokens) for d in d_inputs], [d.split(sizes) for d in d_gathered]
        dbs, grads = d_b.split(sizes), grad.split(tokens)
        for c, p in enumerate(ctx.probs):
            p.mul_(grads[c][:, None])
            for i in range(len(inputs)):
                torch.mm(p, os[i][c], out=dxs[i][c])
                dos[i][c].addmm_(p.T, xs[i][c])
            dbs[c].add_(p.sum(0))
        ctx.probs = None
        d_weights = [d.new_zeros(height, d.shape[1]).index_add_(0, words, d) for d, height in zip(d_gathered, heights)]
        pairs = [t for pair in zip(d_inputs, d_weights) for t in pair]
        return None, None, None, grad.new_zeros(vocab).index_add_(0, words, d_b), *pairs
