"""Mixture weights fitted by EM: how the paper combines probability estimates (paper §4.1, pp. 1147-1148, and "Mixture of models", p. 1143).

The deleted-interpolation trigram mixes its uniform, unigram, bigram and trigram estimates, and an MLP is
mixed with that trigram (weight fixed at 0.5, one learned weight, or one set per context-frequency bin).
All are the same problem: given each component's probability of every held-out token, find the weights
that maximise the held-out likelihood, separately in each bin. The log-likelihood is concave in the
weights and EM climbs it monotonically, so one vectorised routine serves every case.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nplm_repro.errors import NplmError


@dataclass(frozen=True)
class MixtureFit:
    """Result of `fit_mixture`; `log_likelihoods[0]` is at the initial weights, then one per EM update."""

    weights: np.ndarray  # [n_bins, K], each row sums to 1
    iterations: int  # EM updates performed
    converged: bool  # the relative change of the log-likelihood fell below the tolerance
    log_likelihoods: np.ndarray  # total natural-log likelihood of the tokens, float64
    tokens_per_bin: np.ndarray  # [n_bins] how many tokens each bin's weights were fitted on


def mixture_probs(probs: np.ndarray, weights: np.ndarray, bins: np.ndarray | None = None) -> np.ndarray:
    """Per-token mixture probability sum_k weights[bin_t, k] * probs[t, k] (float64)."""
    probs = np.asarray(probs, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64).reshape(-1, probs.shape[1])
    rows = weights[np.zeros(len(probs), dtype=np.int64) if bins is None else bins]
    return np.einsum("tk,tk->t", probs, rows)


def fit_mixture(
    probs: np.ndarray,
    bins: np.ndarray | None = None,
    n_bins: int | None = None,
    tol: float = 1e-6,
    max_iter: int = 1000,
    init: np.ndarray | None = None,
) -> MixtureFit:
    """Weights per bin maximising sum_t log sum_k w[bin_t, k] probs[t, k], by EM from `init` (uniform).

    Stops when an update changes the log-likelihood by less than `tol` relative to it, or after `max_iter`
    updates. A bin without tokens keeps its initial weights (nothing to fit them on); a component with
    initial weight 0 stays at 0, which is why the default starts from uniform weights.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or len(probs) == 0:
        raise NplmError(f"fit_mixture needs a non-empty [tokens, components] matrix, got shape {probs.shape}")
    if (probs < 0).any() or not np.isfinite(probs).all():
        raise NplmError("fit_mixture: component probabilities must be finite and >= 0")
    tokens, k = probs.shape
    bins = np.zeros(tokens, dtype=np.int64) if bins is None else np.asarray(bins, dtype=np.int64)
    n_bins = int(bins.max()) + 1 if n_bins is None else n_bins
    if bins.shape != (tokens,) or bins.min() < 0 or bins.max() >= n_bins:
        raise NplmError(f"fit_mixture: bins must be {tokens} integers in [0, {n_bins})")
    weights = np.full((n_bins, k), 1.0 / k) if init is None else np.array(init, dtype=np.float64).reshape(-1, k)
    if weights.shape != (n_bins, k) or (weights < 0).any() or not np.allclose(weights.sum(1), 1.0):
        raise NplmError(f"fit_mixture: init must be [{n_bins}, {k}] non-negative rows summing to 1")
    counts = np.bincount(bins, minlength=n_bins)
    seen = counts > 0

    joint = probs * weights[bins]
    total = joint.sum(1)
    if (total <= 0).any():
        first = int(np.argmin(total > 0))
        raise NplmError(f"fit_mixture: token {first} has probability 0 under the initial mixture")
    history = [np.log(total).sum()]
    converged = False
    iterations = 0
    while iterations < max_iter and not converged:
        posterior = joint / total[:, None]
        sums = np.stack([np.bincount(bins, weights=posterior[:, j], minlength=n_bins) for j in range(k)], 1)
        weights[seen] = sums[seen] / counts[seen, None]
        joint = probs * weights[bins]
        total = joint.sum(1)
        history.append(np.log(total).sum())
        iterations += 1
        converged = abs(history[-1] - history[-2]) <= tol * abs(history[-1])
    return MixtureFit(weights, iterations, converged, np.array(history), counts)
