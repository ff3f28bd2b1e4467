"""From runs to the Report: the paper's rows side by side with ours (mean ± std over seeds), the configurations
tried per row, the claims checked, and everything else a report says, before any format."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from nplm_repro.data.splits import SPLITS
from nplm_repro.errors import NplmError
from nplm_repro.paper import (
    COLUMNS,
    FAMILY_NAMES,
    PAPER_SETUP,
    PAPER_TABLES,
    label,
    own_name,
    paper_table,
    row_key,
)
from nplm_repro.reporting import notes, recipe
from nplm_repro.reporting.claims import Claim, check_claims
from nplm_repro.reporting.endings import best_epochs, improving, seed_epochs, stopped, unconverged
from nplm_repro.reporting.formats import mean_std, pct
from nplm_repro.reporting.intervals import Evidence
from nplm_repro.reporting.runs import Timeline, history, timeline, training_speeds, varying_keys
from nplm_repro.scores import KEPT_SPLITS
from nplm_repro.serving.feature_map import draw
from nplm_repro.storage.archive import Archive, ArchiveSource
from nplm_repro.studies import declaration
from nplm_repro.tracking.best import best, best_row, seeds
from nplm_repro.tracking.archived import study_archive
from nplm_repro.tracking.runs import configurations, present, study_runs


def _with_rel_diff(table: pd.DataFrame) -> pd.DataFrame:
    for split in SPLITS:
        table[f"{split}_rel_diff"] = table[f"{split}_ppl"] / table[f"paper_{split}_ppl"] - 1
    return table


def with_intervals(table: pd.DataFrame, evidence: Evidence) -> pd.DataFrame:
    """The table with each row's 95% interval over texts, `<split>_low` and `<split>_high`, where its runs kept
    scores (NaN where they did not)."""
    table = table.copy()
    for split in KEPT_SPLITS:
        bounds = [evidence.perplexity(label, split) or (np.nan, np.nan) for label in table["label"]]
        table[f"{split}_low"], table[f"{split}_high"] = [b[0] for b in bounds], [b[1] for b in bounds]
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
        chosen = best(mine)
        rows.append({**row, **chosen.drop(["family", *COLUMNS]).to_dict()})
        if len(mine) > 1:
            attempts.append(mine.assign(row=label(row), chosen=mine["config"] == chosen["config"]))
    table = _with_rel_diff(pd.DataFrame.from_records(rows))
    table["label"] = table.apply(label, axis=1)
    return table, pd.concat(attempts, ignore_index=True) if attempts else pd.DataFrame()


def other_study_table(corpus: str, configs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One row per configuration, with the config keys that vary as extra columns; the paper's numbers beside
    the configurations that have a paper row's columns."""
    table = configs.copy()
    study = next((s for s, c in PAPER_TABLES.items() if c == corpus), None)
    paper = paper_table(study) if study else pd.DataFrame(columns=["row", "family", *COLUMNS])
    by_columns = {row_key(r["family"], r): r for _, r in paper.iterrows()}
    matched = [by_columns.get(row_key(r["family"], r)) for _, r in table.iterrows()]
    # a paper row by its name; another configuration of a paper's family by its own row tag (MLP searched), else by
    # its columns (MLP n=5 h=50 ...); another family's by its row tag, else its label
    table["row"] = [
        m["row"]
        if m is not None
        else own_name(r["row_tag"]) or FAMILY_NAMES.get(r["family"]) or r["row_tag"] or r["family_label"]
        for m, (_, r) in zip(matched, table.iterrows())
    ]
    # the keys that tell the configurations of one row name apart (its label and a column each); two rows of other
    # names are told apart by their names
    extras = {name: varying_keys(group) for name, group in table.groupby("row", sort=False)}
    extra = sorted({k for keys in extras.values() for k in keys})
    for key in extra:
        table[key] = [short(json.loads(c).get(key, "")) for c in table["config"]]
    papers = [
        m if m is not None and all(json.loads(c).get(k, v) == v for k, v in PAPER_SETUP.items()) else None
        for m, c in zip(matched, table["config"])
    ]
    for split in SPLITS:
        table[f"paper_{split}_ppl"] = [m[f"paper_{split}_ppl"] if m is not None else np.nan for m in papers]
    order = {f: i for i, f in enumerate(FAMILY_NAMES)}  # the paper's families, then others: trained, counted, mixed
    later = table["kind"].map({k: len(order) + i for i, k in enumerate(("trained", "counted", "mixed"))})
    table = table.assign(
        _family=table["family"].map(order).fillna(later),
        **{f"_{c}": pd.to_numeric(table[c], errors="coerce") for c in ("n", "c", "h", "m")},
    )
    table = table.sort_values(["_family", "_n", "_c", "_h", "_m", "direct", "mix", *extra, "config"])
    table = _with_rel_diff(table.drop(columns=[c for c in table if c.startswith("_")]).reset_index(drop=True))
    table["label"] = [label(r, extra=extras[r["row"]]) for _, r in table.iterrows()]
    return table, extra


def short(value: str) -> str:
    """A configuration's value as a reader reads it: a fraction to 3 significant digits (a searched learning rate
    0.000492264 is 0.000492), anything else as it is."""
    try:
        number = float(value)
    except ValueError:
        return value
    return value if number.is_integer() or not math.isfinite(number) else f"{number:.3g}"


def with_per_seed(table: pd.DataFrame, name: str, values: dict[str, dict[str, float]]) -> pd.DataFrame:
    """The table with `name` and `name_std`, the mean and std over seeds of a per-seed value (`best_epoch`; the
    training tokens/s, `train_speed`); NaN for rows without one."""
    found = [list(values.get(label, {}).values()) for label in table["label"]]
    return table.assign(
        **{
            name: [np.mean(v) if v else np.nan for v in found],
            f"{name}_std": [np.std(v, ddof=1) if len(v) > 1 else np.nan for v in found],
        }
    )


@dataclass(frozen=True)
class Learned:
    """The best trained row's `features/` artifacts (serving/features.py): neighbours of probe words, the paper's example
    sentences, the map of the frequent words (PNG bytes)."""

    label: str
    run_id: str
    neighbours: tuple[str, ...]
    sentences: tuple[str, ...]
    map_png: bytes


def learned_features(source: ArchiveSource, table: pd.DataFrame, runs: pd.DataFrame) -> Learned | None:
    """What the best trained row's word features learned (tracking/best.py), of its best seed that has them, the map
    drawn from its points; None with no trained row, or runs made before runs kept them (`nplm-ask features RUN
    --log`)."""
    chosen = best_row(table)
    if chosen is None:
        return None
    for run_id in seeds(chosen, runs)["run_id"]:
        found = source.features(run_id)
        if found is not None:
            return Learned(
                chosen["label"], run_id, tuple(found["neighbours"]), tuple(found["sentences"]), draw(found["map"])
            )
    return None


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
    evidence: Evidence
    running: pd.DataFrame
    failed: pd.DataFrame
    other_data: pd.DataFrame
    notes: list[tuple[str, list[str]]]  # the lists the study declares under its table: (heading, lines)
    reproducibility: list[str]
    history: dict[str, list[tuple[str, list[float]]]]
    timeline: Timeline = field(default_factory=dict)  # validation perplexity against CPU minutes (runs.timeline)
    require_clean: bool = False
    left_out: int = 0  # runs of the study from dirty work trees, left out by require_clean
    recipe: recipe.Findings | None = None  # a study that declares a `recipe` (brown_recipe)
    learned: Learned | None = None  # what the best trained row's features learned (its run's features/ artifacts)
    spec: dict[str, Any] = field(default_factory=dict)  # what the study declares for its report (studies.py)
    unconverged: list[str] = field(default_factory=list)  # rows with a seed stopped at max_epochs still improving
    archive: Archive | None = None  # the runs it was built from (storage/archive.py), shipped beside it

    @property
    def command(self) -> str:
        clean = " --require-clean" if self.require_clean else ""
        return (
            f"nplm-report --study {self.study} --experiment {self.experiment} --fingerprint {self.fingerprint}{clean}"
        )

    @property
    def marked(self) -> pd.Series:
        """The rows that average runs from a work tree with uncommitted changes."""
        return self.table.get("dirty_runs", pd.Series(0, index=self.table.index)).fillna(0) > 0

    @property
    def missing(self) -> list[str]:
        return list(self.table.loc[self.table["status"] == "missing", "label"])


def build(
    runs_of: str | Archive,
    experiment: str,
    study: str,
    fingerprint: str | None = None,
    require_clean: bool = False,
    spec: dict[str, Any] | None = None,
) -> Report:
    """Assemble the report of `study` from its archive (`runs_of`: an Archive, or a store's URI, whose study's
    archive is made first: a report and its archive never disagree); NplmError when there is nothing honest to say.
    The report keeps the archive it was built from (`Report.archive`).

    `spec` is what the study declares for its report (studies.py; default: its sweeps file's).
    `require_clean` leaves out the runs made from a work tree with uncommitted changes (their code is unknown or
    only in their git_diff.patch), before anything is chosen or averaged."""
    spec = declaration(study) if spec is None else spec
    paper = spec.get("paper")
    if isinstance(runs_of, str):
        runs_of = study_archive(runs_of, experiment, study, spec, fingerprint)
    fingerprint, source = fingerprint or runs_of.fingerprint, ArchiveSource(runs_of)
    found = study_runs(source, experiment, study, fingerprint, require_clean)
    all_runs, runs, other, fingerprint = found.every, found.runs, found.other, found.fingerprint
    configs = configurations(runs)
    if paper and not ((configs["paper_row"] >= 0) & (configs["status"] == "finished")).any():
        raise NplmError(
            f"no finished run of study {study!r} in experiment {experiment!r} has the columns of a row of the paper's "
            f"table ({(runs['state'] == 'finished').sum()} finished runs with other columns)"
        )
    corpus = runs["corpus"].iloc[0]
    if paper:
        (table, attempts), extra = paper_study_table(paper, configs), []
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
    commits = sorted(set(runs.loc[runs["run_id"].isin(shown), "git_commit"]) - {""})
    plan = recipe.Recipe.declared(spec["recipe"]) if "recipe" in spec else None
    table = recipe.labelled(plan, table) if plan else table
    evidence = Evidence.read(source, table)
    table = with_intervals(table, evidence)
    curves, findings = history(source, table), None
    seeds, stops = dict(zip(runs["run_id"], runs["seed"])), dict(zip(runs["run_id"], runs["stopped_by"]))
    epochs, speeds = best_epochs(curves, seeds), training_speeds(source, table, seeds)
    table = with_per_seed(with_per_seed(table, "best_epoch", epochs), "train_speed", speeds)
    table = table.assign(
        improving=[improving(curves, label) for label in table["label"]],
        seed_epochs=[seed_epochs(curves, seeds, label) for label in table["label"]],
        stopped=[stopped(run_ids, stops, seeds) for run_ids in table["run_ids"].fillna("")],
    )
    claims = check_claims(spec.get("claims") or [], table, evidence, epochs, speeds, all_runs)
    if plan:
        table1 = fast_rows(plan, all_runs, fingerprint)
        claims = recipe.claims(plan, source, table, table1)
        findings = recipe.findings(plan, table, table1, curves)
    context = notes.Context(study, spec, table, all_runs, fingerprint, data["vocab_size"], evidence, curves)
    return Report(
        study=study,
        experiment=experiment,
        corpus=corpus,
        source=newest["source"],
        fingerprint=fingerprint,
        data=data,
        commits=commits,
        table=table,
        extra=extra,
        attempts=attempts,
        claims=claims,
        evidence=evidence,
        running=active[active["state"] == "running"],
        failed=active[active["state"] == "failed"],
        other_data=other_data,
        notes=notes.declared_notes(context),
        reproducibility=notes.reproducibility(table, runs, evidence, commits),
        history=curves,
        timeline=timeline(source, table, runs) if "compute" in (spec.get("figures") or []) else {},  # its one reader
        require_clean=require_clean,
        left_out=found.left_out,
        recipe=findings,
        learned=learned_features(source, table, runs),
        spec=spec,
        unconverged=unconverged(table, curves, stops, seeds),
        archive=runs_of,
    )


def fast_rows(plan: recipe.Recipe, all_runs: pd.DataFrame, fingerprint: str) -> pd.DataFrame | None:
    """Study `against` (Table 1) as this store reproduced it with optim=fast and the exact softmax (its other
    attempts left out), n-gram rows included, on this data; None when it has no such finished row."""
    runs = all_runs[(all_runs["study"] == plan.against) & (all_runs["fingerprint"] == fingerprint)]
    configs = [json.loads(c) for c in runs["config"]]
    fast = [c.get("optim.recipe", "fast") == "fast" and c.get("optim.output", "exact") == "exact" for c in configs]
    runs = runs[pd.Series(fast, index=runs.index, dtype=bool)]
    if not (runs["state"] == "finished").any():
        return None
    return paper_study_table(plan.paper, configurations(runs))[0]


DIRTY_MARK = " (+dirty)"


def _ours(row: pd.Series, split: str) -> str:
    if row["status"] != "finished":
        return {"missing": "not run"}.get(row["status"], row["status"])
    return mean_std(row[f"{split}_ppl"], row[f"{split}_ppl_std"])


def _interval(row: pd.Series, split: str) -> str:
    low, high = row[f"{split}_low"], row[f"{split}_high"]
    return f"{low:.1f}-{high:.1f}" if row["status"] == "finished" and present(low) else ""


def _seeds(row: pd.Series) -> str:
    return f"{row['seeds']}" + (f" (+{row['running']} running)" if row["running"] else "")


def display(report: Report) -> pd.DataFrame:
    """The table as text: ours (mean ± std over seeds), the paper's and the relative difference per split."""
    filled = [c for c in COLUMNS if report.table[c].map(lambda v: present(v) and v != "").any()]
    keys = ["row", *filled, *report.extra]  # a paper column no row has (an LSTM's n) is left out
    frame = {("", k): report.table[k] for k in keys}
    frame[("", "row")] = report.table["row"].where(~report.marked, report.table["row"] + DIRTY_MARK)
    for split in SPLITS:
        paper, diff = report.table[f"paper_{split}_ppl"], report.table[f"{split}_rel_diff"]
        frame[(split, "ours")] = report.table.apply(_ours, axis=1, split=split)
        if split in KEPT_SPLITS and report.table[f"{split}_low"].notna().any():
            frame[(split, "95% interval")] = report.table.apply(_interval, axis=1, split=split)
        frame[(split, "paper")] = paper.map(lambda v: f"{v:g}" if present(v) else "")
        frame[(split, "diff")] = diff.map(pct)
    columns = report.spec.get("columns", [])
    if "test_range" in columns:
        frame[("test", "seeds' range")] = report.table.apply(_range, axis=1, split="test")
    if "best_epoch" in columns:
        frame[("", "best epoch")] = report.table.apply(_best_epoch, axis=1)
    if "improving" in columns:
        frame[("", "improving at the end")] = report.table["improving"]
    if "seed_epochs" in columns:
        frame[("", "best epoch (seed), * still improving")] = report.table["seed_epochs"]
    if "stopped" in columns:
        frame[("", "stopped by (seed)")] = report.table["stopped"]
    if "train_speed" in columns:
        frame[("", "training tokens/s")] = report.table.apply(_train_speed, axis=1)
    frame[("", "seeds")] = report.table.apply(_seeds, axis=1)
    return pd.DataFrame(frame)


def _range(row: pd.Series, split: str) -> str:
    low, high = row.get(f"{split}_ppl_min"), row.get(f"{split}_ppl_max")
    return f"{low:.1f}-{high:.1f}" if row["status"] == "finished" and row["seeds"] > 1 and present(low) else ""


def _best_epoch(row: pd.Series) -> str:
    return mean_std(row["best_epoch"], row["best_epoch_std"], alone=".0f")


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


def _train_speed(row: pd.Series) -> str:
    return mean_std(row["train_speed"], row["train_speed_std"], ",.0f")
