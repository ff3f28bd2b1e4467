"""Batches of a split as one running stream, for models that read a context of any length (LSTM, Transformer).

Every token of a split is a target once. Its input is the token before it in the stream, so the first token of
the validation and test splits is predicted from the last token of the split before it, as eq. (1)'s windows see
it; the very first token of the stream follows `<eot>`, as every text follows the end of the one before
(data/windows.py does the same for the MLP). Unlike windows, a split's evaluation starts from nothing else: a
recurrent state starts at zero at the split's start, a Transformer's window holds only that split's tokens.

- `Bptt`: Zaremba et al.'s (2014) batching. Training cuts the stream into `rows` contiguous rows and walks them
  in chunks of `length` steps, so batch i continues batch i-1 in each row and a recurrent state carries across
  batches (truncated back-propagation through time). Evaluation is one row: every token once, in order.
- `Chunks`: a Transformer's training windows, non-overlapping chunks of `length` from an offset drawn anew each
  pass, shuffled (seed + pass).
- `Sliding`: a Transformer's evaluation. Windows of `length` tokens move by `stride`; each scores only the tokens
  the windows before it did not, so every token is scored exactly once with at least `length - stride` tokens of
  context, or all of the split before it when that is less.

`StreamReading` is what a stream model reads of a split (its family's `reads`): the LSTM's rows or the Transformer's
windows, and how long.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from nplm_repro.data.corpus import END_OF_TEXT, Corpus

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # inputs [B, T], targets [B, T], scored [B, T] (bool)


def inputs_targets(corpus: Corpus, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The split's targets and, at each, the token before it in the stream (`<eot>` before the very first)."""
    start, end = corpus.bounds[split]
    if start:
        return corpus.ids[start - 1 : end - 1].clone(), corpus.ids[start:end].clone()
    first = torch.tensor([corpus.vocab.index(END_OF_TEXT)], dtype=corpus.ids.dtype)
    return torch.cat([first, corpus.ids[: end - 1]]), corpus.ids[start:end].clone()


class StreamBatches:
    """Shared by the three: a pass number for shuffles (`set_epoch`), and the device the tokens live on."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, length: int, seed: int = 0) -> None:
        if length < 1:
            raise ValueError(f"a chunk needs at least one token (length={length})")
        self.inputs, self.targets, self.length, self.seed = inputs, targets, length, seed
        self.passes = 0

    def set_epoch(self, epoch: int) -> None:
        self.passes = epoch

    def to(self, device: torch.device | str) -> StreamBatches:
        self.inputs, self.targets = self.inputs.to(device), self.targets.to(device)
        return self

    @property
    def tokens(self) -> int:
        return len(self.targets)


class Bptt(StreamBatches):
    """`rows` parallel contiguous rows walked `length` steps at a time (the tail that does not fill a row is left
    out of training; with rows=1, evaluation, nothing is left out)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, rows: int, length: int) -> None:
        super().__init__(inputs, targets, length)
        self.rows = rows
        self.columns = len(targets) // rows
        if self.columns == 0:
            raise ValueError(f"{len(targets)} tokens cannot fill {rows} rows")

    def __len__(self) -> int:
        return -(-self.columns // self.length)

    def __iter__(self) -> Iterator[Batch]:
        used = self.rows * self.columns
        x = self.inputs[:used].view(self.rows, self.columns)
        y = self.targets[:used].view(self.rows, self.columns)
        self.passes += 1
        for at in range(0, self.columns, self.length):
            xs, ys = x[:, at : at + self.length], y[:, at : at + self.length]
            yield xs, ys, torch.ones_like(ys, dtype=torch.bool)


class Chunks(StreamBatches):
    """Shuffled non-overlapping chunks of `length` tokens, `rows` to a batch, from an offset drawn each pass."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, rows: int, length: int, seed: int) -> None:
        super().__init__(inputs, targets, length, seed)
        self.rows = rows
        if len(targets) < length:
            raise ValueError(f"{len(targets)} tokens cannot fill one window of {length}")

    def _chunks(self) -> int:
        return len(self.targets) // self.length

    def __len__(self) -> int:
        return -(-self._chunks() // self.rows)

    def __iter__(self) -> Iterator[Batch]:
        generator = torch.Generator().manual_seed(self.seed + self.passes)  # on the CPU: the same on any device
        self.passes += 1
        spare = len(self.targets) - self._chunks() * self.length
        offset = int(torch.randint(0, spare + 1, (1,), generator=generator))
        starts = offset + self.length * torch.randperm(self._chunks(), generator=generator)
        steps = torch.arange(self.length)
        for at in range(0, len(starts), self.rows):
            index = (starts[at : at + self.rows, None] + steps).to(self.inputs.device)
            ys = self.targets[index]
            yield self.inputs[index], ys, torch.ones_like(ys, dtype=torch.bool)


class Sliding(StreamBatches):
    """Windows of `length` tokens every `stride`, `rows` to a batch; `scored` marks the tokens each window adds."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, rows: int, length: int, stride: int) -> None:
        super().__init__(inputs, targets, length)
        if not 1 <= stride <= length:
            raise ValueError(f"stride {stride}: between 1 and the window's {length} tokens")
        self.rows, self.stride = rows, stride
        size = len(targets)
        self.width = min(length, size)
        starts = list(range(0, max(size - self.width, 0) + 1, stride))
        if starts[-1] + self.width < size:  # the last window ends with the split
            starts.append(size - self.width)
        self.starts = starts

    def __len__(self) -> int:
        return -(-len(self.starts) // self.rows)

    def __iter__(self) -> Iterator[Batch]:
        steps = torch.arange(self.width)
        done = torch.tensor([0] + [s + self.width for s in self.starts[:-1]])  # scored before each window
        starts = torch.tensor(self.starts)
        for at in range(0, len(starts), self.rows):
            index = starts[at : at + self.rows, None] + steps
            scored = index >= done[at : at + self.rows, None]
            index = index.to(self.inputs.device)
            yield self.inputs[index], self.targets[index], scored.to(self.inputs.device)


@dataclass(frozen=True)
class StreamReading:
    """A split as a stream model reads it, `bptt` (the LSTM's rows, a recurrent state carried across batches) or
    windows (the Transformer's), `length` tokens long."""

    length: int
    bptt: bool

    def batches(
        self, corpus: Corpus, split: str, batch_size: int, shuffle: bool = False, seed: int = 0
    ) -> StreamBatches:
        """For training (`shuffle`), `batch_size` rows of `length` tokens; for evaluation, about `batch_size` tokens a
        batch (data.eval_batch_size), in order: one row of bptt walked `batch_size` steps at a time, or sliding windows
        of `length` with stride length / 2."""
        inputs, targets = inputs_targets(corpus, split)
        length = self.length
        if self.bptt:
            return Bptt(inputs, targets, batch_size, length) if shuffle else Bptt(inputs, targets, 1, batch_size)
        if shuffle:
            return Chunks(inputs, targets, batch_size, length, seed)
        return Sliding(inputs, targets, max(batch_size // length, 1), length, max(length // 2, 1))
