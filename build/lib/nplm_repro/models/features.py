"""Fixed word features for C: the paper's "unsuccessful" alternative to learning them (p.1141).

The paper tried initialising the features with the first principal components of co-occurrence counts (an
LSI-like start) and found learning them jointly with the rest much better. `model.features` names where C comes
from: `learned` (trained with the rest, the paper's model), `fixed_lsi` (this module, then frozen) or
`fixed_random` (frozen at its random start). What is counted, exactly: for every training token w and every word v
at distance 1 .. `window` before or after it in the training stream, one count for (w, v); the counts are
log-scaled (log(1 + count)), and C's columns are the first m left singular vectors of that |V| x |V| matrix (its
first m principal directions, over words), each scaled to the spread of a column of the random start. A word
never seen in training has no counts, and features of 0.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import sparse
from scipy.sparse.linalg import svds

FEATURES = ("learned", "fixed_lsi", "fixed_random")


def cooccurrence(ids: np.ndarray, vocab_size: int, window: int) -> sparse.csr_matrix:
    """log(1 + count) of (word, context word) pairs at distance 1 .. `window` on either side, float64 [|V|, |V|]."""
    rows, cols = [], []
    for offset in range(1, window + 1):
        rows += [ids[:-offset], ids[offset:]]
        cols += [ids[offset:], ids[:-offset]]
    counts = sparse.coo_matrix(
        (np.ones(sum(len(r) for r in rows)), (np.concatenate(rows), np.concatenate(cols))),
        shape=(vocab_size, vocab_size),
    ).tocsr()  # duplicates are summed
    counts.data = np.log1p(counts.data)
    return counts


def lsi_features(ids: np.ndarray, vocab_size: int, window: int, m: int, seed: int) -> torch.Tensor:
    """C [|V|, m], float32: the first m left singular vectors of `cooccurrence`, largest first, each scaled to the
    root mean square of a column of the random start U(-1/sqrt(m), 1/sqrt(m)), 1/sqrt(3m). Scaling columns keeps
    their span; weighing words (rows) would not."""
    counts = cooccurrence(ids, vocab_size, window)
    if m >= min(counts.shape):
        raise ValueError(f"model.m={m} features need more than {m} words in the vocabulary (it has {vocab_size})")
    u, s, _ = svds(counts, k=m, rng=np.random.default_rng(seed))
    u = u[:, np.argsort(s)[::-1]]  # svds returns the singular values in increasing order
    u *= (1.0 / math.sqrt(3 * m)) / np.sqrt((u**2).mean(axis=0))
    return torch.from_numpy(u.astype(np.float32))
