"""The three splits, contiguous in stream order (paper §4, p. 1147). Torch-free, so the report can name them."""

from __future__ import annotations

from nplm_repro.errors import NplmError

SPLITS = ("train", "valid", "test")


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
