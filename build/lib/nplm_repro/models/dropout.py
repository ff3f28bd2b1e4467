"""The recurrent network's regularisers (Merity, Keskar & Socher 2017, "Regularizing and Optimizing LSTM Language
Models", AWD-LSTM), each a function of a tensor and a rate, the identity at rate 0 or in evaluation:

- `locked`: dropout with one mask over the time steps of a sequence (variational dropout, Gal & Ghahramani 2016):
  a unit dropped at one step is dropped at every step of the batch's rows, so the noise cannot average out over time;
- `words`: dropout of whole words from the embedding (Gal & Ghahramani 2016, AWD-LSTM's `dropoute`): a dropped
  word's every occurrence in the batch reads a zero vector;
- `dropconnect`: dropout of single weights (Wan et al. 2013), applied to the hidden-to-hidden matrices (weight drop,
  AWD-LSTM's `wdrop`) once a batch, so the recurrence keeps one connection pattern through the batch's steps.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def locked(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """x [B, T, W] with one mask [B, 1, W] for every step, scaled by 1 / (1 - p)."""
    if not training or p == 0.0:
        return x
    mask = x.new_empty(x.shape[0], 1, x.shape[2]).bernoulli_(1.0 - p) / (1.0 - p)
    return x * mask


def words(weight: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """The embedding matrix [|V|, W] with whole rows dropped, the others scaled by 1 / (1 - p)."""
    if not training or p == 0.0:
        return weight
    mask = weight.new_empty(weight.shape[0], 1).bernoulli_(1.0 - p) / (1.0 - p)
    return weight * mask


def dropconnect(weight: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """A weight matrix with single weights dropped (F.dropout's mask and scaling)."""
    return F.dropout(weight, p, training) if p else weight
