"""One definition of perplexity for every model here, MLPs and n-grams alike (the paper's section 4, p. 1147)."""

from __future__ import annotations

import numpy as np


def perplexity_of(probs: np.ndarray) -> float:
    """exp of the mean negative log-probability, accumulated in float64."""
    return perplexity_of_logprobs(np.log(np.asarray(probs, dtype=np.float64)))


def perplexity_of_logprobs(logprob: np.ndarray) -> float:
    """The same from natural-log probabilities (kept scores are float32), their mean accumulated in float64."""
    return float(np.exp(-np.mean(logprob, dtype=np.float64)))
