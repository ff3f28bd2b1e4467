"""A model family written outside the package, as docs/extending.md shows: the add-one unigram, a counted family.

It subclasses the counted kind (`NgramModel`: `fit` on the training split, `window_probs` for every token,
`describe`) and says the rest of the family contract of nplm_repro/family.py (`family`, `label`, `colour`, `rules`,
`check`); nothing in nplm_repro names it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nplm_repro.baselines.ngram import NgramModel
from nplm_repro.data.corpus import Corpus
from nplm_repro.errors import NplmError
from nplm_repro.rules import Rule, number


class Unigram(NgramModel):
    family = "unigram"
    label = "unigram"
    colour = "C5"
    order = 1

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        return {"model.add": number(0, low_open=True)}

    @classmethod
    def check(cls, cfg: Any) -> None:
        if cfg.model.get("n") is not None:
            raise NplmError("model.n: a unigram reads no context")

    def __init__(self, add: float = 1.0) -> None:
        self.add = add

    def fit(self, corpus: Corpus) -> Unigram:
        start, end = corpus.bounds["train"]
        counts = np.bincount(corpus.ids[start:end].numpy(), minlength=corpus.vocab_size) + self.add
        self.probs = counts / counts.sum()
        self.fingerprint = corpus.fingerprint
        return self

    def window_probs(self, rows: np.ndarray) -> np.ndarray:
        return self.probs[rows[:, -1]]

    def describe(self) -> dict[str, object]:
        return {"add": self.add, "types": len(self.probs)}
