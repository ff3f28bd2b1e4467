"""The three splits, contiguous in stream order (paper §4, p. 1147). Torch-free, so the report can name them."""

from __future__ import annotations

from dataclasses import dataclass

from nplm_repro.errors import NplmError

SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Sizes:
    """What a job's values are checked against before any work (tracking/config_checks.py `check_sizes`, and a model
    family's own `check_sizes`): the training split's tokens and its distinct words. Before the corpus is read they
    are what the config says (`data.split.train`, None where it leaves the size to the corpus; `words` None); once
    it is read, before the store is opened, the corpus's (`read`)."""

    train: int | None
    words: int | None = None
    read: bool = False

    def train_said(self) -> str:
        """The training split's size as a refusal names it: its key as given, or the tokens read."""
        return f"{self.train:,} tokens" if self.read else f"data.split.train={self.train}"


def split_bounds(total: int, train: int, valid: int, test: int | None) -> dict[str, tuple[int, int]]:
    """Contiguous spans in stream order; test=None takes the rest."""
    rest = total - train - valid if test is None else test
    if min(train, valid, rest) <= 0 or train + valid + rest > total:
        asked = f"data.split.train={train:,}, data.split.valid={valid:,}" + (
            ", data.split.test=the rest" if test is None else f", data.split.test={test:,}"
        )
        raise NplmError(f"the corpus has {total:,} tokens, too few for the requested splits {asked}")
    test = rest
    return {"train": (0, train), "valid": (train, train + valid), "test": (train + valid, train + valid + test)}
