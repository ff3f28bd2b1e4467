"""An MLP mixed with the interpolated trigram (paper §2, "Mixture of models", p. 1143).

    P(w_t | context) = lambda(q_t) P_mlp(w_t | context) + (1 - lambda(q_t)) P_trigram(w_t | context)

`model.mix`: `none`; `fixed` (lambda = 0.5, the paper's tables); `learned` (one lambda, by EM on the
validation split); `context` (one lambda per context-frequency bin q_t of the trigram, by EM on
validation, as the trigram combines its own parts). The MLP is neither retrained nor run: the mixture is
arithmetic on its kept score of every validation and test token (nplm_repro/scores.py).
"""

from __future__ import annotations

import numpy as np
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from nplm_repro.baselines.em import MixtureFit, fit_mixture, mixture_probs
from nplm_repro.baselines.ngram import DeletedInterpolation, split_windows
from nplm_repro.data.corpus import Corpus
from nplm_repro.errors import NplmError
from nplm_repro.perplexity import perplexity_of
from nplm_repro.scores import KEPT_SPLITS, Scores

MIX_MODES = ("none", "fixed", "learned", "context")


class TrigramMixture:
    """Fit lambda on validation, then mix any tokens; weights[q] = (lambda, 1 - lambda) of bin q. Tokens come as
    their trigram windows (`ngram.split_windows`), so a user's text mixes as a split does."""

    def __init__(self, mode: str, trigram: DeletedInterpolation) -> None:
        if mode not in MIX_MODES[1:]:
            raise ValueError(f"mix mode must be one of {MIX_MODES[1:]}, not {mode!r}")
        self.mode, self.trigram = mode, trigram
        self.fit_result: MixtureFit | None = None

    def _bins(self, rows: np.ndarray) -> np.ndarray | None:
        return self.trigram.window_bins(rows) if self.mode == "context" else None

    def fit(self, mlp_valid: np.ndarray, rows: np.ndarray) -> TrigramMixture:
        """`mlp_valid`: the MLP's P of every validation token; `rows`: their trigram windows."""
        if self.mode == "fixed":
            self.weights = np.array([[0.5, 0.5]])
            return self
        probs = np.column_stack([mlp_valid, self.trigram.window_probs(rows)])
        n_bins = self.trigram.n_bins if self.mode == "context" else 1
        self.fit_result = fit_mixture(probs, self._bins(rows), n_bins)
        self.weights = self.fit_result.weights
        return self

    def probs(self, mlp: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """float64 [tokens]: the mixed probability of every token, from the MLP's and the trigram windows."""
        probs = np.column_stack([mlp, self.trigram.window_probs(rows)])
        return mixture_probs(probs, self.weights, self._bins(rows))

    def describe(self) -> dict[str, object]:
        """The weights of the MLP (lambda), per bin where they differ, for MLflow params."""
        info: dict[str, object] = {"mode": self.mode}
        if self.fit_result is not None:
            info |= {"em.iterations": self.fit_result.iterations, "em.converged": bool(self.fit_result.converged)}
        if self.mode == "context":
            counts = self.fit_result.tokens_per_bin
            info |= {f"lambda.q{q:02d}": round(float(self.weights[q, 0]), 4) for q in np.flatnonzero(counts)}
        else:
            info["lambda"] = round(float(self.weights[0, 0]), 4)
        return info


def mix_with_trigram(cfg: DictConfig, corpus: Corpus, logger: Logger, mlp: Scores) -> tuple[dict[str, float], Scores]:
    """Mix the MLP, as its run scored every token of valid and test (its kept scores), with the interpolated
    trigram; returns the metrics and the mixed row's own kept scores."""
    for split in KEPT_SPLITS:
        if split not in mlp.splits or mlp.splits[split].tokens != corpus.size(split):
            found = mlp.splits[split].tokens if split in mlp.splits else 0
            raise NplmError(
                f"the kept scores of the MLP this row mixes have {found:,} {split} tokens, the corpus "
                f"{corpus.size(split):,}: they are of other data"
            )
    trigram = DeletedInterpolation().fit(corpus)
    rows = {split: split_windows(corpus, split, trigram.order) for split in KEPT_SPLITS}
    mlp_probs = {split: np.exp(mlp.splits[split].logprob.astype(np.float64)) for split in KEPT_SPLITS}
    mixture = TrigramMixture(cfg.model.mix, trigram).fit(mlp_probs["valid"], rows["valid"])
    metrics: dict[str, float] = {}
    kept = {}
    for split, probs in mlp_probs.items():
        mixed = mixture.probs(probs, rows[split])
        metrics[f"{split}_ppl"] = perplexity_of(mixed)
        metrics[f"mlp_{split}_ppl"] = perplexity_of(probs)
        metrics[f"{split}_tokens"] = float(len(probs))
        kept[split] = np.log(mixed)
    logger.log_hyperparams({f"mix.{k}": v for k, v in mixture.describe().items()})
    logger.log_metrics(metrics)
    return metrics, Scores.of(corpus.text_names(), kept, {s: corpus.text_ids(s) for s in kept})
