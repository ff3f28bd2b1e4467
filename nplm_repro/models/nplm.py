"""Eq. (1) of Bengio et al. (2003), with the paper's parameter names.

    y = b + W x + U tanh(d + H x),    P(w_t = i | context) = softmax(y)_i,
    x = (C(w_{t-1}), C(w_{t-2}), ..., C(w_{t-n+1}))   (concatenated word features)

C: |V| x m word features; H: h x (n-1)m and d: h, the tanh hidden layer; U: |V| x h; W: |V| x (n-1)m,
the direct connections (absent when `direct` is off, i.e. W = 0); b: |V| output biases.
h = 0 removes the hidden layer, leaving y = b + W x, so it needs direct connections.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F


class NPLM(nn.Module):
    def __init__(self, vocab_size: int, n: int, m: int, h: int, direct: bool) -> None:
        super().__init__()
        if n < 2 or m < 1 or h < 0:
            raise ValueError(f"need n >= 2, m >= 1, h >= 0 (got n={n}, m={m}, h={h})")
        if h == 0 and not direct:
            raise ValueError("h = 0 leaves no path from context to output unless direct = true")
        self.n, self.m, self.h, self.direct = n, m, h, direct
        inputs = (n - 1) * m
        # "Initialised at random, similarly to neural network weights" (p.1148): U(-1/sqrt(fan_in), ..).
        self.C = nn.Parameter(_uniform(vocab_size, m, fan_in=m))
        self.b = nn.Parameter(torch.zeros(vocab_size))
        self.W = nn.Parameter(_uniform(vocab_size, inputs, fan_in=inputs)) if direct else None
        self.H = nn.Parameter(_uniform(h, inputs, fan_in=inputs)) if h else None
        self.d = nn.Parameter(torch.zeros(h)) if h else None
        self.U = nn.Parameter(_uniform(vocab_size, h, fan_in=h)) if h else None

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """Unnormalised log-probabilities y, [batch, |V|], for contexts [batch, n-1] (w_{t-1} first)."""
        x = F.embedding(context, self.C).flatten(1)
        y = self.b
        if self.W is not None:
            y = torch.addmm(y, x, self.W.T)  # y + x W^T, the sum done inside the product
        if self.H is not None:
            y = torch.addmm(y, torch.tanh(torch.addmm(self.d, x, self.H.T)), self.U.T)
        return y

    def output_terms(
        self, context: torch.Tensor, rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (input, weight) pairs of the output layer, y = b + sum of input @ weight.T: (x, W), (tanh(d + Hx), U).

        For a loss that computes the output layer itself (bf16_loss, sampled_loss), without forming y here;
        `rows(weight, index)`: how C's rows are read (a sampled step's SparseSGD.rows: its lazy decay applied, a
        gradient of the context words' rows only); by default as they are.
        """
        x = (F.embedding(context, self.C) if rows is None else rows(self.C, context)).flatten(1)
        terms = [(x, self.W)] if self.W is not None else []
        if self.H is not None:
            terms.append((torch.tanh(self.d + x @ self.H.T), self.U))
        return terms

    def decayed(self) -> list[nn.Parameter]:
        """The weights under weight decay: C, H, U, W, never the biases b and d (p.1142); C only when it is trained
        (fixed features are frozen: no gradient, no decay)."""
        return [p for p in (self.C, self.H, self.U, self.W) if p is not None and p.requires_grad]

    def word_rows(self) -> list[nn.Parameter]:
        """The decayed weights with a row per word (C, U, W): a sampled step reads and changes only some of their
        rows, so their decay can wait until a row is read (SparseSGD's lazy groups)."""
        return [p for p in (self.C, self.U, self.W) if p is not None and p.requires_grad]

    def biases(self) -> list[nn.Parameter]:
        return [p for p in (self.b, self.d) if p is not None]


def _uniform(rows: int, cols: int, fan_in: int) -> torch.Tensor:
    bound = 1.0 / math.sqrt(fan_in)
    return torch.empty(rows, cols).uniform_(-bound, bound)
