"""A word-class output layer for eq. (1) (§5.2 of Bengio et al. 2003, as Goodman 2001 and Mikolov et al. 2011 built it).

    P(w | context) = P(k(w) | context) P(w | k(w), context),

both factors softmaxes of the same output inputs z (eq. (1)'s x, when direct, and tanh(d + Hx)): over the classes,
y_k = bc_k + sum_terms z . Kc_k (the class layer, `Kc`, `bc`), and over the words of one class, eq. (1)'s own
y_w = b_w + W_w . x + U_w . tanh(d + Hx) restricted to them. It is an exact, normalised distribution over V.

A token's loss needs its class's row of the class layer and the rows of its class's words only: about |classes| +
|class size| output rows instead of |V|, 45 to 67 times fewer multiply-adds for MLP9 on Brown (exchange, frequency
classes). The classes are grouped by size into buckets of one padded size (`Buckets`: powers of two up to 512
words, multiples of 512 above), and a batch's tokens of one bucket are one batched product, its classes against their
words (`_LogNormalisers`): about ten products a step, whatever the number of classes, where one product per class
made about ninety, each too small to pay for its own call (docs/performance.md). `log_probs` (generation, the
MLflow Model) still computes every word.
"""

from __future__ import annotations

import math
from typing import Any

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
        self._buckets: Buckets | None = None
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
        self._buckets = None
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
        z = terms[0][0] if len(terms) == 1 else torch.cat([inputs for inputs, _ in terms], 1)
        log_z = _LogNormalisers.apply(self.buckets(), k, b, z, *(weight for _, weight in terms))
        return self._class_logprobs(terms).gather(1, k[:, None])[:, 0] + y_t - log_z

    def buckets(self) -> Buckets:
        """The classes' buckets, made from the buffers at first use after they changed (`assign`, a state dict
        loaded, a move to another device)."""
        if self._buckets is None:
            self._buckets = Buckets(self.order, self.start, self.size)
        return self._buckets

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._buckets = None
        super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, *args: Any, **kwargs: Any) -> ClassOutput:
        self._buckets = None
        return super()._apply(*args, **kwargs)

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


BUCKET_LIMIT = 512  # classes up to this many words pad to a power of two, larger ones to a multiple of it
# Token-word pairs of padding that cost about a batched product's calls (forward and backward, about 30 us on 2 cores
# of a Zen 5 EPYC, where a pair of width 100 costs about 8 ns): below it, one product more costs more than it saves
PADDING_PER_PRODUCT = 4096


def padded_size(size: int) -> int:
    """The padded width of a class of `size` words: at most twice its size, and under 50% more above BUCKET_LIMIT."""
    if size <= BUCKET_LIMIT:
        return max(16, 1 << math.ceil(math.log2(size)))
    return -(-size // BUCKET_LIMIT) * BUCKET_LIMIT


class Buckets:
    """The classes grouped by padded size: bucket g's classes' words are the rows of `words[g]` [classes, widths[g]]
    (padding: word 0, with `pad[g]` -inf so that it adds nothing), and each class's bucket and row in it."""

    def __init__(self, order: torch.Tensor, start: torch.Tensor, size: torch.Tensor) -> None:
        sizes = size.tolist()
        padded = [padded_size(s) for s in sizes]
        widths = sorted(set(padded))
        device = order.device
        self.bucket = torch.tensor([widths.index(p) for p in padded], device=device)
        self.row = torch.zeros(len(sizes), dtype=torch.int64, device=device)
        self.words: list[torch.Tensor] = []
        self.pad: list[torch.Tensor] = []
        for width in widths:
            members = [c for c, p in enumerate(padded) if p == width]
            columns = torch.arange(width, device=device)
            starts, counts = start[members], size[members]
            inside = columns < counts[:, None]
            self.row[members] = torch.arange(len(members), device=device)
            self.words.append(torch.where(inside, order[(starts[:, None] + columns).clamp(max=len(order) - 1)], 0))
            self.pad.append(torch.zeros(inside.shape, device=device).masked_fill(~inside, -math.inf))
        self.widths = widths

    def groups(self, bucket: list[int], tokens: list[int]) -> list[tuple[int, int, int, int]]:
        """The products of a batch: its classes present (their `bucket` and `tokens`, by bucket, most tokens
        first) cut into runs of one bucket, each padded to its first class's tokens. A bucket is cut again where
        the padding that the rest of its classes would add (PADDING_PER_PRODUCT token-word pairs) costs more than
        a product's call: a frequent class's tokens then pad only classes of about as many. Each run: its bucket,
        classes, tokens and most tokens in a class."""
        runs: list[tuple[int, int, int, int]] = []
        end = {g: i + 1 for i, g in enumerate(bucket)}  # where each bucket's classes end
        for i, (g, count) in enumerate(zip(bucket, tokens)):
            if runs and runs[-1][0] == g:
                _, classes, total, most = runs[-1]
                if (most - count) * self.widths[g] * (end[g] - i) < PADDING_PER_PRODUCT:  # the rest padded to most
                    runs[-1] = (g, classes + 1, total + count, most)
                    continue
            runs.append((g, 1, count, count))
        return runs


class _LogNormalisers(Function):
    """log of the sum over the words w of a token's class of exp(y_w), y = b + z O^T, for every token of a batch: the
    tokens grouped by bucket (`Buckets`), and in each bucket by class, padded to the bucket's most tokens in a class;
    one batched product per bucket, each class's tokens against its words. The gradient reaches only those words'
    rows of O and b. Arguments: the buckets, each token's class, b, z [B, width] (the output inputs side by side),
    then the output weights whose columns z's are."""

    @staticmethod
    def forward(ctx, buckets, k, b, z, *weights):  # type: ignore[override]
        with torch.autocast(z.device.type, enabled=False):  # small products: float32, as the backward's
            return _LogNormalisers._forward(ctx, buckets, k, b.float(), z.float(), *(w.float() for w in weights))

    @staticmethod
    def _forward(ctx, buckets, k, b, z, *weights):  # type: ignore[no-untyped-def]
        counts = torch.bincount(k, minlength=len(buckets.row))
        present = torch.nonzero(counts)[:, 0]
        # the classes present by bucket, most tokens first; the tokens in that order, class after class
        present = present[torch.argsort(buckets.bucket[present] * (len(k) + 1) - counts[present], stable=True)]
        place = torch.empty_like(counts).index_copy_(0, present, torch.arange(len(present), device=k.device))
        by = torch.argsort(place[k], stable=True)
        tokens, row = counts[present], buckets.row[present]
        groups = buckets.groups(buckets.bucket[present].tolist(), tokens.tolist())
        log_z, saved = z.new_empty(len(k)), []
        done = classes_done = 0
        for g, count, n, most in groups:
            per = tokens[classes_done : classes_done + count]
            rows = row[classes_done : classes_done + count]
            chosen = by[done : done + n]
            which = torch.repeat_interleave(torch.arange(count, device=k.device), per)
            slot = which * most + torch.arange(n, device=k.device) - (torch.cumsum(per, 0) - per)[which]
            Z = z.new_zeros(count * most, z.shape[1]).index_copy_(0, slot, z.index_select(0, chosen))
            words = buckets.words[g].index_select(0, rows).view(-1)
            gathered = [w.index_select(0, words) for w in weights]
            O = (gathered[0] if len(gathered) == 1 else torch.cat(gathered, 1)).view(count, -1, z.shape[1])
            bias = b.index_select(0, words).view(count, 1, -1) + buckets.pad[g].index_select(0, rows)[:, None, :]
            y = torch.baddbmm(bias, Z.view(count, most, -1), O.transpose(1, 2))
            norm = torch.logsumexp(y, -1)
            log_z.index_copy_(0, chosen, norm.view(-1).index_select(0, slot))
            saved.append((chosen, slot, Z, O, words, y.sub_(norm[..., None]).exp_()))  # the softmax in its class
            done, classes_done = done + n, classes_done + count
        ctx.saved = saved
        ctx.shapes = [w.shape for w in weights], len(b)
        return log_z

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        shapes, vocab = ctx.shapes
        d_z = grad.new_zeros(len(grad), sum(shape[1] for shape in shapes))
        d_weights = [grad.new_zeros(shape) for shape in shapes]
        d_b = grad.new_zeros(vocab)
        for chosen, slot, Z, O, words, p in ctx.saved:
            count, most, _ = p.shape
            p.mul_(grad.new_zeros(count * most).index_copy_(0, slot, grad.index_select(0, chosen)).view(count, most, 1))
            d_z.index_copy_(0, chosen, torch.bmm(p, O).view(count * most, -1).index_select(0, slot))
            d_O = torch.bmm(p.transpose(1, 2), Z.view(count, most, -1)).view(len(words), -1)
            for d, part in zip(d_weights, d_O.split([shape[1] for shape in shapes], 1)):
                d.index_add_(0, words, part)
            d_b.index_add_(0, words, p.sum(1).view(-1))
        ctx.saved = None
        return None, None, d_b, d_z, *d_weights
