"""The lists under the table, each line a finding in words: runs left out of the table and why, what our data alone
moves, the mixed rows with the paper's other weightings, and sampled against exact training."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from nplm_repro.errors import NplmError
from nplm_repro.paper import PAPER_DATA, PAPER_TABLES, label, paper_table, row_key
from nplm_repro.reporting.claims import FAILS, HOLDS, INCONCLUSIVE, Arms, combine, verdict_of
from nplm_repro.reporting.data_effect import ngram_offset, vocabulary_slope
from nplm_repro.reporting.formats import pct
from nplm_repro.reporting.intervals import Evidence
from nplm_repro.reporting.runs import run_name, run_text, short_commit
from nplm_repro.reporting.search import search_note
from nplm_repro.tracking.best import trained_rows
from nplm_repro.tracking.confounds import CONFOUNDED
from nplm_repro.tracking.runs import newest_finished

# The note `sampled_vs_exact` as a study declares it (`reporting.sampled_vs_exact`), else by these defaults:
# `how_trained`, the knobs of sampled training: a sampled run and an exact run differing only in these are a pair
# (the same model, trained two ways). The precision and the validation fraction are among them so that a pair is
# found whatever they are; its verdict then passes the check (tracking/confounds.py) with `optim.output` the one key
# it varies, so a pair that also differs in them is confounded.
HOW_TRAINED = (
    "optim.output",
    "optim.samples",
    "optim.proposal",
    "optim.estimator",
    "trainer.limit_val_batches",
    "trainer.precision",
)


@dataclass(frozen=True)
class Context:
    """What every note reads: the study and its declaration, its table, every run of the experiment, the data
    reported and |V|."""

    study: str
    spec: dict[str, Any]
    table: pd.DataFrame
    all_runs: pd.DataFrame
    fingerprint: str
    vocab: str
    evidence: Evidence = field(default_factory=lambda: Evidence({}, {}))
    history: dict[str, list[tuple[str, list[float]]]] = field(default_factory=dict)  # validation curves, by row


def excluded(ctx: Context) -> list[str]:
    """Runs of this data and study, or named after a row of this paper table, that are not in the table, and why.

    Runs excluded for the same reason share one line (a whole other study, such as brown_mixtures, is one line).
    """
    study, all_runs, fingerprint = ctx.study, ctx.all_runs, ctx.fingerprint
    if not ctx.spec.get("paper"):  # a study of no paper table has no paper rows to be named after
        return []
    paper = paper_table(ctx.spec["paper"])
    names = set(paper["row"])
    by_columns = {row_key(r["family"], r): label(r) for _, r in paper.iterrows()}
    ours = (all_runs["corpus"] == PAPER_TABLES[ctx.spec["paper"]]) | (all_runs["study_tag"] == study)
    same_data = all_runs[(all_runs["fingerprint"] == fingerprint) & ours]
    bases = set(same_data["base_run_id"])
    reasons: dict[str, list[pd.Series]] = {}  # why -> runs
    for _, run in same_data.sort_values(["start_time", "run_id"]).iterrows():
        columns_of = by_columns.get(row_key(run["family"], run))
        if run["study"] == study and run["paper_row"] < 0:
            if columns_of is None:
                why = "in this study, but its columns are no row of the paper's table"
            elif run["row_tag"] == "" and run["run_id"] in bases:
                why = f"the MLP a mixed row trained for itself (no row tag; columns of {columns_of})"
            else:
                why = f"in this study, with the columns of {columns_of} but the row tag {run['row_tag'] or '(none)'}"
        elif run["row_tag"] in names and run["study"] != study:
            why = f"in study {run['study']!r}, " + (
                "its study tag" if run["study_tag"] else "its columns are no row of the paper's table"
            )
        else:
            continue
        reasons.setdefault(why, []).append(run)
    return [_excluded_line(why, runs) for why, runs in reasons.items()]


def _excluded_line(why: str, runs: list[pd.Series]) -> str:
    """One run by its full description; several by their rows, mixtures and seeds."""
    if len(runs) == 1:
        return f"{run_text(runs[0])}: {why}"
    names = ", ".join(dict.fromkeys(run_name(run) for run in runs))
    mixes = ", ".join(dict.fromkeys(run["mix"] for run in runs if run["mix"] != ""))
    seeds = ", ".join(str(s) for s in sorted({run["seed"] for run in runs}))
    return f"{why}: {len(runs)} runs, {names}" + (f" (mix {mixes})" if mixes else "") + f"; seeds {seeds}"


def data_effect(ctx: Context) -> list[str]:
    """For a paper's table: the n-gram rows' gap to the paper, and how |V| alone moves them (data_effect.py)."""
    table, all_runs, fingerprint, vocab = ctx.table, ctx.all_runs, ctx.fingerprint, ctx.vocab
    if not vocab:
        return []
    offset = ngram_offset(table)
    corpus = all_runs[all_runs["fingerprint"] == fingerprint]["corpus"].iloc[0]
    other = all_runs[(all_runs["corpus"] == corpus) & (all_runs["fingerprint"] != fingerprint)]
    paper_corpus = PAPER_TABLES.get(ctx.spec.get("paper", ""))
    paper_vocab = PAPER_DATA[paper_corpus]["vocab_size"] if corpus == paper_corpus else None
    slopes = vocabulary_slope(table, other, int(vocab), paper_vocab)
    if not slopes and "vocab_hint" in ctx.spec:
        slopes = [ctx.spec["vocab_hint"]]
    return ([offset] if offset else []) + slopes


def _unmixed(config: str) -> str:
    """A configuration less its mixture: the MLP it mixes."""
    return json.dumps({k: v for k, v in json.loads(config).items() if k != "model.mix"})


def other_mixtures(ctx: Context) -> list[str]:
    """The paper's mixed rows with its two other weightings of the same MLP (paper §2, "Mixture of models",
    p. 1143; sweeps/brown_mixtures.yaml): the MLP's weight learned on validation says why a fixed 0.5 helps or not."""
    table, all_runs, fingerprint = ctx.table, ctx.all_runs, ctx.fingerprint
    finished = (all_runs["fingerprint"] == fingerprint) & (all_runs["state"] == "finished")
    runs = all_runs[finished & all_runs["mix"].isin(["learned", "context"])]
    runs = runs.assign(mlp_config=runs["config"].map(_unmixed))
    # the MLP a mixed row mixes: the unmixed row of the same configuration less its mixture
    alone = trained_rows(table)
    alone = dict(zip(alone["config"].map(_unmixed), alone.itertuples()))
    lines = []
    mixed = (table["kind"] == "mixed") & (table["mix"] == "yes") & (table["status"] == "finished")
    for row in table[mixed].itertuples():
        same = runs[(runs["row_tag"] == row.row) & (runs["mlp_config"] == _unmixed(row.config))]
        if same.empty:
            continue
        mlp = alone.get(_unmixed(row.config))
        parts = [f"{row.label} ({mlp.label if mlp else 'its MLP'} and the trigram): 0.5 each, test {row.test_ppl:.1f}"]
        if mlp:
            parts[0] += f" ({mlp.label} alone {mlp.test_ppl:.1f})"
        for mode, what in (("learned", "one weight learned on validation"), ("context", "one weight per context bin")):
            newest = newest_finished(same[same["mix"] == mode])
            if len(newest):
                weight = f", the MLP's {newest['mix_lambda'].mean():.2f}" if mode == "learned" else ""
                parts.append(
                    f"{what}{weight}, test {newest['test_ppl'].mean():.1f} ({len(newest)} seed{'s' * (len(newest) > 1)})"
                )
        lines.append("; ".join(parts))
    return lines


SAMPLED_MARGIN = 0.02  # `margin`: "sampled training reaches the exact perplexity", the paired interval within +-2%


@dataclass(frozen=True)
class Pairing:
    """How the note pairs a sampled run with an exact one (the knobs they may differ in) and the margin of its
    equivalence claim."""

    margin: float = SAMPLED_MARGIN
    how_trained: tuple[str, ...] = HOW_TRAINED

    @classmethod
    def declared(cls, spec: dict[str, Any]) -> Pairing:
        own = spec.get("sampled_vs_exact") or {}
        return cls(float(own.get("margin", SAMPLED_MARGIN)), tuple(own.get("how_trained", HOW_TRAINED)))


def both_ways(table: pd.DataFrame, how_trained: tuple[str, ...] = HOW_TRAINED) -> list[tuple[pd.Series, pd.Series]]:
    """Each finished, unmixed MLP configuration trained both ways, as (exact, sampled): rows whose configs are the
    same less `how_trained`."""
    trained = trained_rows(table)
    ways: dict[str, dict[str, pd.Series]] = {}
    for _, row in trained.iterrows():
        config = json.loads(row["config"])
        model = json.dumps({k: v for k, v in config.items() if k not in how_trained})
        ways.setdefault(model, {})[config.get("optim.output", "exact")] = row
    return [(both["exact"], both["sampled"]) for both in ways.values() if {"exact", "sampled"} <= set(both)]


def speed_up(exact: pd.Series, sampled: pd.Series) -> tuple[float, str]:
    """Exact time over sampled time, and the column it is read from: time in fit where both runs have it (a run
    resumed in a later session spans the time between), else wall time."""
    cost = "fit_minutes" if pd.notna(exact["fit_minutes"]) and pd.notna(sampled["fit_minutes"]) else "minutes"
    return (exact[cost] / sampled[cost] if pd.notna(sampled[cost]) and sampled[cost] else np.nan), cost


def sampled_vs_exact(ctx: Context) -> list[str]:
    """Each trained MLP configuration run both ways: its sampled training against its exact training, on the
    exact perplexities of both, with epochs, wall time and the speed-up (exact minutes / sampled minutes), and the
    paper's claim (§5.1, from Bengio & Senecal 2003) that sampling loses nothing, as an equivalence test per pair:
    sampled over exact test perplexity, less 1, its paired interval within +-margin (the study's `Pairing`)."""
    lines, verdicts, samples = [], [], set()
    pairing, arms = Pairing.declared(ctx.spec), Arms(ctx.table, ctx.all_runs)
    for exact, sampled in both_ways(ctx.table, pairing.how_trained):
        why, _ = arms.confounds(exact["label"], sampled["label"], ["optim.output"])  # the one thing it varies
        precision = json.loads(exact["config"]).get("trainer.precision")
        how = json.loads(sampled["config"])
        speedup, cost = speed_up(exact, sampled)
        diffs = ", ".join(
            f"{s} {sampled[f'{s}_ppl']:.1f} ({pct(sampled[f'{s}_ppl'] / exact[f'{s}_ppl'] - 1)})"
            for s in ("valid", "test")
        )
        lines.append(
            f"{exact['row']}: exact ({precision}) valid {exact['valid_ppl']:.1f}, test {exact['test_ppl']:.1f}, "
            f"{exact['epochs']:.0f} epochs, {exact[cost]:.1f} min; sampled (k={how.get('optim.samples')}, "
            f"{how.get('optim.proposal')} proposal, {how.get('optim.estimator')}) {diffs}, "
            f"{sampled['epochs']:.0f} epochs, {sampled[cost]:.1f} min{' in fit' if cost == 'fit_minutes' else ''}: "
            f"{speedup:.1f}x faster{_equivalence(ctx.evidence, exact, sampled, verdicts, pairing.margin, why)}"
        )
        samples.add(how.get("optim.samples"))
    if not lines:
        return []
    verdict = {HOLDS: "holds", FAILS: "fails", CONFOUNDED: CONFOUNDED}.get(combine(verdicts), "inconclusive")
    claim = (
        f"Sampled training reaches the exact perplexity (every pair's test interval within ±{pairing.margin:.0%}): "
        f"{verdict}."
    )
    return [claim, *lines, *_arithmetic(ctx.vocab, samples)]


def _equivalence(
    evidence: Evidence,
    exact: pd.Series,
    sampled: pd.Series,
    verdicts: list[str | None],
    margin: float,
    confounded: str | None,
) -> str:
    """The pair's paired test interval (sampled over exact, less 1) and verdict, or `confounded` (its arms differ
    in more than their output layer: tracking/confounds.py); appends the verdict."""
    if confounded:
        verdicts.append(CONFOUNDED)
        return f": {confounded}"
    labels = [row.get("label", row["row"]) for row in (sampled, exact)]
    difference = evidence.compare(*labels)
    if difference is None:
        verdicts.append(INCONCLUSIVE)
        return "; no interval: its runs kept no scores"
    verdicts.append(verdict_of(difference, "equivalent", margin))
    return f"; test, sampled over exact, 95% interval [{pct(difference.low)}, {pct(difference.high)}]: {verdicts[-1]}"


def _arithmetic(vocab: str, samples: set[str | None]) -> list[str]:
    """How far the measured speed-up is from the arithmetic: the output layer's rows computed per token."""
    if not vocab or len(samples) != 1 or None in samples:
        return []
    (k,) = samples
    ratio = int(vocab) / int(k)
    text = (
        f"Arithmetic: the sampled gradient computes {int(k):,} of the {int(vocab):,} output rows per token, "
        f"{ratio:.0f}x fewer than the exact softmax, the upper bound on the speed-up (evaluation stays exact in both). "
        "The paper's 100-fold figure is against per-example updates; our exact runs are batched matrix products, "
        "which use the CPU far better, so the measured ratio stays below the arithmetic one."
    )
    return [text]


def setup(ctx: Context) -> list[str]:
    """What the study declares of how its rows were set up (its `reporting.setup`): searches, budgets, choices."""
    return list(ctx.spec.get("setup", []))


def search(ctx: Context) -> list[str]:
    """A search's trials (hparams_search=...): its CPU hours, how each trial ended, the best on validation."""
    curves = {run_id: values for seeds in ctx.history.values() for run_id, values in seeds}
    return search_note(
        ctx.all_runs[(ctx.all_runs["study_tag"] == ctx.study) & (ctx.all_runs["fingerprint"] == ctx.fingerprint)],
        curves,
    )


# The notes a study may declare (its sweeps file's `reporting.notes`), each with its heading
NOTES: dict[str, tuple[str, Callable[[Context], list[str]]]] = {
    "setup": ("How its rows were set up", setup),
    "search": ("The search (Optuna's trials, each a run; test chooses nothing)", search),
    "data_effect": ("What our data alone moves", data_effect),
    "other_mixtures": ("The mixed rows with the paper's two other weightings (sweeps/brown_mixtures)", other_mixtures),
    "sampled_vs_exact": (
        "Sampled against exact training (same model, seed and data; exact perplexities of both)",
        sampled_vs_exact,
    ),
    "excluded": ("Excluded (named after a row of the paper's table, but not in it)", excluded),
}


def declared_notes(ctx: Context) -> list[tuple[str, list[str]]]:
    """The notes `ctx.study` declares, in its order: (heading, lines)."""
    unknown = [name for name in ctx.spec["notes"] if name not in NOTES]
    if unknown:
        raise NplmError(f"study {ctx.study}: unknown notes {', '.join(unknown)} (known: {', '.join(NOTES)})")
    return [(NOTES[name][0], NOTES[name][1](ctx)) for name in ctx.spec["notes"]]


def _duration(minutes: float) -> str:
    return f"{minutes:.1f} min" if minutes >= 1 else f"{minutes * 60:.0f} s"


def _total(minutes: float) -> str:
    """A study's total time: in hours from an hour on, else as `_duration` says it (a quickstart's 0.0 hours)."""
    return f"{minutes / 60:.1f} hours" if minutes >= 60 else _duration(minutes)


def reproducibility(table: pd.DataFrame, runs: pd.DataFrame, evidence: Evidence, commits: list[str]) -> list[str]:
    """The ML Reproducibility Checklist's facts about the runs shown: seeds per row, how the rows were chosen, the
    intervals, the compute (CPU, wall time, CPU time), the libraries, the data and the code."""
    finished = table[table["status"] == "finished"]
    shown = runs[runs["run_id"].isin(" ".join(finished["run_ids"]).split())]
    seeds = finished["seeds"].value_counts().sort_index()
    lines = [
        f"Runs shown: {len(shown)}, over {len(finished)} rows; seeds per row: "
        + ", ".join(f"{n} seed{'s' * (n != 1)} for {rows} row{'s' * (rows != 1)}" for n, rows in seeds.items())
        + " (each seed's newest FINISHED run).",
        (
            "Chosen on validation: a row run in several configurations shows the one with the lowest mean validation "
            "perplexity; the best MLP and the best n-gram of the claims are chosen on validation too; test chooses "
            "nothing."
        ),
        (
            f"Intervals: 95% percentile bootstrap over the split's texts ({evidence.describe()}), whole texts "
            "resampled; a row with several seeds averages its seeds' perplexities in each resample; comparisons are "
            "paired (the same resampled texts on both sides)."
        ),
    ]
    if evidence.missing:
        lines.append(
            "No interval for " + ", ".join(evidence.missing) + ": their runs kept no scores "
            "(`nplm-score RUN --log` attaches them)."
        )
    cpus = shown["cpu"].replace("", "not recorded (runs from before runs recorded it)").value_counts()
    lines.append("CPU: " + "; ".join(f"{cpu} ({n} runs)" for cpu, n in cpus.items()) + ".")
    minutes = shown.set_index("run_id")["minutes"]
    wall = [
        f"{row.label} {_duration(minutes.reindex(row.run_ids.split()).mean())}"
        for row in finished.itertuples()
        if minutes.reindex(row.run_ids.split()).notna().any()
    ]
    # a mixed row's MLP that is no row of its own (Table 2's MLP10 mixes an unmixed MLP the paper has no row for)
    # cost the study its training all the same: the total counts it
    bases = runs[runs["run_id"].isin(shown["base_run_id"]) & ~runs["run_id"].isin(shown["run_id"])]
    counted = pd.concat([shown, bases])
    cpu_minutes = (counted["minutes"] * counted["threads"]).sum()
    unthreaded = int(counted["threads"].isna().sum())
    mixed = f", with the {len(bases)} MLP run{'s' * (len(bases) != 1)} the mixed rows mix" if len(bases) else ""
    lines.append(
        "Wall time per run, mean over seeds: " + ", ".join(wall) + f". Total {_total(counted['minutes'].sum())} "
        f"of wall time; {_total(cpu_minutes)} of CPU time (wall time x torch threads)"
        + (f" over the {len(counted) - unthreaded} runs that recorded their threads" if unthreaded else "")
        + mixed
        + "."
    )
    adopted = int((shown["adopted_from"] != "").sum()) if "adopted_from" in shown else 0
    if adopted:
        lines.append(
            f"Adopted: {adopted} of the runs shown were trained by another study of this store (same model_key) and "
            "adopted, not trained again (tag adopted_from); their wall time is that of the run that trained them."
        )
    versions = shown["versions"].replace("", "not recorded").value_counts()
    lines.append("Libraries: " + "; ".join(f"{v} ({n} runs)" for v, n in versions.items()) + ".")
    short = [short_commit(c) for c in commits]
    lines.append(f"Code: {', '.join(short) or 'unknown'} (git commits of the runs shown); data: the fingerprint above.")
    return lines
