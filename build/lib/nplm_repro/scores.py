"""Every token's score, kept: the natural-log probability of each token of a split, beside the id of the text
(document) it belongs to. A run keeps those of valid and test as its artifact `scores.npz`, from the same exact
evaluation that gives its logged perplexities; every later number is then arithmetic on them: perplexities,
intervals over texts, mixtures, the paper's claims. Nothing re-runs a model to answer a question about its outputs.

numpy only: the report reads them without torch.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nplm_repro.perplexity import perplexity_of_logprobs

ARTIFACT = "scores.npz"  # the run's artifact
KEPT_SPLITS = ("valid", "test")  # what every run keeps (train would be 4.5 times as much, and no report needs it)


@dataclass(frozen=True)
class SplitScores:
    """One split: `logprob[t]` = ln P(w_t | context) (float32: the exact evaluation's own precision for an MLP),
    `text[t]` = the index in `Scores.texts` of the text that token t belongs to."""

    logprob: np.ndarray
    text: np.ndarray

    def __post_init__(self) -> None:
        if self.logprob.shape != self.text.shape or self.logprob.ndim != 1:
            raise ValueError(f"logprob {self.logprob.shape} and text {self.text.shape} must be one equal-length axis")

    @property
    def tokens(self) -> int:
        return len(self.logprob)

    def perplexity(self) -> float:
        """exp of the mean negative log-probability, accumulated in float64 (as every logged perplexity is)."""
        return perplexity_of_logprobs(self.logprob)

    def by_text(self, texts: int) -> tuple[np.ndarray, np.ndarray]:
        """Per text: the sum of its tokens' log-probabilities (float64) and its number of tokens, [texts] each."""
        sums = np.bincount(self.text, weights=self.logprob.astype(np.float64), minlength=texts)
        return sums, np.bincount(self.text, minlength=texts).astype(np.float64)


@dataclass(frozen=True)
class Scores:
    """The kept scores of one run: the names of the corpus's texts and, per split, every token's score."""

    texts: tuple[str, ...]
    splits: Mapping[str, SplitScores]

    @classmethod
    def of(
        cls, texts: tuple[str, ...], logprobs: Mapping[str, np.ndarray], text_ids: Mapping[str, np.ndarray]
    ) -> Scores:
        """From float log-probabilities (any float dtype; stored float32) and the text of every token."""
        return cls(
            tuple(texts),
            {
                s: SplitScores(np.asarray(lp, dtype=np.float32), np.asarray(text_ids[s], np.int32))
                for s, lp in logprobs.items()
            },
        )

    def to_bytes(self) -> bytes:
        arrays = {"texts": np.array(self.texts, dtype=str)}
        for split, kept in self.splits.items():
            arrays |= {f"{split}.logprob": kept.logprob, f"{split}.text": kept.text}
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        return buffer.getvalue()

    def save(self, path: Path) -> Path:
        path.write_bytes(self.to_bytes())
        return path

    @classmethod
    def load(cls, path: Path | str) -> Scores:
        with np.load(path, allow_pickle=False) as found:
            splits = sorted({k.split(".")[0] for k in found.files if "." in k})
            return cls(
                tuple(str(t) for t in found["texts"]),
                {s: SplitScores(found[f"{s}.logprob"], found[f"{s}.text"]) for s in splits},
            )
