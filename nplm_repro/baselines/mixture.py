"""An MLP mixed with the interpolated trigram (paper §2, "Mixture of models", p. 1143).

    P(w_t | context) = lambda(q_t) P_mlp(w_t | context) + (1 - lambda(q_t)) P_trigram(w_t | context)

`model.mix`: `none`; `fixed` (lambda = 0.5, the paper's tables); `learned` (one lambda, by EM on the
validation split); `context` (one lambda per context-frequency bin q_t of the trigram, by EM on
validation, as the trigram combines its own parts). The MLP is not retrained: the mixture only needs its
probability of every validation and test token.
"""

from __future__ import annotations

import pickle

import numpy as np
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from nplm_repro.baselines.em import MixtureFit, fit_mixture, mixture_probs
from nplm_repro.baselines.ngram import DeletedInterpolation
from nplm_repro.data.corpus import Corpus
from nplm_repro.errors import NplmError
from nplm_repro.models.lightning_module import NPLMModule
from nplm_repro.models.training import token_probs
from nplm_repro.perplexity import perplexity_of

MIX_MODES = ("none", "fixed", "learned", "context")
REMIX = "restore it, or train that MLP again (its row with rerun=true) so that the mixture finds the new run"


class TrigramMixture:
    """Fit lambda on validation, then mix any split; weights[q] = (lambda, 1 - lambda) of bin q."""

    def __init__(self, mode: str, trigram: DeletedInterpolation) -> None:
        if mode not in MIX_MODES[1:]:
            raise ValueError(f"mix mode must be one of {MIX_MODES[1:]}, not {mode!r}")
        self.mode, self.trigram = mode, trigram
        self.fit_result: MixtureFit | None = None

    def _bins(self, corpus: Corpus, split: str) -> np.ndarray | None:
        return self.trigram.token_bins(corpus, split) if self.mode == "context" else None

    def fit(self, corpus: Corpus, mlp_valid: np.ndarray) -> TrigramMixture:
        if self.mode == "fixed":
            self.weights = np.array([[0.5, 0.5]])
            return self
        probs = np.column_stack([mlp_valid, self.trigram.token_probs(corpus, "valid")])
        n_bins = self.trigram.n_bins if self.mode == "context" else 1
        self.fit_result = fit_mixture(probs, self._bins(corpus, "valid"), n_bins)
        self.weights = self.fit_result.weights
        return self

    def probs(self, corpus: Corpus, split: str, mlp: np.ndarray) -> np.ndarray:
        """float64 [size of split]: the mixed probability of every token of the split."""
        probs = np.column_stack([mlp, self.trigram.token_probs(corpus, split)])
        return mixture_probs(probs, self.weights, self._bins(corpus, split))

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


def mix_with_trigram(cfg: DictConfig, corpus: Corpus, logger: Logger, path: str, base: str) -> dict[str, float]:
    """Mix the MLP of checkpoint `path` (finished run `base`) with the interpolated trigram on valid and test."""
    try:
        module = NPLMModule.load_from_checkpoint(path, map_location="cpu")
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise NplmError(
            f"the checkpoint of the MLP this row mixes (run {base}) is unreadable ({str(error).split('. ')[0]}): {REMIX}"
        ) from None
    mlp = {split: token_probs(cfg, module, corpus, split) for split in ("valid", "test")}
    mixture = TrigramMixture(cfg.model.mix, DeletedInterpolation().fit(corpus)).fit(corpus, mlp["valid"])
    metrics: dict[str, float] = {}
    for split, probs in mlp.items():
        metrics[f"{split}_ppl"] = perplexity_of(mixture.probs(corpus, split, probs))
        metrics[f"mlp_{split}_ppl"] = perplexity_of(probs)
        metrics[f"{split}_tokens"] = float(len(probs))
    logger.log_hyperparams({f"mix.{k}": v for k, v in mixture.describe().items()})
    logger.log_metrics(metrics)
    return metrics
