"""The data of a trained run as a LightningDataModule: the corpus, its splits and the batches its family reads.

A family says what it reads of a split (its `reads`: eq. (1)'s n-word windows, windows.py's `NgramWindows`; a stream
model's rows or windows, streams.py's `StreamReading`) and nothing of how its loaders are made; `CorpusData` makes
them, for `Trainer.fit` (the training split shuffled by the run's seed, the validation split in order) and
`Trainer.test` (each split scored, in order). A loader is made anew each time Lightning asks for one: its batches
depend only on the corpus, the sizes and the seed (a shuffle is drawn at each pass from seed + pass, set per epoch),
so a run resumed from a checkpoint reads what the run that never stopped read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import lightning as L

from nplm_repro.data.corpus import Corpus


class Reading(Protocol):
    """What a family reads of a split: `batches` of it, shuffled by `seed` for training."""

    def batches(self, corpus: Corpus, split: str, batch_size: int, shuffle: bool = False, seed: int = 0) -> Any: ...


class CorpusData(L.LightningDataModule):
    """`corpus` read as `reads` says: training batches of `batch_size` (shuffled from `seed`), validation and test
    batches of `eval_batch_size` (data.eval_batch_size); `Trainer.test`'s dataloader i is split `scored[i]` (any span
    of the corpus's bounds: a user's text too)."""

    def __init__(
        self,
        corpus: Corpus,
        reads: Reading,
        batch_size: int,
        eval_batch_size: int,
        seed: int = 0,
        scored: Sequence[str] = (),
    ) -> None:
        super().__init__()
        self.corpus, self.reads, self.seed, self.scored = corpus, reads, seed, tuple(scored)
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size

    def train_dataloader(self) -> Any:
        return self.reads.batches(self.corpus, "train", self.batch_size, shuffle=True, seed=self.seed)

    def val_dataloader(self) -> Any:
        return self.reads.batches(self.corpus, "valid", self.eval_batch_size)

    def test_dataloader(self) -> list[Any]:
        return [self.reads.batches(self.corpus, split, self.eval_batch_size) for split in self.scored]
