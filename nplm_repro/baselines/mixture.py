"""Mixtures: rows of a study, or an MLP with the interpolated trigram (paper §2, "Mixture of models", p. 1143),

    P(w_t | context) = sum_k lambda_k(q_t) P_k(w_t | context),

arithmetic on the kept score of every validation and test token of each component (nplm_repro/scores.py): no
model is run. The weights: `fixed` (equal; the paper's tables mix an MLP and the trigram 0.5 each), `learned` (one
per component, by EM on the validation split) or `context` (one set per context-frequency bin q_t of the
interpolated trigram, by EM on validation, as the trigram combines its own parts). `Mixture` is the family of
`model=mixture`, the one engine of every mixed row: the paper's MLP2 ... MLP10 mix an MLP's row and Del. Int.'s.
A mixed MLP row stored before those were rows of their own (an MLP's `model.mix`) is scored again with the trigram
fitted again as one more component (`StoredMixedRow`, `fit_mixed` with `with_trigram`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from lightning.pytorch.loggers import Logger

from nplm_repro.baselines.em import MixtureFit, fit_mixture, mixture_probs
from nplm_repro.baselines.ngram import DeletedInterpolation, split_windows
from nplm_repro.data.corpus import Corpus
from nplm_repro.errors import NplmError
from nplm_repro.family import Family, Job, Need, Recorded, Tokens
from nplm_repro.perplexity import perplexity_of
from nplm_repro.rules import MIX_MODES, Rule, one_of
from nplm_repro.scores import KEPT_SPLITS, Scores


def param_name(row: str) -> str:
    """A row's name as MLflow takes it in a parameter's name (letters, digits, _ - . / : and spaces): a mixed row's
    `+` is spelled `plus` ("LSTM + trigram" -> "LSTM plus trigram"), anything else outside those becomes `_`."""
    return re.sub(r"[^\w\-./: ]", "_", row.replace("+", "plus"))


def components(cfg: Any) -> list[str]:
    """The names of the runs a mixture mixes, each its row's (`model.components`), and for a component of another
    seed its shift: `[LSTM, LSTM seed shift 1]` is the LSTM of the mixture's seed and the LSTM of the next
    (`model.seed_shift: [0, 1]`); its weight is the param `mix.lambda.LSTM seed shift 1`."""
    shifts = cfg.model.get("seed_shift") or [0] * len(cfg.model.components)
    return [f"{name} seed shift {k}" if k else str(name) for name, k in zip(cfg.model.components, shifts)]


def component_seed(seed: int, shift: int, seeds: int | None) -> int:
    """The seed of a component `shift` seeds after the mixture's own `seed`, counting round seeds 1 to `seeds`: with
    3 seeds, seed 3's next is seed 1, so every seed of the mixture mixes two different runs of the row."""
    return seed if not shift else (seed - 1 + shift) % int(seeds or 1) + 1


class Mixture(Family):
    """`model=mixture`: finished rows of the same study mixed, P = sum_k lambda_k(q_t) P_k, by their kept scores.

    `components` names rows (their tag `row`: LSTM, MLP9, Del. Int.), the runs it `needs`: the ledger finds each
    one's finished run of this study (or of the study `from_study`), seed and data (tracking/components.py
    `component_runs`), and hands their kept scores back (`Job.needed_scores`). `mode`:
    fixed, learned or context (the module's docstring). Pure arithmetic on kept scores: no model is run.
    """

    family = "mixture"
    label = "mixture"
    colour = "C4"

    @classmethod
    def kind(cls, cfg: Any) -> str:
        return "mixed"

    @classmethod
    def needs(cls, cfg: Any) -> list[Need]:
        """Each component's run: of the mixture's seed, or of the seed `model.seed_shift` after it."""
        study = cfg.model.get("from_study") or cfg.get("study")
        shifts = cfg.model.get("seed_shift") or [0] * len(cfg.model.components)
        return [
            Need(str(name), component_seed(cfg.seed, shift, cfg.model.get("seeds")), study, "model.components")
            for name, shift in zip(cfg.model.components, shifts)
        ]

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        components: Rule = (
            lambda v: (
                isinstance(v, Sequence)
                and not isinstance(v, str)
                and len(v) >= 2
                and all(isinstance(x, str) and x.strip() for x in v)
            ),
            "a list of at least two row names",
        )
        shifts: Rule = (
            lambda v: (
                v is None
                or (
                    isinstance(v, Sequence)
                    and len(v) == len(cfg.model.components)
                    and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in v)
                )
            ),
            "null, or one whole number >= 0 per component (its seed after the mixture's own, among model.seeds)",
        )
        seeds: Rule = (
            lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
            "the number of seeds a shifted component's seed counts round (3: seeds 1 to 3), or null",
        )
        study: Rule = (
            lambda v: v is None or (isinstance(v, str) and re.fullmatch(r"\w+", v) is not None),
            "a study's name (brown_table1), or null",
        )
        rules = {"model.components": components, "model.mode": one_of(*MIX_MODES[1:]), "model.from_study": study}
        return rules | {"model.seed_shift": shifts, "model.seeds": seeds}

    @classmethod
    def check(cls, cfg: Any) -> None:
        """A row cannot mix itself (its components are found when it runs: a cycle through other rows is the sweep's
        to refuse, which sees every row, sweeping/sweep.py), nor one run twice: a row named twice is two of its
        seeds (`model.seed_shift`), and a shifted seed counts round `model.seeds`."""
        if cfg.get("row") in cfg.model.components and cfg.model.get("from_study") in (None, cfg.get("study")):
            raise NplmError(f"model.components names row {cfg.row!r}, the row itself: a mixture cannot mix itself")
        parts = components(cfg)
        if len(set(parts)) != len(parts):
            raise NplmError(
                f"model.components names one run twice ({', '.join(parts)}): a row mixed with itself needs another "
                "seed, model.seed_shift: [0, 1]"
            )
        if any(parts[i] != name for i, name in enumerate(cfg.model.components)) and not cfg.model.get("seeds"):
            raise NplmError("model.seed_shift needs model.seeds: how many seeds a shifted seed counts round (3)")

    @classmethod
    def fit_run(cls, cfg: Any, corpus: Corpus, logger: Any, job: Job) -> tuple[dict[str, float], Scores]:
        return mix_runs(corpus, logger, components(cfg), cfg.model.mode, job.needed_scores())

    @classmethod
    def score_run(cls, run: Recorded, tokens: Tokens) -> np.ndarray:
        return mixed_logprob(run, tokens, components(run.cfg), run.cfg.model.mode)

    @classmethod
    def reach(cls, run: Recorded) -> int | None:
        return mixed_reach(run, run.cfg.model.mode)

    def __init__(self, components: Sequence[str], mode: str) -> None:
        self.components, self.mode = list(components), mode
        self.fit_result: MixtureFit | None = None

    def fit(self, valid: np.ndarray, bins: np.ndarray | None = None, n_bins: int = 1) -> Mixture:
        """`valid`: [tokens, K] each component's P of every validation token; `bins`: their context bins, given in
        `context` mode only, of `n_bins` bins."""
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


@dataclass
class Mixed:
    """A mixture fitted on validation, which mixes any tokens: their components' probabilities, and the trigram's
    windows of them where the trigram is a component or gives the context bins."""

    mixture: Mixture
    trigram: DeletedInterpolation | None  # a component (the paper's MLP + trigram), or the bins' counter
    with_trigram: bool

    def probs(self, parts: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """float64 [tokens]: the mixed probability of every token, from its components' [tokens, K] and, where the
        trigram takes part, its trigram windows `rows`."""
        columns = np.column_stack([parts, self.trigram.window_probs(rows)]) if self.with_trigram else parts
        bins = self.trigram.window_bins(rows) if self.mixture.mode == "context" else None
        return self.mixture.probs(columns, bins)

    def describe(self) -> dict[str, object]:
        """Its weights as MLflow params: each component's."""
        return self.mixture.describe()


def fit_mixed(
    corpus: Corpus,
    names: Sequence[str],
    mode: str,
    valid: np.ndarray,
    with_trigram: bool,
    trigram: DeletedInterpolation | None = None,
) -> Mixed:
    """The mixture of components whose P of every validation token are the columns of `valid`, and of the
    interpolated trigram if `with_trigram`; the trigram (fitted on `corpus`, unless given fitted) also gives the
    context bins in `context` mode."""
    if trigram is None and (with_trigram or mode == "context"):
        trigram = DeletedInterpolation().fit(corpus)
    rows = split_windows(corpus, "valid", trigram.order) if trigram is not None else None
    columns = np.column_stack([valid, trigram.window_probs(rows)]) if with_trigram else valid
    bins, n_bins = (trigram.window_bins(rows), trigram.n_bins) if mode == "context" else (None, 1)
    mixture = Mixture([*names, "trigram"] if with_trigram else names, mode).fit(columns, bins, n_bins)
    return Mixed(mixture, trigram, with_trigram)


def mix_runs(
    corpus: Corpus, logger: Logger, names: Sequence[str], mode: str, parts: list[Scores]
) -> tuple[dict[str, float], Scores]:
    """Mix the runs `names` by their kept scores of valid and test (`parts`, in that order); logs and returns the
    metrics (each component's perplexity beside the mixture's) and the mixed row's own kept scores."""
    for name, scores in zip(names, parts):
        for split in KEPT_SPLITS:
            found = scores.splits[split].tokens if split in scores.splits else 0
            if found != corpus.size(split):
                raise NplmError(
                    f"the kept scores of component {name} have {found:,} {split} tokens, the corpus "
                    f"{corpus.size(split):,}: they are of other data"
                )
    probs = {s: np.column_stack([np.exp(p.splits[s].logprob.astype(np.float64)) for p in parts]) for s in KEPT_SPLITS}
    mixed = fit_mixed(corpus, names, mode, probs["valid"], with_trigram=False)
    metrics: dict[str, float] = {}
    kept = {}
    for split, p in probs.items():
        rows = split_windows(corpus, split, mixed.trigram.order) if mixed.trigram is not None else None
        mix = mixed.probs(p, rows)
        metrics[f"{split}_ppl"] = perplexity_of(mix)
        metrics[f"{split}_tokens"] = float(len(mix))
        for k in range(len(names)):
            metrics[f"component_{k + 1}_{split}_ppl"] = perplexity_of(p[:, k])
        kept[split] = np.log(mix)
    logger.log_hyperparams({f"mix.{k}": v for k, v in mixed.describe().items()})
    logger.log_metrics(metrics)
    return metrics, Scores.of(corpus.text_names(), kept, {s: corpus.text_ids(s) for s in kept})


def mixed_logprob(run: Recorded, tokens: Tokens, names: Sequence[str], mode: str, trigram: bool = False) -> np.ndarray:
    """ln P of `tokens` by the mixture the run recorded: its parts (`names`) mixed with the weights fitted again on
    validation, from the parts' kept scores where they have them, once per rebuilt run; with the interpolated
    trigram fitted again as one more component if `trigram`."""
    parts = run.parts()
    if len(parts) != len(names):
        raise NplmError(f"mixed run {run.run_id} names {len(parts)} runs it mixes (tag base_run_id), not {len(names)}")

    def fitted() -> Mixed:
        valid = np.column_stack([part.kept_logprob("valid") for part in parts])
        return fit_mixed(run.corpus, names, mode, np.exp(valid.astype(np.float64)), trigram)

    mixed = run.memo("mixture", fitted)
    probs = np.column_stack([np.exp(part.logprob(tokens).astype(np.float64)) for part in parts])
    return np.log(mixed.probs(probs, tokens.rows(mixed.trigram.order) if mixed.trigram is not None else None))


def mixed_reach(run: Recorded, mode: str, trigram: bool = False) -> int | None:
    """A mixture's reach (`Family.reach`): the farthest of its parts', and the trigram's where it is a component
    (`trigram`) or bins the contexts (mode context); None if a part's is the whole text."""
    reaches = [part.reach() for part in run.parts()]
    if any(reach is None for reach in reaches):
        return None
    return max([*reaches, DeletedInterpolation.order - 1 if trigram or mode == "context" else 0])


class StoredMixedRow(Family):
    """A trained family's row of kind mixed, stored before mixtures were rows of their own: an MLP's `model.mix` (the
    paper's MLP2 ... MLP10, CHANGELOG.md), its MLP's run (tag base_run_id) and the interpolated trigram fitted again
    as one more component, weighted as `model.mix` says. Such a row is no longer run, only scored: serving/scoring.py
    `RunScorer` scores it by this class."""

    @classmethod
    def kind(cls, cfg: Any) -> str:
        return "mixed"

    @classmethod
    def score_run(cls, run: Recorded, tokens: Tokens) -> np.ndarray:
        return mixed_logprob(run, tokens, ["MLP"], run.cfg.model.mix, trigram=True)

    @classmethod
    def reach(cls, run: Recorded) -> int | None:
        return mixed_reach(run, run.cfg.model.mix, trigram=True)
