"""The one rule for "the best" of a study. The report (its best trained row, whose word features it shows), the
Model Registry (the version a study's `champion` alias names) and `nplm-score --row` / `nplm-ask --row` each used
to choose in its own way, and named different runs; now all three ask this module.

Among the rows the study's report shows (tracking/runs.py: its runs on its newest data, per seed the newest
FINISHED run), the best row is the one that trained a model of its own (not counted, not mixed) with the lowest
mean validation perplexity over its seeds, the newest on a tie; the best run is that row's seed with the lowest
validation perplexity. Never chosen on test. `--row R` takes R as the report shows it (of its configurations the
one with the lowest mean validation perplexity), then its seed with the lowest validation perplexity, or with
`--seed` that seed's run, the one the row averages. Torch-free: the report reads it.
"""

from __future__ import annotations

import pandas as pd

from nplm_repro.errors import NplmError
from nplm_repro.paper import ROW_NAMES
from nplm_repro.studies import declaration
from nplm_repro.tracking.runs import configurations, study_runs

# How configurations are ranked: the lowest mean validation perplexity first, the newest first on a tie
BY, ASCENDING = ["valid_ppl", "newest"], [True, False]


def best(configs: pd.DataFrame) -> pd.Series:
    """The configuration a row shows: the best finished one (`BY`); else the newest running or failed one."""
    for status in ("finished", "running", "failed"):
        candidates = configs[configs["status"] == status]
        if len(candidates):
            if status == "finished":
                return candidates.sort_values(BY, ascending=ASCENDING).iloc[0]
            return candidates.sort_values("newest", ascending=False).iloc[0]
    raise ValueError("no configuration")


def finished_rows(table: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The finished rows of one kind: `trained` (a model of their own: the rows with weights), `counted` (n-grams),
    `mixed`."""
    return table[(table["kind"] == kind) & (table["status"] == "finished")]


def trained_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The finished rows that trained a model of their own (not counted, not mixed): the rows with weights."""
    return finished_rows(table, "trained")


def shown(study: str, configs: pd.DataFrame) -> pd.DataFrame:
    """The configurations a study's report shows as rows or their attempts: in a study that declares a paper table
    (`reporting.paper`) those that fill one of its rows (a run with other columns is only listed under the table, as
    left out); in any other study all."""
    return configs[configs["paper_row"] >= 0] if declaration(study).get("paper") else configs


def best_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The trained rows of a report's table (or of the configurations it shows), the best row first."""
    return trained_rows(rows).sort_values(BY, ascending=ASCENDING)


def best_row(rows: pd.DataFrame) -> pd.Series | None:
    """The best row (module docstring), or None when no row trained a model of its own."""
    ranked = best_rows(rows)
    return ranked.iloc[0] if len(ranked) else None


def seeds(row: pd.Series, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs a row averages, one per seed (`run_ids`), the lowest validation perplexity first (the newest on a
    tie): the first is the row's best run."""
    averaged = runs[runs["run_id"].isin(row["run_ids"].split())]
    return averaged.sort_values(["valid_ppl", "start_time"], ascending=[True, False])


def ranked_runs(study: str, runs: pd.DataFrame) -> list[pd.Series]:
    """The study's trained runs (`runs`: the study's on its data, as `study_runs` gives them) in the order the rule
    prefers them, its best run first: rows best first, and within a row its seeds best first. The registry walks
    it past runs without weights."""
    rows = best_rows(shown(study, configurations(runs)))
    return [run for _, row in rows.iterrows() for _, run in seeds(row, runs).iterrows()]


def row_run(uri: str, experiment: str, study: str, row: str, seed: int | None = None) -> str:
    """The run of `--row` (the runs tagged `row`, as `experiment=<row>` tags them) in `study`, by the rule: the row
    as the report shows it, then its best seed's run, or that of `seed`."""
    found = study_runs(uri, experiment, study)
    configs = shown(study, configurations(found.runs))
    mine = configs[configs["row_tag"] == ROW_NAMES.get(row, row)]
    finished = mine[mine["status"] == "finished"]
    if finished.empty:
        tagged = sorted(set(configs.loc[configs["status"] == "finished", "row_tag"]) - {""})
        has = f"its finished rows: {', '.join(tagged)}" if tagged else "it has no finished row with a row tag"
        raise NplmError(f"no FINISHED run of row {row!r} in study {study!r} on data {found.fingerprint} ({has})")
    runs = seeds(best(finished), found.runs)
    if seed is not None:
        runs, others = runs[runs["seed"] == str(seed)], ", ".join(sorted(runs["seed"]))
        if runs.empty:
            raise NplmError(f"row {row!r} of study {study!r} has no FINISHED run of seed {seed} (its seeds: {others})")
    return str(runs.iloc[0]["run_id"])
