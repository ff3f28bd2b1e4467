"""`nplm-report`: a study's runs from MLflow as the paper's table, each number beside the paper's, claims checked.

nplm-report                                    # Table 1 (Brown) from ./mlflow.db into reports/
nplm-report --study grid --fingerprint b45c28977b58c44b
nplm-report --tracking-uri http://127.0.0.1:5000 --out /tmp/reports

Which runs: a run belongs to the study its `study` tag names; without one, to the paper's table of its corpus
when its `row` tag names a row of that table and its model has the row's columns (n, c, h, m, direct, mix),
else to `adhoc`. Only runs of one data fingerprint are reported (the newest run's, unless one is named).
Runs of one configuration (the config less seed and bookkeeping) are averaged over seeds, taking the newest
FINISHED run of each seed. A paper row run in several configurations shows the one with the lowest mean
validation perplexity (never chosen on test); the others are listed as attempts.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import html
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from nplm_repro.cli import cli
from nplm_repro.data.splits import SPLITS
from nplm_repro.errors import NplmError
from nplm_repro.reporting.claims import Claim, check_claims
from nplm_repro.reporting.data_effect import ngram_offset, vocabulary_slope
from nplm_repro.tracking.keys import BOOKKEEPING, FAMILY_IDS
from nplm_repro.tracking.locks import sqlite_file
from nplm_repro.tracking.store import check_store

COLUMNS = ("n", "c", "h", "m", "direct", "mix")
PAPER_TABLES = {"brown_table1": "brown", "ap_table2": "ap"}  # study -> corpus
PAPER_TITLES = {"brown_table1": "Table 1 (Brown corpus)", "ap_table2": "Table 2 (AP News)"}
PAPER_CORPORA = {"brown": "Brown", "ap": "AP News 1995-96"}  # what the paper's numbers were measured on
PAPER_DATA = {  # PAPER.md section 2: |V| and split sizes
    "brown": {"vocab_size": 16_383, "train": 800_000, "valid": 200_000, "test": 181_041},
    "ap": {"vocab_size": 17_964, "train": 13_994_528, "valid": 963_138, "test": 963_071},
}
ROW_NAMES = {"Back-off KN": "Kneser-Ney back-off"}  # Table 2's name for Table 1's row
# Runs from before the tag `family`: their class's name, wherever it lived then.
FAMILIES = {path.rsplit(".", 1)[-1]: family for family, path in FAMILY_IDS.items()}
FAMILY_NAMES = {
    "mlp": "MLP",
    "deleted_interpolation": "Del. Int.",
    "kneser_ney": "Kneser-Ney back-off",
    "class_based": "class-based back-off",
}
# What a result depends on: an n-gram is counted from the data with the model's knobs; an MLP is also trained.
# The data itself is pinned by the fingerprint; tracking.* and the row name are labels, not configuration.
CONFIG_GROUPS = {"mlp": ("data.", "model.", "optim.", "trainer.", "callbacks.")}
NGRAM_GROUPS = ("data.", "model.")
MIX = {"none": "no", "fixed": "yes"}  # the paper's mix column: weight 0.5 on each, or no mixture


def _present(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value))


def _text(value: object) -> str:
    return str(value) if _present(value) else ""


# --- the paper's tables ---------------------------------------------------------------------------------------


def paper_table(study: str) -> pd.DataFrame:
    """The paper's table for `study` (a copy kept in the package), in the paper's order, with the row's family."""
    with resources.files("nplm_repro").joinpath("paper", f"{study}.csv").open() as f:
        paper = pd.read_csv(f, dtype=str, keep_default_na=False)
    paper = paper.rename(columns={"name": "row", "model": "family"})
    paper["row"] = paper["row"].replace(ROW_NAMES)
    for split in SPLITS:
        paper[f"paper_{split}_ppl"] = pd.to_numeric(paper.pop(f"{split}_ppl")).astype(float)
    return paper


def _columns_key(family: str, values: pd.Series | dict) -> tuple[str, ...]:
    return (family, *(str(values[c]) for c in COLUMNS))


# --- reading runs ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _tracking(uri: str) -> Iterator[None]:
    """mlflow.search_runs reads the global tracking URI (and exports it to the environment): restore both after."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)


def read_runs(uri: str, experiment: str) -> pd.DataFrame:
    """Every run of the experiment (mlflow.search_runs); a missing store or experiment is an error, never created."""
    path = sqlite_file(uri)
    if path is not None and not path.is_file():
        raise NplmError(f"no tracking store at {path}: run nplm-train first, or pass --tracking-uri")
    check_store(uri, create=False)
    try:
        with _tracking(uri):
            found = mlflow.get_experiment_by_name(experiment)
            names = sorted(e.name for e in mlflow.search_experiments()) if found is None else []
            runs = mlflow.search_runs([found.experiment_id]) if found is not None else pd.DataFrame()
    except Exception as error:  # MLflow raises many types for a bad store; all mean the same to the user
        raise NplmError(f"tracking store {uri!r} is unusable") from error
    if found is None:
        has = f"it has only {', '.join(names)}" if names else "it has none"
        raise NplmError(f"no runs to report: the store has no experiment {experiment!r} ({has})")
    if runs.empty:
        raise NplmError(f"no runs to report: experiment {experiment!r} is empty")
    return runs


def _config(run: pd.Series, family: str) -> dict[str, str]:
    groups = CONFIG_GROUPS.get(family, NGRAM_GROUPS)
    config = {
        key: str(value)
        for name, value in run.items()
        if name.startswith("params.")
        and _present(value)
        and (key := name.removeprefix("params.")).startswith(groups)
        and not key.startswith(BOOKKEEPING)  # tracking's: where and how a job ran
    }
    if family in FAMILY_IDS:  # the family, not where its class lived when the run was made
        config["model._target_"] = FAMILY_IDS[family]
    if family == "mlp":
        config.setdefault("model.mix", "none")  # runs from before the mixture knob were unmixed
    return dict(sorted(config.items()))


def tidy(raw: pd.DataFrame) -> pd.DataFrame:
    """One row per nplm-repro run: state, data, the paper's columns, seed, configuration and perplexities.

    Runs without a data fingerprint are not nplm-repro runs; sweep parents (no perplexities) are left out.
    """
    parents = set(raw.get("tags.mlflow.parentRunId", pd.Series(dtype=object)).dropna())
    records = []
    for _, run in raw.iterrows():
        get = run.get
        valid = get("metrics.valid_ppl")
        if not _present(get("tags.data_fingerprint")) or (
            not _present(valid) and (run["run_id"] in parents or _present(get("tags.sweep")))
        ):
            continue
        target = _text(get("params.model._target_"))
        family = _text(get("tags.family")) or FAMILIES.get(target.rsplit(".", 1)[-1], target)
        config = _config(run, family)
        mlp = family == "mlp"
        status = run["status"]
        state = "running" if status in ("RUNNING", "SCHEDULED") else "failed"
        if status == "FINISHED" and _present(valid):
            state = "finished"
        records.append(
            {
                "run_id": run["run_id"],
                "name": _text(get("tags.mlflow.runName")),
                "status": status,
                "state": state,
                "start_time": run["start_time"],
                "fingerprint": get("tags.data_fingerprint"),
                "corpus": _text(get("tags.corpus")),
                "source": _text(get("tags.data_source")),
                "vocab_size": _text(get("tags.vocab_size")),
                **{f"{split}_tokens": _text(get(f"tags.{split}_tokens")) for split in SPLITS},
                "git_commit": _text(get("tags.git_commit")),
                "note": _text(get("tags.note")),
                "row_tag": ROW_NAMES.get(_text(get("tags.row")), _text(get("tags.row"))),
                "study_tag": _text(get("tags.study")),
                "base_run_id": _text(get("tags.base_run_id")),
                "family": family,
                "n": config.get("model.n", ""),
                "c": config.get("model.c", "") if family == "class_based" else "",
                "h": config.get("model.h", "") if mlp else "",
                "m": config.get("model.m", "") if mlp else "",
                "direct": {"True": "yes", "False": "no"}.get(config.get("model.direct", ""), "") if mlp else "",
                "mix": MIX.get(config["model.mix"], config["model.mix"]) if mlp else "",
                "seed": _text(get("params.seed")),
                "config": json.dumps(config),
                "mix_lambda": pd.to_numeric(get("params.mix.lambda", np.nan), errors="coerce"),  # learned: one weight
                "epochs": get("metrics.epochs", np.nan),
                "minutes": (run["end_time"] - run["start_time"]).total_seconds() / 60
                if status == "FINISHED"
                else np.nan,
                "fit_minutes": get("metrics.fit_seconds", np.nan) / 60,  # an MLP's, without the time it was down
                **{f"{split}_ppl": get(f"metrics.{split}_ppl", np.nan) for split in SPLITS},
            }
        )
    return pd.DataFrame.from_records(records)


def assign_studies(runs: pd.DataFrame) -> pd.DataFrame:
    """Each run's study and, for runs in a paper's table, the index of their row there."""
    runs = runs.copy()
    runs["paper_row"] = -1
    runs["study"] = runs["study_tag"]
    for study, corpus in PAPER_TABLES.items():
        paper = paper_table(study)
        rows = {(r["row"], *_columns_key(r["family"], r)): i for i, r in paper.iterrows()}
        match = pd.Series(
            [rows.get((r["row_tag"], *_columns_key(r["family"], r)), -1) for _, r in runs.iterrows()], index=runs.index
        )
        ours = (match >= 0) & ((runs["corpus"] == corpus) | (runs["study_tag"] == study))  # e.g. ap_table2 on WSJ
        runs.loc[ours, "paper_row"] = match[ours]
        runs.loc[ours & (runs["study"] == ""), "study"] = study
    runs.loc[runs["study"] == "", "study"] = "adhoc"
    return runs


# --- from runs to a table -------------------------------------------------------------------------------------


def _config_id(config: str) -> str:
    return hashlib.sha256(config.encode()).hexdigest()[:8]


def newest_finished(runs: pd.DataFrame) -> pd.DataFrame:
    """Per seed, the newest FINISHED run: what a configuration's numbers are averaged over."""
    return runs[runs["state"] == "finished"].sort_values(["start_time", "run_id"]).groupby("seed").last()


def summarise(runs: pd.DataFrame) -> dict[str, object]:
    """One configuration: per seed its newest FINISHED run; mean and std over seeds; what is running or failed."""
    finished = newest_finished(runs)
    running_seeds = set(runs.loc[runs["state"] == "running", "seed"]) - set(finished.index)
    summary: dict[str, object] = {
        "seeds": len(finished),
        "running": len(running_seeds),
        "failed": int((runs["state"] == "failed").sum()),
        "status": "finished" if len(finished) else "running" if running_seeds else "failed",
        "run_ids": " ".join(finished["run_id"]),
        "config_id": _config_id(runs["config"].iloc[0]),
        "notes": "; ".join(sorted(set(runs["note"]) - {""})),
    }
    for split in SPLITS:
        values = finished[f"{split}_ppl"].dropna()
        summary[f"{split}_ppl"] = values.mean() if len(values) else np.nan
        summary[f"{split}_ppl_std"] = values.std(ddof=1) if len(values) > 1 else np.nan
    for cost in ("epochs", "minutes", "fit_minutes"):
        summary[cost] = finished[cost].mean() if cost in finished and finished[cost].notna().any() else np.nan
    return summary


def configurations(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration of the runs: its columns, its summary and its newest start."""
    rows = []
    for config, group in runs.groupby("config", sort=False):
        first = group.iloc[0]
        rows.append(
            {
                "config": config,
                "family": first["family"],
                **{c: first[c] for c in COLUMNS},
                "paper_row": first["paper_row"],
                "newest": group["start_time"].max(),
                **summarise(group),
            }
        )
    return pd.DataFrame.from_records(rows)


def _best(configs: pd.DataFrame) -> pd.Series:
    """Lowest mean validation perplexity among finished configurations; else the newest running or failed one."""
    for status in ("finished", "running", "failed"):
        candidates = configs[configs["status"] == status]
        if len(candidates):
            order = ["valid_ppl", "newest"] if status == "finished" else ["newest"]
            ascending = [True, False] if status == "finished" else [False]
            return candidates.sort_values(order, ascending=ascending).iloc[0]
    raise ValueError("no configuration")


def varying_keys(configs: pd.DataFrame) -> list[str]:
    """Config keys besides the paper's columns whose value differs between configurations."""
    dicts = [json.loads(c) for c in configs["config"]]
    shown = {"model._target_"} | {f"model.{c}" for c in COLUMNS}
    keys = sorted({k for d in dicts for k in d} - shown)
    return [k for k in keys if len({d.get(k, "") for d in dicts}) > 1]


def label(row: pd.Series | dict, extra: Sequence[str] = ()) -> str:
    """How text names a row: MLP5, Del. Int., Kneser-Ney back-off n=4, class-based back-off n=3 c=500; rows that
    are no paper row by their columns (MLP n=5 h=50 ...), and by the `extra` keys that tell configurations apart."""
    name = row["row"]
    if name == "MLP":
        knobs = [c for c in COLUMNS if row[c] != ""]
    elif name.startswith("MLP") or name == "Del. Int.":
        knobs = []
    else:
        knobs = ["n", "c"] if row["c"] else ["n"]
    return " ".join([name, *(f"{k}={row[k]}" for k in (*knobs, *extra) if row[k] != "")])


def _with_rel_diff(table: pd.DataFrame) -> pd.DataFrame:
    for split in SPLITS:
        table[f"{split}_rel_diff"] = table[f"{split}_ppl"] / table[f"paper_{split}_ppl"] - 1
    return table


def paper_study_table(study: str, configs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper's rows in the paper's order, each with its best configuration; the other configurations."""
    paper = paper_table(study)
    rows, attempts = [], []
    for i, paper_row in paper.iterrows():
        mine = configs[configs["paper_row"] == i]
        row = paper_row.to_dict()
        if mine.empty:
            rows.append({**row, "status": "missing", "seeds": 0, "running": 0, "failed": 0})
            continue
        best = _best(mine)
        rows.append({**row, **best.drop(["family", *COLUMNS]).to_dict()})
        if len(mine) > 1:
            attempts.append(mine.assign(row=label(row), chosen=mine["config"] == best["config"]))
    table = _with_rel_diff(pd.DataFrame.from_records(rows))
    table["label"] = table.apply(label, axis=1)
    return table, pd.concat(attempts, ignore_index=True) if attempts else pd.DataFrame()


def other_study_table(corpus: str, configs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One row per configuration, with the config keys that vary as extra columns; the paper's numbers beside
    the configurations that have a paper row's columns."""
    extra = varying_keys(configs)
    table = configs.copy()
    for key in extra:
        table[key] = [json.loads(c).get(key, "") for c in table["config"]]
    study = next((s for s, c in PAPER_TABLES.items() if c == corpus), None)
    paper = paper_table(study) if study else pd.DataFrame(columns=["row", "family", *COLUMNS])
    by_columns = {_columns_key(r["family"], r): r for _, r in paper.iterrows()}
    matched = [by_columns.get(_columns_key(r["family"], r)) for _, r in table.iterrows()]
    table["row"] = [m["row"] if m is not None else FAMILY_NAMES.get(f, f) for m, f in zip(matched, table["family"])]
    for split in SPLITS:
        table[f"paper_{split}_ppl"] = [m[f"paper_{split}_ppl"] if m is not None else np.nan for m in matched]
    order = {f: i for i, f in enumerate(FAMILY_NAMES)}
    table = table.assign(
        _family=table["family"].map(order).fillna(len(order)),
        **{f"_{c}": pd.to_numeric(table[c], errors="coerce") for c in ("n", "c", "h", "m")},
    )
    table = table.sort_values(["_family", "_n", "_c", "_h", "_m", "direct", "mix", *extra, "config"])
    table = _with_rel_diff(table.drop(columns=[c for c in table if c.startswith("_")]).reset_index(drop=True))
    table["label"] = table.apply(label, axis=1, extra=extra)
    return table, extra


# --- the report -----------------------------------------------------------------------------------------------


@dataclass
class Report:
    """Everything a report says, before it is written in any format."""

    study: str
    experiment: str
    corpus: str
    source: str
    fingerprint: str
    data: dict[str, str]
    commits: list[str]
    table: pd.DataFrame
    extra: list[str]
    attempts: pd.DataFrame
    claims: list[Claim]
    running: pd.DataFrame
    failed: pd.DataFrame
    excluded: list[str]
    other_data: pd.DataFrame
    data_effect: list[str]
    other_mixtures: list[str]
    sampled: list[str]
    history: dict[str, list[tuple[str, list[float]]]]

    @property
    def command(self) -> str:
        return f"nplm-report --study {self.study} --experiment {self.experiment} --fingerprint {self.fingerprint}"

    @property
    def missing(self) -> list[str]:
        return list(self.table.loc[self.table["status"] == "missing", "label"])


def _choose_fingerprint(study: str, runs: pd.DataFrame, fingerprint: str | None) -> str:
    seen = runs.groupby("fingerprint")["start_time"].agg(["max", "size"]).sort_values("max", ascending=False)
    if fingerprint is None:
        return str(seen.index[0])
    if fingerprint not in seen.index:
        known = ", ".join(f"{f} ({n} runs)" for f, n in seen["size"].items())
        raise NplmError(f"--fingerprint {fingerprint}: no run of study {study!r} has it (it has: {known})")
    return fingerprint


def _excluded(study: str, all_runs: pd.DataFrame, fingerprint: str) -> list[str]:
    """Runs of this data and study, or named after a row of this paper table, that are not in the table, and why.

    Runs excluded for the same reason share one line (a whole other study, such as brown_mixtures, is one line).
    """
    if study not in PAPER_TABLES:
        return []
    paper = paper_table(study)
    names = set(paper["row"])
    by_columns = {_columns_key(r["family"], r): label(r) for _, r in paper.iterrows()}
    ours = (all_runs["corpus"] == PAPER_TABLES[study]) | (all_runs["study_tag"] == study)
    same_data = all_runs[(all_runs["fingerprint"] == fingerprint) & ours]
    bases = set(same_data["base_run_id"])
    excluded: dict[str, list[pd.Series]] = {}  # why -> runs
    for _, run in same_data.sort_values(["start_time", "run_id"]).iterrows():
        columns_of = by_columns.get(_columns_key(run["family"], run))
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
        excluded.setdefault(why, []).append(run)
    return [_excluded_line(why, runs) for why, runs in excluded.items()]


def _excluded_line(why: str, runs: list[pd.Series]) -> str:
    """One run by its full description; several by their rows, mixtures and seeds."""
    if len(runs) == 1:
        return f"{_run_text(runs[0])}: {why}"
    names = ", ".join(dict.fromkeys(_name(run) for run in runs))
    mixes = ", ".join(dict.fromkeys(run["mix"] for run in runs if run["mix"] != ""))
    seeds = ", ".join(str(s) for s in sorted({run["seed"] for run in runs}))
    return f"{why}: {len(runs)} runs, {names}" + (f" (mix {mixes})" if mixes else "") + f"; seeds {seeds}"


def _data_effect(study: str, table: pd.DataFrame, all_runs: pd.DataFrame, fingerprint: str, vocab: str) -> list[str]:
    """For a paper's table: the n-gram rows' gap to the paper, and how |V| alone moves them (data_effect.py)."""
    if study not in PAPER_TABLES or not vocab:
        return []
    offset = ngram_offset(table)
    corpus = all_runs[all_runs["fingerprint"] == fingerprint]["corpus"].iloc[0]
    other = all_runs[(all_runs["corpus"] == corpus) & (all_runs["fingerprint"] != fingerprint)]
    paper_vocab = PAPER_DATA[PAPER_TABLES[study]]["vocab_size"] if corpus == PAPER_TABLES[study] else None
    slopes = vocabulary_slope(table, other, int(vocab), paper_vocab)
    if not slopes and study == "brown_table1":
        hint = (
            "How |V| alone moves them is not measured in this store: run "
            "`nplm-train -cd sweeps -cn brown_vocab data.path=...` (the n-gram rows with words seen <= 4 times "
            "merged, |V| just below the paper's) and rebuild this report."
        )
        slopes = [hint]
    return ([offset] if offset else []) + slopes


def _other_mixtures(study: str, table: pd.DataFrame, all_runs: pd.DataFrame, fingerprint: str) -> list[str]:
    """The paper's mixed rows with its two other weightings of the same MLP (sweeps/brown_mixtures): the MLP's
    weight learned on validation says why a fixed 0.5 helps or not."""
    if study not in PAPER_TABLES:
        return []
    finished = (all_runs["fingerprint"] == fingerprint) & (all_runs["state"] == "finished")
    runs = all_runs[finished & all_runs["mix"].isin(["learned", "context"])]
    runs = runs.assign(mlp_config=runs["config"].map(_unmixed))
    ours = table.set_index("label")
    lines = []
    mixed = (table["family"] == "mlp") & (table["mix"] == "yes") & (table["status"] == "finished")
    for row in table[mixed].itertuples():
        same = runs[(runs["row_tag"] == row.row) & (runs["mlp_config"] == _unmixed(row.config))]
        if same.empty:
            continue
        mlp = f"MLP{int(row.row.removeprefix('MLP')) - 1}"
        parts = [f"{row.label} ({mlp} and the trigram): 0.5 each, test {row.test_ppl:.1f}"]
        if mlp in ours.index and ours.loc[mlp, "status"] == "finished":
            parts[0] += f" ({mlp} alone {ours.loc[mlp, 'test_ppl']:.1f})"
        for mode, what in (("learned", "one weight learned on validation"), ("context", "one weight per context bin")):
            newest = newest_finished(same[same["mix"] == mode])
            if len(newest):
                weight = f", the MLP's {newest['mix_lambda'].mean():.2f}" if mode == "learned" else ""
                parts.append(
                    f"{what}{weight}, test {newest['test_ppl'].mean():.1f} ({len(newest)} seed{'s' * (len(newest) > 1)})"
                )
        lines.append("; ".join(parts))
    return lines


SAMPLED_ONLY = ("optim.output", "optim.samples", "optim.proposal", "optim.estimator", "trainer.limit_val_batches")


def _sampled_vs_exact(table: pd.DataFrame) -> list[str]:
    """Each trained MLP configuration run both ways: its sampled training against its exact training, on the
    exact perplexities of both, with epochs, wall time and the speed-up (exact minutes / sampled minutes)."""
    trained = table[(table["family"] == "mlp") & (table["mix"] == "no") & (table["status"] == "finished")]
    pairs: dict[str, dict[str, pd.Series]] = {}
    for _, row in trained.iterrows():
        config = json.loads(row["config"])
        model = json.dumps({k: v for k, v in config.items() if k not in SAMPLED_ONLY})
        pairs.setdefault(model, {})[config.get("optim.output", "exact")] = row
    lines = []
    for both in pairs.values():
        if {"exact", "sampled"} <= set(both):
            exact, sampled = both["exact"], both["sampled"]
            how = json.loads(sampled["config"])
            # time in fit where both have it: a run resumed in a later session spans the time between
            cost = "fit_minutes" if pd.notna(exact["fit_minutes"]) and pd.notna(sampled["fit_minutes"]) else "minutes"
            speedup = exact[cost] / sampled[cost] if sampled[cost] else np.nan
            diffs = ", ".join(
                f"{s} {sampled[f'{s}_ppl']:.1f} ({sampled[f'{s}_ppl'] / exact[f'{s}_ppl'] - 1:+.1%})"
                for s in ("valid", "test")
            )
            lines.append(
                f"{exact['row']}: exact valid {exact['valid_ppl']:.1f}, test {exact['test_ppl']:.1f}, "
                f"{exact['epochs']:.0f} epochs, {exact[cost]:.1f} min; sampled (k={how.get('optim.samples')}, "
                f"{how.get('optim.proposal')} proposal, {how.get('optim.estimator')}) {diffs}, "
                f"{sampled['epochs']:.0f} epochs, {sampled[cost]:.1f} min{' in fit' if cost == 'fit_minutes' else ''}: "
                f"{speedup:.1f}x faster"
            )
    return lines


def _unmixed(config: str) -> str:
    """A configuration less its mixture: the MLP it mixes."""
    return json.dumps({k: v for k, v in json.loads(config).items() if k != "model.mix"})


def _history(uri: str, table: pd.DataFrame) -> dict[str, list[tuple[str, list[float]]]]:
    """Validation perplexity per epoch of every seed of every trained (unmixed) MLP row shown."""
    client = mlflow.MlflowClient(uri)
    trained = table[(table["family"] == "mlp") & (table["mix"] == "no") & (table["status"] == "finished")]
    curves = {}
    for row in trained.itertuples():
        curves[row.label] = []
        for run_id in row.run_ids.split():
            points = sorted(client.get_metric_history(run_id, "valid_ppl_epoch"), key=lambda m: (m.step, m.timestamp))
            curves[row.label].append((run_id, [m.value for m in points]))
    return curves


def build(uri: str, experiment: str, study: str, fingerprint: str | None = None) -> Report:
    """Read the experiment's runs and assemble the report of `study`; NplmError when there is nothing honest to say."""
    raw = read_runs(uri, experiment)
    all_runs = tidy(raw)
    if all_runs.empty:
        raise NplmError(
            f"experiment {experiment!r} holds no nplm-repro runs (none of its {len(raw)} runs has a data_fingerprint tag)"
        )
    all_runs = assign_studies(all_runs)
    runs = all_runs[all_runs["study"] == study]
    if runs.empty:
        studies = ", ".join(sorted(all_runs["study"].unique()))
        raise NplmError(f"no runs of study {study!r} in experiment {experiment!r} (its studies: {studies})")
    fingerprint = _choose_fingerprint(study, runs, fingerprint)
    other = runs[runs["fingerprint"] != fingerprint]
    runs = runs[runs["fingerprint"] == fingerprint]
    if not (runs["state"] == "finished").any():
        states = ", ".join(f"{n} {s}" for s, n in runs["status"].value_counts().sort_index().items())
        raise NplmError(f"no finished runs of study {study!r} in experiment {experiment!r} ({states})")
    configs = configurations(runs)
    if study in PAPER_TABLES and not ((configs["paper_row"] >= 0) & (configs["status"] == "finished")).any():
        raise NplmError(
            f"no finished run of study {study!r} in experiment {experiment!r} has the columns of a row of the paper's "
            f"table ({(runs['state'] == 'finished').sum()} finished runs with other columns)"
        )
    corpus = runs["corpus"].iloc[0]
    if study in PAPER_TABLES:
        (table, attempts), extra = paper_study_table(study, configs), []
    else:
        (table, extra), attempts = other_study_table(corpus, configs), pd.DataFrame()
    shown = table.loc[table["status"] == "finished", "run_ids"].str.split().explode()
    newest = runs.sort_values("start_time").iloc[-1]
    other_data = (
        other.groupby("fingerprint")
        .agg(runs=("run_id", "size"), vocab_size=("vocab_size", "first"), newest=("start_time", "max"))
        .sort_values("newest", ascending=False)
        .reset_index()
    )
    active = runs.sort_values(["start_time", "run_id"])
    data = {k: newest[k] for k in ("vocab_size", *(f"{s}_tokens" for s in SPLITS))}
    return Report(
        study=study,
        experiment=experiment,
        corpus=corpus,
        source=newest["source"],
        fingerprint=fingerprint,
        data=data,
        commits=sorted(set(runs.loc[runs["run_id"].isin(shown), "git_commit"]) - {""}),
        table=table,
        extra=extra,
        attempts=attempts,
        claims=check_claims(study, table),
        running=active[active["state"] == "running"],
        failed=active[active["state"] == "failed"],
        excluded=_excluded(study, all_runs, fingerprint),
        other_data=other_data,
        data_effect=_data_effect(study, table, all_runs, fingerprint, data["vocab_size"]),
        other_mixtures=_other_mixtures(study, table, all_runs, fingerprint),
        sampled=_sampled_vs_exact(table),
        history=_history(uri, table),
    )


# --- formats --------------------------------------------------------------------------------------------------


def _ours(row: pd.Series, split: str) -> str:
    if row["status"] != "finished":
        return {"missing": "not run"}.get(row["status"], row["status"])
    mean, std = row[f"{split}_ppl"], row[f"{split}_ppl_std"]
    if not _present(mean):
        return ""
    return f"{mean:.1f} ± {std:.1f}" if _present(std) else f"{mean:.1f}"


def _seeds(row: pd.Series) -> str:
    return f"{row['seeds']}" + (f" (+{row['running']} running)" if row["running"] else "")


def display(report: Report) -> pd.DataFrame:
    """The table as text: ours (mean ± std over seeds), the paper's and the relative difference per split."""
    keys = ["row", *COLUMNS, *report.extra]
    frame = {("", k): report.table[k] for k in keys}
    for split in SPLITS:
        paper, diff = report.table[f"paper_{split}_ppl"], report.table[f"{split}_rel_diff"]
        frame[(split, "ours")] = report.table.apply(_ours, axis=1, split=split)
        frame[(split, "paper")] = paper.map(lambda v: f"{v:g}" if _present(v) else "")
        frame[(split, "diff")] = diff.map(lambda v: f"{v:+.1%}" if _present(v) else "")
    frame[("", "seeds")] = report.table.apply(_seeds, axis=1)
    return pd.DataFrame(frame)


def csv_table(report: Report) -> pd.DataFrame:
    """Every number of the table, unrounded (running, failed and missing rows have no perplexity)."""
    columns = [
        "row",
        *COLUMNS,
        *report.extra,
        *(f"{s}_ppl" for s in SPLITS),
        *(f"paper_{s}_ppl" for s in SPLITS),
        "seeds",
        *(f"{s}_ppl_std" for s in SPLITS),
        *(f"{s}_rel_diff" for s in SPLITS),
        "status",
        "running",
        "failed",
        "family",
        "config_id",
        "run_ids",
    ]
    return report.table.reindex(columns=columns)


def _markdown_table(frame: pd.DataFrame) -> str:
    headers = [top if sub == "ours" else sub for top, sub in frame.columns]
    align = ["left" if sub in ("row", "seeds") else "right" for _, sub in frame.columns]
    return frame.to_markdown(index=False, headers=headers, colalign=align)


def attempts_table(report: Report) -> pd.DataFrame:
    """Per paper row run in several configurations: each configuration, what differs from the one shown."""
    rows = []
    for _, group in report.attempts.groupby("row", sort=False) if len(report.attempts) else ():
        chosen = json.loads(group.loc[group["chosen"], "config"].iloc[0])
        for _, a in group.sort_values(["chosen", "valid_ppl"], ascending=[False, True]).iterrows():
            config = json.loads(a["config"])
            differs = [
                f"{k}={config.get(k, '(unset)')} (shown: {chosen.get(k, '(unset)')})"
                for k in sorted(set(config) | set(chosen))
                if config.get(k) != chosen.get(k)
            ]
            rows.append(
                {
                    "row": a["row"],
                    "config": a["config_id"],
                    "shown": "yes" if a["chosen"] else "",
                    "seeds": a["seeds"],
                    "valid": _ours(a, "valid"),
                    "test": _ours(a, "test"),
                    "differs from the one shown": "; ".join(differs),
                    "note": a["notes"],
                }
            )
    return pd.DataFrame.from_records(rows)


def _run_text(run: pd.Series) -> str:
    """A run as the lists under the table name it: row tag (or family), columns, run name and id."""
    columns = ", ".join(f"{c}={run[c]}" for c in COLUMNS if run[c] != "")
    return f"{_name(run)} ({columns}; run {run['name']}, {run['run_id'][:8]}, seed {run['seed']})"


def _name(run: pd.Series) -> str:
    """Its row tag, or else its model family's name."""
    return run["row_tag"] or FAMILY_NAMES.get(run["family"], run["family"])


def _runs_list(runs: pd.DataFrame) -> list[str]:
    return [
        f"{_run_text(run)}: {run['status']}" + (f"; note: {run['note']}" if run["note"] else "")
        for _, run in runs.iterrows()
    ]


def _sections(report: Report) -> list[tuple[str, list[str]]]:
    """The lists under the table: what is not in it, and why."""
    others = [
        f"`{r.fingerprint}`: {r.runs} runs, |V| = {r.vocab_size}, newest {r.newest:%Y-%m-%d %H:%M} UTC"
        for r in report.other_data.itertuples()
    ]
    return [
        ("What our data alone moves", report.data_effect),
        ("The mixed rows with the paper's two other weightings (sweeps/brown_mixtures)", report.other_mixtures),
        ("Sampled against exact training (same model, seed and data; exact perplexities of both)", report.sampled),
        ("Missing (no run)", report.missing),
        ("Running (shown as running, never as a number)", _runs_list(report.running)),
        ("Failed or killed", _runs_list(report.failed)),
        ("Excluded (named after a row of the paper's table, but not in it)", report.excluded),
        ("Other data fingerprints (not mixed in; pass --fingerprint to report one)", others),
    ]


def _title(report: Report) -> str:
    what = PAPER_TITLES.get(report.study, f"study {report.study}")
    source = f", read from {report.source}" if report.source else ""
    return f"{report.study}: Bengio et al. (2003), {what}, our runs on corpus {report.corpus}{source}"


def _data_line(report: Report) -> str:
    count = {k: f"{int(v):,}" if v else "?" for k, v in report.data.items()}
    tokens = " / ".join(count[f"{s}_tokens"] for s in SPLITS)
    source = f" read from `{report.source}`" if report.source else ""
    line = (
        f"Data: corpus `{report.corpus}`{source} (MLflow experiment `{report.experiment}`), "
        f"fingerprint `{report.fingerprint}`, |V| = {count['vocab_size']}, train / valid / test tokens {tokens}"
    )
    paper_corpus = PAPER_TABLES.get(report.study, report.corpus)
    if paper_corpus in PAPER_DATA:
        p = PAPER_DATA[paper_corpus]
        line += (
            f" (the paper's numbers are on {PAPER_CORPORA[paper_corpus]}: |V| = {p['vocab_size']:,}, "
            f"{' / '.join(f'{p[s]:,}' for s in SPLITS)})"
        )
    return line + "."


def _intro(report: Report) -> list[str]:
    commits = [f"`{c[:7]}{'+dirty' if c.endswith('+dirty') else ''}`" for c in report.commits]
    explain = (
        "Perplexities of every token of each split: ours (mean ± std over seeds when there are several; `seeds` "
        "counts them), the paper's, and the relative difference (ours - paper) / paper."
    )
    return [_data_line(report), f"Code (git commits of the runs shown): {', '.join(commits) or '?'}.", explain]


def markdown(report: Report, figures: list[str]) -> str:
    lines = [f"# {_title(report)}", "", *(f"{line}\n" for line in _intro(report)), _markdown_table(display(report))]
    if report.claims:
        lines += ["", "## The paper's claims, on our numbers", ""]
        for claim in report.claims:
            lines.append(f"- **{claim.text}**: {claim.verdict}.")
            lines += [f"  - {line}" for line in claim.evidence]
    for heading, items in _sections(report):
        if items:
            lines += ["", f"## {heading}", "", *(f"- {item}" for item in items)]
    attempts = attempts_table(report)
    if not attempts.empty:
        lines += [
            "",
            "## Attempts",
            "",
            "Rows run in several configurations; the table shows the one with the lowest mean validation perplexity.",
            "",
            attempts.to_markdown(index=False),
        ]
    if figures:
        lines += ["", "## Figures", "", *(f"![{f}]({f})" for f in figures)]
    lines += ["", "## Regenerate", "", "From the directory that holds the store (or with `--tracking-uri`):", ""]
    lines += ["```bash", report.command, "```", ""]
    return "\n".join(lines)


def _latex_escape(text: str) -> str:
    return "".join(rf"\{ch}" if ch in "&%$#_{}" else ch for ch in text)


def latex(report: Report) -> str:
    """The table alone, booktabs rules, for a paper."""
    frame = display(report)
    caption = _latex_escape(f"{_title(report)}. Data fingerprint {report.fingerprint}.")
    styled = frame.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    column_format = "".join("l" if sub == "row" else "r" for _, sub in frame.columns)
    text = styled.to_latex(hrules=True, multicol_align="c", caption=caption, column_format=column_format)
    return text.replace("±", r"$\pm$")


def html_page(report: Report, figures: list[str]) -> str:
    e = html.escape
    parts = [f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{e(report.study)}</title></head><body>"]
    parts += [f"<h1>{e(_title(report))}</h1>", *(f"<p>{e(line)}</p>" for line in _intro(report))]
    parts.append(display(report).to_html(index=False, border=0))
    if report.claims:
        parts.append("<h2>The paper's claims, on our numbers</h2><ul>")
        for claim in report.claims:
            evidence = "".join(f"<li>{e(line)}</li>" for line in claim.evidence)
            parts.append(f"<li><b>{e(claim.text)}</b>: {e(claim.verdict)}.<ul>{evidence}</ul></li>")
        parts.append("</ul>")
    for heading, items in _sections(report):
        if items:
            parts += [f"<h2>{e(heading)}</h2><ul>", *(f"<li>{e(i)}</li>" for i in items), "</ul>"]
    attempts = attempts_table(report)
    if not attempts.empty:
        parts += ["<h2>Attempts</h2>", attempts.to_html(index=False, border=0)]
    parts += [f"<img src='{e(f)}' alt='{e(f)}'>" for f in figures]
    parts += [f"<h2>Regenerate</h2><pre>{e(report.command)}</pre></body></html>\n"]
    return "\n".join(parts)


# --- figures --------------------------------------------------------------------------------------------------


def _sort_values(values: list[str]) -> list[str]:
    numeric = pd.to_numeric(pd.Series(values), errors="coerce")
    return [v for _, v in sorted(zip(numeric, values))] if numeric.notna().all() else sorted(values)


def valid_by_epoch(report: Report, path: Path) -> bool:
    """Validation perplexity per epoch, one line per seed of every trained MLP row; False when there is none."""
    curves = {row: seeds for row, seeds in report.history.items() if any(values for _, values in seeds)}
    if not curves:
        return False
    figure = Figure(figsize=(7, 4.5))
    ax = figure.add_subplot()
    for colour, (row, seeds) in enumerate(curves.items()):
        for i, (_, values) in enumerate(seeds):
            epochs = range(1, len(values) + 1)
            ax.plot(epochs, values, marker="o", color=f"C{colour % 10}", label=row if i == 0 else None)
    ax.set(xlabel="epoch", ylabel="validation perplexity", title=f"{report.study}: validation perplexity per epoch")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    return True


def against_knob(report: Report, knob: str, path: Path) -> bool:
    """Valid and test perplexity of every finished row against one knob (ours filled, the paper's hollow)."""
    rows = report.table[(report.table["status"] == "finished") & (report.table[knob].astype(str) != "")]
    values = _sort_values(sorted(set(rows[knob].astype(str))))
    if len(values) < 2:
        return False
    position = {v: i for i, v in enumerate(values)}
    figure = Figure(figsize=(10, 4.2))
    axes = figure.subplots(1, 2, sharey=True)
    families = list(dict.fromkeys(rows["family"]))
    for ax, split in zip(axes, ("valid", "test")):
        for colour, family in enumerate(families):
            mine = rows[rows["family"] == family]
            x = mine[knob].astype(str).map(position)
            ax.scatter(x, mine[f"{split}_ppl"], color=f"C{colour}", label=f"{FAMILY_NAMES.get(family, family)}")
            ax.scatter(x, mine[f"paper_{split}_ppl"], facecolors="none", edgecolors=f"C{colour}")
            for xi, y, text in zip(x, mine[f"{split}_ppl"], mine["label"]):
                ax.annotate(text, (xi, y), fontsize=6, xytext=(4, 2), textcoords="offset points")
        ax.set(xticks=range(len(values)), xticklabels=values, xlabel=knob, title=f"{split} perplexity")
        ax.margins(x=0.3)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("perplexity (filled: ours, hollow: paper)")
    axes[0].legend(fontsize="small")
    figure.suptitle(f"{report.study}: perplexity against {knob}")
    figure.savefig(path, dpi=110, bbox_inches="tight")
    return True


# --- writing --------------------------------------------------------------------------------------------------


def write(report: Report, out: Path) -> list[Path]:
    """Every file of the report, built in a temporary directory and moved into `out` only once all are built."""
    with tempfile.TemporaryDirectory(prefix="nplm-report-") as tmp:
        staging = Path(tmp)
        figures = [f"{report.study}_valid_by_epoch.png"]
        figures = [name for name in figures if valid_by_epoch(report, staging / name)]
        for knob in (*COLUMNS, *report.extra):
            name = f"{report.study}_{knob}.png"
            if against_knob(report, knob, staging / name):
                figures.append(name)
        (staging / f"{report.study}.md").write_text(markdown(report, figures))
        (staging / f"{report.study}.tex").write_text(latex(report))
        (staging / f"{report.study}.html").write_text(html_page(report, figures))
        csv_table(report).to_csv(staging / f"{report.study}.csv", index=False)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for path in sorted(staging.iterdir()):
            written.append(out / path.name)
            shutil.move(path, written[-1])
    return written


def _main() -> None:
    parser = argparse.ArgumentParser(prog="nplm-report", description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="brown_table1", help="brown_table1, ap_table2, or a sweep's name")
    parser.add_argument("--experiment", help="MLflow experiment (default: the paper table's corpus, else brown)")
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db",
        help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db",
    )
    parser.add_argument("--fingerprint", help="data fingerprint to report (default: that of the newest run)")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="directory of the report (default: reports)")
    args = parser.parse_args()
    experiment = args.experiment or PAPER_TABLES.get(args.study, "brown")
    report = build(args.tracking_uri, experiment, args.study, args.fingerprint)
    for path in write(report, args.out):
        print(path)


main = cli(_main)

if __name__ == "__main__":
    main()
