"""The claims a study checks, declared in its sweeps/<study>.yaml (`reporting.claims`: which rows, which direction,
which threshold or equivalence margin), applied by one engine: each pair of rows gets the paired 95% interval of its
difference on test and one of three verdicts, and the claim the verdict of its pairs (docs/studies.md says how).

A pair whose rows are not both measured is "not measured"; one whose runs kept no scores has no interval and is
inconclusive, its point difference shown. A pair whose runs, seed by seed, also differ in a key the claim does not
name (the precision that ran, the validation, the stopping rule, the code, the CPU, the seeds: tracking/confounds.py)
is "confounded", each such key with both values, and so is its claim: no holds or fails for a comparison that varies
two things. The keys of its `varies` that did differ are printed with both values. A `more` pair compares the epoch of
the best validation instead, and a `faster` pair the training tokens per second, seed by seed (the same seed in both
rows): the mean of the per-seed ratios less 1, with its t interval over seeds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from nplm_repro.paper import PAPER_MODEL, PAPER_TRIGRAM
from nplm_repro.reporting.formats import pct
from nplm_repro.reporting.intervals import Difference, Evidence
from nplm_repro.tracking.confounds import (
    CONFOUNDED,
    arm,
    arm_differences,
    confounded,
    listed,
    precision_ran,
    trained_arm,
)

HOLDS, FAILS, INCONCLUSIVE = "holds", "fails", "inconclusive"
PARTLY, NOT_MEASURED = "holds on the rows measured", "not measured"
NO_SCORES = "no interval: its runs kept no scores (nplm-score RUN --log attaches them)"


# The claims judged seed by seed rather than on test perplexity: what they compare, and its decimals.
PER_SEED = {"more": ("best validation epoch", 1), "faster": ("training tokens/s", 0)}


@dataclass(frozen=True)
class Measured:
    """One pair of a claim, in numbers: what it compares, the relative difference with its 95% interval, the line
    the interval is judged against (`better`, `more`: above `threshold`; `equivalent`: within +-threshold)."""

    pair: str
    estimate: float
    low: float
    high: float
    verdict: str
    kind: str
    threshold: float


@dataclass(frozen=True)
class Claim:
    """The claim's words, our verdict on it, and the numbers behind the verdict, one line per pair (`measured`: the
    pairs with an interval, for the forest plot)."""

    text: str
    verdict: str
    evidence: tuple[str, ...]
    measured: tuple[Measured, ...] = ()


class Arms:
    """What each row's runs recorded (`runs`, tidy: tracking/runs.py), for the check of tracking/confounds.py. A
    table given without its runs (a recipe's steps) is checked on its rows' configurations, one record a row."""

    def __init__(self, table: pd.DataFrame, runs: pd.DataFrame | None = None) -> None:
        configs = table["config"] if "config" in table else pd.Series("", index=table.index)
        self.config = {r: json.loads(c) if isinstance(c, str) and c else {} for r, c in zip(table["label"], configs)}
        known = runs is not None and "run_id" in runs
        self.runs = runs.drop_duplicates("run_id").set_index("run_id", drop=False) if known else None
        ids = table["run_ids"] if "run_ids" in table else pd.Series("", index=table.index)
        self.run_ids = {r: i.split() if isinstance(i, str) else [] for r, i in zip(table["label"], ids)}

    def arm(self, label: str) -> dict[str, dict[str, str]]:
        """A row's runs by seed, each one's record; without its runs, its configuration as one record."""
        if self.runs is not None and self.run_ids[label] and set(self.run_ids[label]) <= set(self.runs.index):
            return arm(self.run_ids[label], self.runs)
        return {"": precision_ran(self.config[label])}

    def confounds(self, a: str, b: str, varies: list[str] | None) -> tuple[str | None, str]:
        """The `confounded` verdict of rows `a` and `b` when their runs differ in a key the claim does not name
        (tracking/confounds.py), else None; and `; it varies key (a / b)` for the keys of `varies` that differed."""
        arms = self.arm(a), self.arm(b)
        found, varied = arm_differences(*arms, varies, trained_arm(arms[0]) and trained_arm(arms[1]))
        return (confounded(found) if found else None), (f"; it varies {listed(varied)}" if varied else "")


class Numbers:
    """Valid and test perplexities per row label: ours (finished rows only) and the paper's; and the rows' `Arms`."""

    def __init__(self, table: pd.DataFrame, runs: pd.DataFrame | None = None) -> None:
        finished = table[table["status"] == "finished"]
        self.ours = {r.label: (r.valid_ppl, r.test_ppl) for r in finished.itertuples()}
        self.paper = {r.label: (r.paper_valid_ppl, r.paper_test_ppl) for r in table.itertuples()}
        self.family = dict(zip(table["label"], table["family"]))
        self.kind = dict(zip(table["label"], table["kind"])) if "kind" in table else {}
        self.arms = Arms(table, runs)

    def best_on_valid(self, families: list[str], values: dict[str, tuple[float, float]]) -> str | None:
        candidates = [label for label, family in self.family.items() if family in families and label in values]
        return min(candidates, key=lambda label: values[label][0]) if candidates else None


def _words(label: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """A row label's name words (`Kneser-Ney back-off`, ...) and its `key=value` words."""
    words = label.split()
    return tuple(w for w in words if "=" not in w or "." not in w.split("=")[0]), frozenset(
        w for w in words if "=" in w and "." in w.split("=")[0]
    )


def verdict_of(difference: Difference, kind: str, threshold: float) -> str:
    """`better`: the interval against `threshold` (the least difference claimed); `equivalent`: against +-threshold."""
    low, high = difference.low, difference.high
    if kind == "better":
        return HOLDS if low > threshold else FAILS if high < threshold else INCONCLUSIVE
    if -threshold < low and high < threshold:
        return HOLDS
    return FAILS if low > threshold or high < -threshold else INCONCLUSIVE


def seed_interval(ratios: list[float]) -> tuple[float, float] | None:
    """The 95% t interval of the mean of per-seed values; None with fewer than 2 seeds."""
    if len(ratios) < 2:
        return None
    mean, sem = float(np.mean(ratios)), float(stats.sem(ratios))
    if sem == 0:
        return mean, mean
    low, high = stats.t.interval(0.95, len(ratios) - 1, loc=mean, scale=sem)
    return float(low), float(high)


class Checker:
    """Applies declared claims to a report's rows (`table`: label, family, status, valid/test and the paper's), and
    `more` claims to `epochs` (per row label, per seed: the epoch of its best validation)."""

    def __init__(
        self,
        table: pd.DataFrame,
        evidence: Evidence,
        epochs: dict[str, dict[str, float]] | None = None,
        speeds: dict[str, dict[str, float]] | None = None,
        runs: pd.DataFrame | None = None,
    ) -> None:
        self.numbers, self.evidence = Numbers(table, runs), evidence
        self.per_seed = {"more": epochs or {}, "faster": speeds or {}}
        self.measured: list[Measured] = []  # the current claim's pairs with an interval

    def more(
        self, pair: list[str], threshold: float, kind: str = "more", varies: list[str] | None = None
    ) -> tuple[str, str | None]:
        """One per-seed pair [a, b] (PER_SEED: `more`, b takes more epochs to its best validation than a; `faster`, b
        trains more tokens per second than a): b's value over a's less 1, per seed."""
        a, b = pair
        values, what, unit = self.per_seed[kind], *PER_SEED[kind]
        missing = [row for row in pair if row not in values]
        if missing:
            return f"{a} to {b}: not measured ({', '.join(missing)}: no finished run)", None
        seeds = sorted(set(values[a]) & set(values[b]))
        ratios = [values[b][s] / values[a][s] - 1 for s in seeds]
        if not seeds:
            return f"{a} to {b}: not measured (no seed run in both)", None
        mean_a, mean_b = (np.mean([values[row][s] for s in seeds]) for row in pair)
        head = f"{a} to {b}: {what} {mean_a:,.{unit}f} against {mean_b:,.{unit}f}, {pct(float(np.mean(ratios)))}"
        arms = self.numbers.arms
        why, varied = arms.confounds(a, b, varies) if {a, b} <= set(arms.config) else (None, "")
        head += varied
        if why:
            return f"{head}: {why}", CONFOUNDED
        bounds = seed_interval(ratios)
        if bounds is None:
            return f"{head}; no interval: 1 seed", INCONCLUSIVE
        verdict = verdict_of(Difference(float(np.mean(ratios)), *bounds), "better", threshold)
        self.measured.append(
            Measured(f"{a} to {b} ({kind})", float(np.mean(ratios)), *bounds, verdict, kind, threshold)
        )
        count = f"{len(seeds)} seeds"
        return f"{head}, 95% interval over {count} [{pct(bounds[0])}, {pct(bounds[1])}]: {verdict}", verdict

    def _resolve(self, row: str | dict[str, list[str]], values: dict[str, tuple[float, float]]) -> str | None:
        """The row a claim names, as the table labels it: a name the table lengthened by the keys that tell its
        configurations apart, wherever they sort (`MLP9` is `MLP9 optim.lr=0.005 ...` beside a searched MLP;
        `MLP9 optim.batch_size=1024` is `MLP9 callbacks.early_stopping.patience=5 optim.batch_size=1024`) is that one
        row. The words added say nothing of what may differ: the check compares every key."""
        if isinstance(row, dict):
            return self.numbers.best_on_valid(row["best_of"], values)
        if row in values:
            return row
        name, keys = _words(row)
        longer = [label for label in values if _words(label)[0] == name and keys <= _words(label)[1]]
        return longer[0] if len(longer) == 1 else row

    def pair(
        self, pair: list[Any], kind: str, threshold: float, varies: list[str] | None = None
    ) -> tuple[str, str | None]:
        """One pair: its line and its verdict (None when not measured)."""
        ours = self.numbers.ours
        baseline, model = (self._resolve(row, ours) for row in pair)
        p_baseline, p_model = (self._resolve(row, self.numbers.paper) for row in pair)
        paper = ""
        b, m = (self.numbers.paper.get(row, (math.nan, math.nan))[1] for row in (p_baseline, p_model))
        if not (math.isnan(b) or math.isnan(m)):  # a row the paper has no number for (a mixture it did not report)
            paper = f"; paper {p_baseline} {b:g}, {p_model} {m:g}: {pct(b / m - 1)}"
        if baseline not in ours or model not in ours:
            names = [str(r) if not isinstance(r, dict) else "best of " + ", ".join(r["best_of"]) for r in pair]
            missing = [n for n, r in zip(names, (baseline, model)) if r not in ours]
            return f"{names[0]} over {names[1]}: not measured ({', '.join(missing)}: no finished run){paper}", None
        b, m = ours[baseline][1], ours[model][1]
        head = f"{baseline} over {model}: test {b:.1f} against {m:.1f}, {pct(b / m - 1)}"
        why, varied = self.numbers.arms.confounds(baseline, model, varies)
        head += varied
        if why:
            return f"{head}: {why}{paper}", CONFOUNDED
        difference = self.evidence.compare(baseline, model)
        if difference is None:
            return f"{head}; {NO_SCORES}{paper}", INCONCLUSIVE
        verdict = verdict_of(difference, kind, threshold)
        self.measured.append(
            Measured(
                f"{baseline} / {model}", difference.estimate, difference.low, difference.high, verdict, kind, threshold
            )
        )
        return f"{head}, 95% interval [{pct(difference.low)}, {pct(difference.high)}]: {verdict}{paper}", verdict

    def claim(self, spec: dict[str, Any]) -> Claim:
        lines, verdicts, self.measured = [], [], []
        for kind, threshold in (("better", spec.get("by", 0.0)), ("equivalent", spec.get("margin", 0.0))):
            for pair in spec.get(kind, []):
                line, verdict = self.pair(pair, kind, threshold, spec.get("varies"))
                lines.append(line)
                verdicts.append(verdict)
        for kind in PER_SEED:
            for pair in spec.get(kind, []):
                line, verdict = self.more(pair, spec.get("by", 0.0), kind, spec.get("varies"))
                lines.append(line)
                verdicts.append(verdict)
        if "margin" in spec:
            lines.append(f"no effect means within ±{100 * spec['margin']:.3g}% (the claim's declared margin)")
        return Claim(spec["claim"], combine(verdicts), tuple(lines), tuple(self.measured))


def combine(verdicts: list[str | None]) -> str:
    """A claim's verdict from its pairs': any confounded -> confounded (it compares more than it names); any fails ->
    fails; all hold -> holds; else inconclusive; pairs not measured leave it "holds on the rows measured" at best."""
    measured = [v for v in verdicts if v is not None]
    if not measured:
        return NOT_MEASURED
    if CONFOUNDED in measured:
        return CONFOUNDED
    if FAILS in measured:
        return FAILS
    if INCONCLUSIVE in measured:
        return INCONCLUSIVE
    return HOLDS if len(measured) == len(verdicts) else PARTLY


def check_claims(
    declared: list[dict[str, Any]],
    table: pd.DataFrame,
    evidence: Evidence,
    epochs: dict[str, dict[str, float]] | None = None,
    speeds: dict[str, dict[str, float]] | None = None,
    runs: pd.DataFrame | None = None,
) -> list[Claim]:
    """The claims a study declares (its `reporting.claims`), checked on `table`'s rows (and `epochs` for `more`
    claims, `speeds` for `faster`), their arms on what their `runs` recorded (tidy, tracking/runs.py)."""
    checker = Checker(table, evidence, epochs, speeds, runs)
    return [checker.claim(spec) for spec in declared]


def headline(table: pd.DataFrame) -> dict[str, float]:
    """A study's numbers at a glance (a sweep's parent run keeps them as metrics): the test perplexity of the best
    MLP and of the best n-gram, each chosen on validation, and the margins the claims check, the baseline's test
    perplexity over the MLP's less 1 (0.24: the n-gram 24% higher); only those measured."""
    numbers = Numbers(table)
    counted = {numbers.family[label] for label, kind in numbers.kind.items() if kind == "counted"}

    def best_test(families: set[str]) -> float | None:
        label = numbers.best_on_valid(sorted(families), numbers.ours)
        return None if label is None else float(numbers.ours[label][1])

    mlp, ngram, del_int = best_test({PAPER_MODEL}), best_test(counted), best_test({PAPER_TRIGRAM})
    found = {"best_mlp_test_ppl": mlp, "best_ngram_test_ppl": ngram}
    if mlp is not None:
        found["mlp_margin_over_best_ngram"] = None if ngram is None else ngram / mlp - 1
        found["mlp_margin_over_del_int"] = None if del_int is None else del_int / mlp - 1
    return {name: value for name, value in found.items() if value is not None}
