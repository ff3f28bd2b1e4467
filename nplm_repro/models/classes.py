"""A word-class output layer for eq. (1) (§5.2 of Bengio et al. 2003, as Goodman 2001 and Mikolov et al. 2011 built it).

    P(w | context) = P(k(w) | context) P(w | k(w), context),

both factors softmaxes of the same output inputs z (eq. (1)'s x, when direct, and tanh(d + Hx)): over the classes,
y_k = bc_k + sum_terms z . Kc_k (the class layer, `Kc`, `bc`), and over the words of one class, eq. (1)'s own
y_w = b_w + W_w . x + U_w . tanh(d + Hx) restricted to them. It is an exact, normalised distribution over V.

A token's loss needs its class's row of the class layer and the rows of its class's words only: about |classes| +
|class size| output rows instead of |V|. The (token, word of its class) pairs of a batch are gathered at once, so a
batch costs sum over its tokens of their class sizes, whatever the classes' sizes; `log_probs` (generation, the
MLflow Model) still computes every word.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from nplm_repro.models.nplm import _uniform

Terms = list[tuple[torch.Tensor, torch.Tensor]]  # (input [B, width], its output weight [|V|, width]): NPLM.output_terms


class ClassOutput(nn.Module):
    """The class layer and the class of every word; `classes` None: a placeholder that a state dict fills."""

    def __init__(self, vocab_size: int, count: int, widths: list[int], classes: torch.Tensor | None = None) -> None:
        super().__init__()
        self.Kc = nn.ParameterList(_uniform(count, width, fan_in=sum(widths)) for width in widths)
        self.bc = nn.Parameter(torch.zeros(count))
        for name, size in (("word_class", vocab_size), ("order", vocab_size), ("position", vocab_size)):
            self.register_buffer(name, torch.zeros(size, dtype=torch.int64))
        for name in ("start", "size"):
            self.register_buffer(name, torch.zeros(count, dtype=torch.int64))
        if classes is not None:
            self.assign(classes)

    @torch.no_grad()
    def assign(self, classes: torch.Tensor) -> None:
        """Words sorted by class (`order`), each class's span of that order (`start`, `size`), each word's place in
        its class (`position`)."""
        self.word_class.copy_(classes)
        self.order.copy_(torch.argsort(classes, stable=True))
        self.size.copy_(torch.bincount(classes, minlength=len(self.size)))
        self.start.copy_(torch.cumsum(self.size, 0) - self.size)
        self.position[self.order] = torch.arange(len(classes)) - self.start[classes[self.order]]

    def _class_logprobs(self, terms: Terms) -> torch.Tensor:
        y = self.bc
        for (inputs, _), weight in zip(terms, self.Kc):
            y = torch.addmm(y, inputs, weight.T)
        return F.log_softmax(y, 1)

    def token_logprob(self, terms: Terms, b: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """ln P(target | context) of each row [B], from its class's rows only."""
        k = self.word_class[target]
        sizes = self.size[k]
        token = torch.repeat_interleave(torch.arange(len(target), device=target.device), sizes)
        offset = torch.arange(len(token), device=target.device) - (torch.cumsum(sizes, 0) - sizes)[token]
        words = self.order[self.start[k][token] + offset]
        y = b.index_select(0, words)  # index_select, not indexing: its gradient is an index_add, not a sort
        for inputs, weight in terms:
            y = y + (inputs.index_select(0, token) * weight.index_select(0, words)).sum(1)
        width = int(sizes.max())
        within = y.new_full((len(target) * width,), -torch.inf).index_copy(0, token * width + offset, y)
        word = F.log_softmax(within.view(len(target), width), 1).gather(1, self.position[target][:, None])[:, 0]
        return self._class_logprobs(terms).gather(1, k[:, None])[:, 0] + word

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
