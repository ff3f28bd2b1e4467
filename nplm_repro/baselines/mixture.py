"""An MLP mixed with the interpolated trigram (paper §2, "Mixture of models", p. 1143).

    P(w_t | context) = lambda(q_t) P_mlp(w_t | context) + (1 - lambda(q_t)) P_trigram(w_t | context)

`model.mix`: `none`; `fixed` (lambda = 0.5, the paper's tables); `learned` (one lambda, by EM on the
validation split); `context` (one lambda per context-frequency bin q_t of the trigram, by EM on
validation, as the trigram combines its own parts). The MLP is neither retrained nor run: the mixture is
arithmetic on its kept score of every validation and test token (nplm_repro/scores.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from nplm_repro.baselines.em import MixtureFit, fit_mixture, mixture_probs
from nplm_repro.baselines.ngram import DeletedInterpolation, split_windows
from nplm_repro.data.corpus import Corpus
from nplm_repro.errors import NplmError
from nplm_repro.perplexity import perplexity_of
from nplm_repro.rules import MIX_MODES, Rule, one_of
from nplm_repro.scores import KEPT_SPLITS, Scores


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


def param_name(row: str) -> str:
    """A row's name as MLflow takes it in a parameter's name (letters, digits, _ - . / : and spaces): a mixed row's
    `+` is spelled `plus` ("LSTM + trigram" -> "LSTM plus trigram"), anything else outside those becomes `_`."""
    return re.sub(r"[^\w\-./: ]", "_", row.replace("+", "plus"))


class Mixture:
    """`model=mixture`: any finished rows of the same study mixed, P = sum_k lambda_k(q_t) P_k, by their kept scores.

    `components` names rows (their tag `row`: LSTM, MLP9, Del. Int.); the ledger finds each one's finished run of
    this study, seed and data (tracking/ledger.py `component_runs`). `mode`: `fixed` (equal weights), `learned`
    (one weight per component, EM on validation) or `context` (one set per context-frequency bin of the
    interpolated trigram, as MLP + trigram mixes). Pure arithmetic on kept scores: no model is run.
    """

    family = "mixture"
    label = "mixture"
    colour = "C4"
    trained = False

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        components: Rule = (
            lambda v: (
                isinstance(v, Sequence)
                and not isinstance(v, str)
                and len(v) >= 2
                and len(set(v)) == len(v)
                and all(isinstance(x, str) and x.strip() for x in v)
            ),
            "a list of at least two different row names",
        )
        return {"model.components": components, "model.mode": one_of(*MIX_MODES[1:])}

    @classmethod
    def check(cls, cfg: Any) -> None:
        """A row cannot mix itself (its components are found when it runs: a cycle through other rows is the sweep's
        to refuse, which sees every row, tracking/sweep.py)."""
        if cfg.get("row") in cfg.model.components:
            raise NplmError(f"model.components names row {cfg.row!r}, the row itself: a mixture cannot mix itself")

    @classmethod
    def mixes(cls, cfg: Any) -> bool:
        return True

    def __init__(self, components: Sequence[str], mode: str) -> None:
        self.components, self.mode = list(components), mode
        self.fit_result: MixtureFit | None = None

    def fit(self, valid: np.ndarray, bins: np.ndarray | None = None, n_bins: int = 1) -> Mixture:
        """`valid`: [tokens, K] each component's P of every validation token; `bins`: their context bins, given in
        `context` mode only (`context_bins`), of `n_bins` bins."""
        if self.mode == "fixed":
            self.weights = np.full((1, valid.shape[1]), 1.0 / valid.shape[1])
            return self
        self.fit_result = fit_mixture(valid, bins, n_bins)
        self.weights = self.fit_result.weights
        return self

    def probs(self, probs: np.ndarray, bins: np.ndarray | None = None) -> np.ndarray:
        return mixture_probs(probs, self.weights, bins)

    def describe(self) -> dict[str, object]:
        """Each component's weight (the mean over bins, weighted by their validation tokens, in `context` mode)."""
        info: dict[str, object] = {"mode": self.mode}
        if self.fit_result is not None:
            info |= {"em.iterations": self.fit_result.iterations, "em.converged": bool(self.fit_result.converged)}
            counts = self.fit_result.tokens_per_bin
            mean = (self.weights * counts[:, None]).sum(0) / max(counts.sum(), 1)
        else:
            mean = self.weights[0]
        return info | {f"lambda.{param_name(name)}": round(float(w), 4) for name, w in zip(self.components, mean)}


def context_bins(corpus: Corpus, splits: Sequence[str]) -> tuple[dict[str, np.ndarray], int]:
    """The interpolated trigram's context-frequency bin of every token of each split, and how many bins there are."""
    trigram = DeletedInterpolation().fit(corpus)
    return {s: trigram.window_bins(split_windows(corpus, s, trigram.order)) for s in splits}, trigram.n_bins


def mix_runs(
    cfg: DictConfig, corpus: Corpus, logger: Logger, components: list[Scores]
) -> tuple[dict[str, float], Scores]:
    """Mix the components' kept scores of valid and test (in `cfg.model.components` order); returns the metrics and
    the mixed row's own kept scores."""
    names = list(cfg.model.components)
    for name, scores in zip(names, components):
        for split in KEPT_SPLITS:
            found = scores.splits[split].tokens if split in scores.splits else 0
            if found != corpus.size(split):
                raise NplmError(
                    f"the kept scores of component {name} have {found:,} {split} tokens, the corpus "
                    f"{corpus.size(split):,}: they are of other data"
                )
    probs = {
        s: np.column_stack([np.exp(c.splits[s].logprob.astype(np.float64)) for c in components]) for s in KEPT_SPLITS
    }
    bins, n_bins = context_bins(corpus, KEPT_SPLITS) if cfg.model.mode == "context" else ({}, 1)
    mixture = Mixture(names, cfg.model.mode).fit(probs["valid"], bins.get("valid"), n_bins)
    metrics: dict[str, float] = {}
    kept = {}
    for split, p in probs.items():
        mixed = mixture.probs(p, bins.get(split))
        metrics[f"{split}_ppl"] = perplexity_of(mixed)
        metrics[f"{split}_tokens"] = float(len(mixed))
        for k, name in enumerate(names):
            metrics[f"component_{k + 1}_{split}_ppl"] = perplexity_of(p[:, k])
        kept[split] = np.log(mixed)
    logger.log_hyperparams({f"mix.{k}": v for k, v in mixture.describe().items()})
    logger.log_metrics(metrics)
    return metrics, Scores.of(corpus.text_names(), kept, {s: corpus.text_ids(s) for s in kept})
