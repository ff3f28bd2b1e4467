"""n-gram windows over the id stream, built with tensor views: no Python loop per example.

Every token of a split is a target. Its context is the n-1 tokens before it in the *stream*, so the first
tokens of the validation and test splits see the end of the previous split, as in one running text. Only
the very first tokens of the stream have no history; their missing context is filled with `<eot>`, as if
a text had just ended (which is what precedes every other text).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from nplm_repro.data.corpus import END_OF_TEXT, Corpus


def windows(ids: torch.Tensor, start: int, end: int, n: int, pad_id: int) -> torch.Tensor:
    """[end - start, n] view: row i is (w_{t-n+1}, ..., w_{t-1}, w_t) for t = start + i."""
    left = max(0, start - (n - 1))
    stream = ids[left:end]
    missing = (n - 1) - (start - left)
    if missing:
        stream = torch.cat([stream.new_full((missing,), pad_id), stream])
    return stream.unfold(0, n, 1)


def split_context(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(context, target): context columns in the paper's order w_{t-1}, ..., w_{t-n+1}."""
    return batch[:, :-1].flip(1), batch[:, -1]


class WindowBatches:
    """Mini-batches of (context, target) over all windows of a split; reshuffled on every pass.

    Pass k of a shuffled loader uses the permutation drawn from `seed + k`, so a run is reproducible. The
    module sets k to the epoch before each epoch (`set_epoch`), so a run resumed from a checkpoint sees the
    same batches as one that never stopped.

    With `shard` on, in a distributed run (DDP) process r of W takes batches r, r + W, r + 2W, ... of the
    pass (the same number in every process, so up to W - 1 batches of a pass are left out): one DDP step
    on W processes sees exactly the windows of one batch of W x batch_size in a single process.
    """

    def __init__(
        self,
        rows: torch.Tensor,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        shard: bool = False,
    ) -> None:
        self.rows, self.batch_size, self.shuffle, self.seed, self.shard = rows, batch_size, shuffle, seed, shard
        self.passes = 0

    def set_epoch(self, epoch: int) -> None:
        self.passes = epoch

    def to(self, device: torch.device | str) -> WindowBatches:
        """Keep the windows on `device` (a GPU): every batch is then gathered there, with no copy per batch."""
        self.rows = self.rows.to(device)
        return self

    def _process(self) -> tuple[int, int]:
        """(rank, world size) of this process when sharding in an initialised process group, else (0, 1)."""
        if self.shard and torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def __len__(self) -> int:
        _, world = self._process()
        batches = math.ceil(len(self.rows) / self.batch_size)
        return batches if world == 1 else batches // world

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.passes)  # on the CPU: the same on any device
            order = torch.randperm(len(self.rows), generator=generator).to(self.rows.device)
        else:
            order = None
        self.passes += 1
        rank, world = self._process()
        for batch in range(rank, len(self) * world, world):
            chunk = slice(batch * self.batch_size, (batch + 1) * self.batch_size)
            yield split_context(self.rows[order[chunk]] if order is not None else self.rows[chunk])


def loader(
    corpus: Corpus, split: str, n: int, batch_size: int, shuffle: bool = False, seed: int = 0, shard: bool = True
) -> WindowBatches:
    """Batches of a split: shuffled ones are for training, and are split between DDP's processes (with `shard`)."""
    start, end = corpus.bounds[split]
    rows = windows(corpus.ids, start, end, n, pad_id=corpus.vocab.index(END_OF_TEXT))
    return WindowBatches(rows, batch_size, shuffle=shuffle, seed=seed, shard=shuffle and shard)


@dataclass(frozen=True)
class NgramWindows:
    """What eq. (1) reads of a split (its family's `reads`): windows of `n` words, whose batches data/module.py's
    CorpusData builds."""

    n: int
    shard: bool = True  # False: every process reads every training batch (processes that split the output units)

    def batches(
        self, corpus: Corpus, split: str, batch_size: int, shuffle: bool = False, seed: int = 0
    ) -> WindowBatches:
        return loader(corpus, split, self.n, batch_size, shuffle=shuffle, seed=seed, shard=self.shard)
