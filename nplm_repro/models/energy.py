"""The energy-minimization network of §5.1 of Bengio et al. (2003): the output word as a feature vector too.

    E(w_t, context) = v . tanh(d + H x) + sum_{i=0}^{n-1} b_{w_{t-i}},    P(w_t | context) = softmax over w_t of -E,
    x = (C(w_t), C(w_{t-1}), ..., C(w_{t-n+1})).

The paper gives no number for it. Written as H x = H_ctx x_ctx + H_out C(w_t), the context's part a = d + H_ctx x_ctx
is one h-vector per token and H_out C(w) one h-vector per word, shared by every token (|V| x m x h once per batch),
so a (token, word) pair costs an h-wide add, a tanh and a dot with v: |V| x h elementwise operations per token,
about the multiply-adds of eq. (1)'s output layer, but no matrix product, so several times slower. The context
words' biases b_{w_{t-1}} .. are the same for every candidate w_t: the softmax cancels them, so only b_{w_t} is
computed. Direct connections (`direct`) enter as in eq. (1): -E gains W_w . x_ctx, a row of W per output word.
Exact scores go through the vocabulary in chunks of `CHUNK` values per token block, never |V| x h per token at once.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from nplm_repro.models.nplm import _uniform
from nplm_repro.models.sampled_loss import Rows, dense_rows, sparse_rows

CHUNK = 1 << 22  # tokens x words x h values computed at once (16 MiB of float32)


class EnergyNPLM(nn.Module):
    def __init__(self, vocab_size: int, n: int, m: int, h: int, direct: bool) -> None:
        super().__init__()
        if n < 2 or m < 1 or h < 1:
            raise ValueError(f"the energy network needs n >= 2, m >= 1, h >= 1 (got n={n}, m={m}, h={h})")
        self.n, self.m, self.h, self.direct = n, m, h, direct
        inputs = (n - 1) * m
        self.C = nn.Parameter(_uniform(vocab_size, m, fan_in=m))
        self.b = nn.Parameter(torch.zeros(vocab_size))
        self.H = nn.Parameter(_uniform(h, inputs + m, fan_in=inputs + m))  # context columns, then C(w_t)'s
        self.d = nn.Parameter(torch.zeros(h))
        self.v = nn.Parameter(_uniform(1, h, fan_in=h)[0])
        self.W = nn.Parameter(_uniform(vocab_size, inputs, fan_in=inputs)) if direct else None

    def _context(self, context: torch.Tensor, rows: Rows = dense_rows) -> tuple[torch.Tensor, torch.Tensor]:
        """x_ctx [B, (n-1)m] and a = d + H_ctx x_ctx [B, h]."""
        x = rows(self.C, context).flatten(1)
        return x, torch.addmm(self.d, x, self.H[:, : x.shape[1]].T)

    def _words(self, words: torch.Tensor | None = None, rows: Rows = dense_rows) -> torch.Tensor:
        """H_out C(w) [len(words), h] (every word when `words` is None)."""
        features = self.C if words is None else rows(self.C, words)
        return features @ self.H[:, -self.m :].T

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """Unnormalised log-probabilities -E, [batch, |V|], for contexts [batch, n-1] (w_{t-1} first); the words in
        chunks of CHUNK values, each recomputed in the backward pass rather than kept (exact training)."""
        x, a = self._context(context)
        g = self._words()
        step = max(1, CHUNK // max(1, len(a) * self.h))
        parts = []
        for at in range(0, len(g), step):
            block = g[at : at + step]
            if torch.is_grad_enabled():  # keep the inputs of the tanh, not its [B, block, h] output
                parts.append(checkpoint(_negative_energy, a, block, self.v, use_reentrant=False))
            else:
                parts.append(_negative_energy(a, block, self.v))
        y = torch.cat(parts, 1) - self.b
        return y if self.W is None else torch.addmm(y, x, self.W.T)

    def sampled_outputs(
        self, context: torch.Tensor, target: torch.Tensor, words: torch.Tensor, rows: Rows = sparse_rows
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-E of each row's target [B] and of `words` for every row [B, len(words)], for sampled training: only
        those words' C, W and b rows get a gradient; C's and W's read by `rows` (SparseSGD.rows in training: lazy
        decay applied, gradients sparse)."""
        x, a = self._context(context, rows)
        g = self._words(torch.cat([target, words]), rows)
        y_t = _minus_v_tanh(2 * (a + g[: len(target)]), self.v) - self.b[target]
        if self.W is not None:
            y_t = y_t + (x * rows(self.W, target)).sum(1)
        y_s = _negative_energy(a, g[len(target) :], self.v) - self.b[words]  # B x k x h: small, no chunks needed
        if self.W is not None:
            y_s = y_s + x @ rows(self.W, words).T
        return y_t, y_s

    def decayed(self) -> list[nn.Parameter]:
        """The weights under weight decay, as eq. (1)'s: C, H, v, W; never the biases b and d."""
        return [p for p in (self.C, self.H, self.v, self.W) if p is not None and p.requires_grad]

    def word_rows(self) -> list[nn.Parameter]:
        """The decayed weights with a row per word (C, W), as NPLM.word_rows."""
        return [p for p in (self.C, self.W) if p is not None and p.requires_grad]

    def biases(self) -> list[nn.Parameter]:
        return [self.b, self.d]


def _negative_energy(a: torch.Tensor, g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """-v . tanh(a_i + g_j) for every row i of a [B, h] and j of g [J, h]: [B, J]."""
    return _minus_v_tanh(torch.add((2 * a)[:, None, :], (2 * g)[None, :, :]), v)


def _minus_v_tanh(twice: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """-v . tanh(z) over the last dimension, from `twice` = 2z, overwritten. tanh(z) = 2 sigmoid(2z) - 1: the same
    function to float32 rounding (an absolute error of about 1e-7), but on CPU torch's sigmoid is 2.4 times faster
    than its tanh (MKL's), and the tanh of every (token, word) pair is most of this network's time, in sampled
    training and in exact scoring alike. In place: the sigmoid's gradient needs only its output."""
    return v.sum() - 2 * (twice.sigmoid_() @ v)
