"""An experiment's runs as the report counts them: one tidy row each, sorted into studies, grouped into
configurations, seeds averaged; and a study's runs on its data (`study_runs`). The report, the registry and
`nplm-score --row` all read runs this way (tracking/best.py chooses among them), so they agree on what a study holds.

Which runs: a run belongs to the study its `study` tag names; without one, to the paper's table of its corpus
when its `row` tag names a row of that table and its model has the row's columns (n, c, h, m, direct, mix),
else to `adhoc`. Only runs of one data fingerprint are reported (the newest run's, unless one is named).
Runs of one configuration (the config less seed and bookkeeping) are averaged over seeds, taking the newest
FINISHED run of each seed. A run from before a tag is read as if it had it (nplm_repro/migrations.py
`upgrade_runs`). Torch-free: the report reads it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass

import mlflow
import numpy as np
import pandas as pd

from nplm_repro.data.splits import SPLITS
from nplm_repro.errors import NplmError
from nplm_repro.migrations import DEFAULTS_BEFORE, FAMILY_IDS, upgrade_runs
from nplm_repro.paper import (
    COLUMNS,
    FAMILY_NAMES,
    PAPER_MODEL,
    PAPER_TABLES,
    PAPER_TRIGRAM,
    ROW_NAMES,
    paper_table,
    row_key,
)
from nplm_repro.storage.archive import ArchiveSource
from nplm_repro.storage.redaction import redact
from nplm_repro.storage.store import check_store, sqlite_file, tracking_at
from nplm_repro.tracking.keys import IMPLIED, is_bookkeeping, without_unused
from nplm_repro.tracking.stops import stopped_by

# What a result depends on: a counted or mixed row, the data and the model's knobs; a trained one, its training too.
# The data itself is pinned by the fingerprint; tracking.* and the row name are labels, not configuration.
TRAINED_GROUPS = ("data.", "model.", "optim.", "trainer.", "callbacks.")
OTHER_GROUPS = ("data.", "model.")
# The status of a run whose perplexity is not a finite number (one recorded FINISHED by a version that did not fail
# it): it diverged, so it is shown among the failed runs and no table, claim or registry takes it
DIVERGED_STATUS = "DIVERGED (a perplexity is not finite)"
MIX = {"none": "no", "fixed": "yes"}  # the paper's mix column: weight 0.5 on each, or no mixture


def dirty(runs: pd.DataFrame) -> pd.Series:
    """Which runs ran from a work tree with uncommitted changes (git commit `+dirty`): that commit alone is not their
    code (newer runs keep the rest as their artifact git_diff.patch)."""
    return runs["git_commit"].str.endswith("+dirty")


def present(value: object) -> bool:
    """A value MLflow recorded: neither missing (None) nor a NaN from a run without it."""
    return value is not None and not (isinstance(value, float) and np.isnan(value))


def measured(value: float) -> bool:
    """A perplexity that is a number: MLflow's SQL store keeps inf as the largest float64, 1.8e308."""
    return bool(np.isfinite(value)) and abs(value) < sys.float_info.max


def _text(value: object) -> str:
    return str(value) if present(value) else ""


def read_runs(uri: str | ArchiveSource, experiment: str) -> pd.DataFrame:
    """Every run of the experiment (mlflow.search_runs), of the store at `uri` or of an archive; a missing store or
    experiment is an error, never created."""
    if isinstance(uri, ArchiveSource):
        runs = uri.frame(experiment)
        if runs.empty:
            raise NplmError(f"no runs to report: the archive has no runs of experiment {experiment!r}")
        return runs
    path = sqlite_file(uri)
    if path is not None and not path.is_file():
        raise NplmError(f"no tracking store at {path}: run nplm-train first, or pass --tracking-uri")
    check_store(uri, create=False)
    try:
        with tracking_at(uri):
            found = mlflow.get_experiment_by_name(experiment)
            names = sorted(e.name for e in mlflow.search_experiments()) if found is None else []
            runs = mlflow.search_runs([found.experiment_id]) if found is not None else pd.DataFrame()
    except Exception as error:  # MLflow raises many types for a bad store; all mean the same to the user
        raise NplmError(f"tracking store {redact(uri)!r} is unusable") from error
    if found is None:
        has = f"it has only {', '.join(names)}" if names else "it has none"
        raise NplmError(f"no runs to report: the store has no experiment {experiment!r} ({has})")
    if runs.empty:
        raise NplmError(f"no runs to report: experiment {experiment!r} is empty")
    return runs


def _config(run: pd.Series, family: str, kind: str) -> dict[str, str]:
    groups = OTHER_GROUPS if kind == "counted" else TRAINED_GROUPS
    config = {
        key: str(value)
        for name, value in run.items()
        if name.startswith("params.")
        and present(value)
        and (key := name.removeprefix("params.")).startswith(groups)
        and not is_bookkeeping(key, value)  # tracking's: where and how a job ran
    }
    if family in FAMILY_IDS:  # the family, not where its class lived when the run was made
        config["model._target_"] = FAMILY_IDS[family]
    # the model's keys a run did not use (a class layer's count when it has none) do not tell it apart
    model = {k.removeprefix("model."): v for k, v in config.items() if k.startswith("model.")}
    used = {f"model.{k}": v for k, v in without_unused({"model": model})["model"].items()}
    config = {k: v for k, v in config.items() if not k.startswith("model.")} | used
    implied = IMPLIED if kind == "trained" else {}  # an exact run's output layer, which its key leaves out
    return dict(sorted((DEFAULTS_BEFORE.get(family, {}) | implied | config).items()))


def tidy(raw: pd.DataFrame) -> pd.DataFrame:
    """One row per nplm-repro run: state, data, the paper's columns, seed, configuration and perplexities.

    Runs without a data fingerprint are not nplm-repro runs; sweep parents (no perplexities) are left out.
    """
    parents = set(raw.get("tags.mlflow.parentRunId", pd.Series(dtype=object)).dropna())
    records = []
    for _, run in upgrade_runs(raw).iterrows():
        get = run.get
        valid = get("metrics.valid_ppl")
        if not present(get("tags.data_fingerprint")) or (
            not present(valid) and (run["run_id"] in parents or present(get("tags.sweep")))
        ):
            continue
        family, kind = get("tags.family"), get("tags.family_kind")
        config = _config(run, family, kind)
        status = run["status"]
        perplexities = {f"{split}_ppl": get(f"metrics.{split}_ppl", np.nan) for split in SPLITS}
        if any(present(v) and not measured(v) for v in perplexities.values()):
            status = DIVERGED_STATUS
            perplexities = {k: v if measured(v) else np.nan for k, v in perplexities.items()}
        state = "running" if status in ("RUNNING", "SCHEDULED") else "failed"
        if status == "FINISHED" and present(valid):
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
                "code": _text(get("tags.code_fingerprint")) or _text(get("tags.git_commit")),  # commit and changes
                "note": _text(get("tags.note")),
                "row_tag": ROW_NAMES.get(_text(get("tags.row")), _text(get("tags.row"))),
                "study_tag": _text(get("tags.study")),
                "base_run_id": _text(get("tags.base_run_id")),
                "mixes": _text(get("tags.base_run_id")) if kind == "mixed" else "",  # its runs (as_mixed_mlps keeps)
                "adopted_from": _text(get("tags.adopted_from")),
                "family": family,
                "kind": kind,
                "family_label": _text(get("tags.family_label")) or FAMILY_NAMES.get(family, family),  # or the paper's
                "colour": get("tags.family_colour"),
                "n": config.get("model.n", ""),
                "c": config.get("model.c", ""),
                "h": config.get("model.h", ""),
                "m": config.get("model.m", ""),
                "direct": {"True": "yes", "False": "no"}.get(config.get("model.direct", ""), ""),
                "mix": MIX.get(config.get("model.mix", ""), config.get("model.mix", "")),
                "seed": _text(get("params.seed")),
                "config": json.dumps(config),
                "mix_lambda": pd.to_numeric(get("params.mix.lambda", np.nan), errors="coerce"),  # learned: one weight
                "epochs": get("metrics.epochs", np.nan),
                "trial": _text(get("params.callbacks.pruning.trial")),  # a search's trial (sweeping/search.py)
                "proposed_by": _text(get("tags.search_proposed_by")),  # its values: `random` or the sampler's
                "search_space": _text(get("tags.search_space")),  # its distributions, JSON (search.py `described`)
                "stopped_by": stopped_by(run, config),  # what ended its fit
                "minutes": (run["end_time"] - run["start_time"]).total_seconds() / 60
                if status == "FINISHED"
                else np.nan,
                "fit_minutes": get("metrics.fit_seconds", np.nan) / 60,  # a trained run's, without the time it was down
                **environment(run),
                **perplexities,
            }
        )
    frame = as_mixed_mlps(pd.DataFrame.from_records(records), raw)
    adopted = frame["adopted_from"] != "" if len(frame) else pd.Series(dtype=bool)
    if adopted.any():  # an adopted run took no time of its own: the wall time of the run that trained it
        source = dict(zip(frame["run_id"], frame["adopted_from"]))
        minutes = dict(zip(frame["run_id"], frame["minutes"]))

        def trained_by(run_id: str) -> str:
            seen = set()
            while source.get(run_id) and run_id not in seen:  # a run adopted from a run that was itself adopted
                seen.add(run_id)
                run_id = source[run_id]
            return run_id

        frame.loc[adopted, "minutes"] = [minutes.get(trained_by(r), np.nan) for r in frame.loc[adopted, "run_id"]]
    return frame


def as_mixed_mlps(frame: pd.DataFrame, raw: pd.DataFrame) -> pd.DataFrame:
    """A mixed row of one MLP's run and Del. Int.'s (the paper's MLP2 ... MLP10, `model=mixture`) as the paper's
    tables show it, and as such a row was stored when it was an MLP's `model.mix`: an MLP row with the MLP's
    columns and configuration, its mix the mixture's mode, `base_run_id` its MLP's run, `mix_lambda` the MLP's
    weight (of one weight for all tokens: none per context bin). Any family's row of kind mixed may be one: it is
    told by the runs it mixes (its tag base_run_id), never by its family's name."""
    if frame.empty:
        return frame
    runs = frame.set_index("run_id", drop=False)
    params = raw.set_index("run_id")
    shown = ["family", "family_label", "colour", "n", "c", "h", "m", "direct"]
    trigram_row, known = FAMILY_NAMES[PAPER_TRIGRAM], set(frame["run_id"])
    for i in frame.index[frame["kind"] == "mixed"]:
        ids = frame.at[i, "base_run_id"].split(",")
        if len(ids) != 2 or not known.issuperset(ids):
            continue
        mlp, trigram = runs.loc[ids[0]], runs.loc[ids[1]]
        if (mlp["family"], trigram["family"], trigram["row_tag"]) != (PAPER_MODEL, PAPER_TRIGRAM, trigram_row):
            continue
        mode = _text(params.at[frame.at[i, "run_id"], "params.model.mode"])
        weights = (
            params.loc[frame.at[i, "run_id"]]
            .filter(like="params.mix.lambda.")
            .drop(f"params.mix.lambda.{trigram_row}", errors="ignore")
        )
        lambda_ = pd.to_numeric(weights.dropna().iloc[0], errors="coerce") if weights.notna().any() else np.nan
        frame.loc[i, shown] = mlp[shown].to_numpy()
        frame.at[i, "mix"] = MIX.get(mode, mode)
        frame.at[i, "config"] = json.dumps(dict(sorted((json.loads(mlp["config"]) | {"model.mix": mode}).items())))
        frame.at[i, "base_run_id"] = mlp["run_id"]
        frame.at[i, "mix_lambda"] = np.nan if mode == "context" else lambda_
    return frame


LIBRARIES = ("torch", "lightning", "mlflow", "hydra-core", "numpy")  # as tracking/records.py tags them


def environment(run: pd.Series) -> dict[str, str]:
    """Where and with what the run computed (tags of tracking/records.py; '' for runs from before them)."""
    model, flags = _text(run.get("tags.cpu_model")), _text(run.get("tags.cpu_flags"))
    versions = [
        f"{name} {run.get(f'tags.version.{name}')}" for name in LIBRARIES if present(run.get(f"tags.version.{name}"))
    ]
    if present(run.get("tags.python")):
        versions.append(f"Python {run.get('tags.python')}")
    return {
        "cpu": f"{model} [{flags}]" if model else "",
        "cpu_model": model,
        "torch": _text(run.get("tags.version.torch")),
        "threads": pd.to_numeric(run.get("tags.torch_threads", np.nan), errors="coerce"),
        "versions": ", ".join(versions),
    }


def assign_studies(runs: pd.DataFrame) -> pd.DataFrame:
    """Each run's study and, for runs in a paper's table, the index of their row there."""
    runs = runs.copy()
    runs["paper_row"] = -1
    runs["study"] = runs["study_tag"]
    for study, corpus in PAPER_TABLES.items():
        paper = paper_table(study)
        rows = {(r["row"], *row_key(r["family"], r)): i for i, r in paper.iterrows()}
        match = pd.Series(
            [rows.get((r["row_tag"], *row_key(r["family"], r)), -1) for _, r in runs.iterrows()], index=runs.index
        )
        ours = (match >= 0) & ((runs["corpus"] == corpus) | (runs["study_tag"] == study))  # e.g. ap_table2 on WSJ
        runs.loc[ours, "paper_row"] = match[ours]
        runs.loc[ours & (runs["study"] == ""), "study"] = study
    runs.loc[runs["study"] == "", "study"] = "adhoc"
    return runs


def choose_fingerprint(study: str, runs: pd.DataFrame, fingerprint: str | None) -> str:
    """The data to report: the one named, else that of the newest run (runs of two data are never mixed)."""
    seen = runs.groupby("fingerprint")["start_time"].agg(["max", "size"]).sort_values("max", ascending=False)
    if fingerprint is None:
        return str(seen.index[0])
    if fingerprint not in seen.index:
        known = ", ".join(f"{f} ({n} runs)" for f, n in seen["size"].items())
        raise NplmError(f"--fingerprint {fingerprint}: no run of study {study!r} has it (it has: {known})")
    return fingerprint


def newest_finished(runs: pd.DataFrame) -> pd.DataFrame:
    """Per seed, the newest FINISHED run: what a configuration's numbers are averaged over."""
    return runs[runs["state"] == "finished"].sort_values(["start_time", "run_id"]).groupby("seed").last()


def _stopped(runs: pd.DataFrame) -> str:
    """How a configuration with no finished or running run stands: 'killed' when its newest run was (Ctrl-C, SIGTERM:
    the same command resumes it), else 'failed'."""
    newest = runs.sort_values(["start_time", "run_id"]).iloc[-1]
    return "killed" if newest["status"] == "KILLED" else "failed"


def summarise(runs: pd.DataFrame) -> dict[str, object]:
    """One configuration: per seed its newest FINISHED run; mean and std over seeds; what is running or failed."""
    finished = newest_finished(runs)
    running_seeds = set(runs.loc[runs["state"] == "running", "seed"]) - set(finished.index)
    summary: dict[str, object] = {
        "seeds": len(finished),
        "running": len(running_seeds),
        "failed": int((runs["state"] == "failed").sum()),
        "status": "finished" if len(finished) else "running" if running_seeds else _stopped(runs),
        "run_ids": " ".join(finished["run_id"]),
        "dirty_runs": int(dirty(finished).sum()) if len(finished) else 0,  # of the runs averaged
        "config_id": hashlib.sha256(runs["config"].iloc[0].encode()).hexdigest()[:8],
        "notes": "; ".join(sorted(set(runs["note"]) - {""})),
    }
    for split in SPLITS:
        values = finished[f"{split}_ppl"].dropna()
        summary[f"{split}_ppl"] = values.mean() if len(values) else np.nan
        summary[f"{split}_ppl_std"] = values.std(ddof=1) if len(values) > 1 else np.nan
        summary[f"{split}_ppl_min"] = values.min() if len(values) else np.nan
        summary[f"{split}_ppl_max"] = values.max() if len(values) else np.nan
        summary[f"{split}_ppl_by_seed"] = tuple(values)  # what the figures draw beside the mean
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
                "kind": first["kind"],
                "family_label": first["family_label"],
                "colour": first["colour"],
                "row_tag": next((t for t in group["row_tag"] if t), ""),
                **{c: first[c] for c in COLUMNS},
                "paper_row": first["paper_row"],
                "newest": group["start_time"].max(),
                **summarise(group),
            }
        )
    return pd.DataFrame.from_records(rows)


@dataclass(frozen=True)
class StudyRuns:
    """A study's runs as the report counts them: those on the data reported, those on other data, and every run of
    the experiment (the report's notes look beyond the study)."""

    every: pd.DataFrame  # every nplm-repro run of the experiment, with its study (`assign_studies`)
    runs: pd.DataFrame  # the study's, on `fingerprint`
    other: pd.DataFrame  # the study's, on other data
    fingerprint: str
    left_out: int  # the study's runs from dirty work trees, left out by `require_clean`


def study_runs(
    uri: str | ArchiveSource, experiment: str, study: str, fingerprint: str | None = None, require_clean: bool = False
) -> StudyRuns:
    """The runs of `study` on one data fingerprint (the newest run's, unless named); NplmError when it has none, or
    none finished. `require_clean` leaves out the runs made from a work tree with uncommitted changes (their code is
    unknown or only in their git_diff.patch), before anything is chosen."""
    raw = read_runs(uri, experiment)
    every = tidy(raw)
    if every.empty:
        raise NplmError(
            f"experiment {experiment!r} holds no nplm-repro runs (none of its {len(raw)} runs has a data_fingerprint tag)"
        )
    every = assign_studies(every)
    left_out = 0
    if require_clean:
        unclean = dirty(every)
        left_out = int((unclean & (every["study"] == study)).sum())
        every = every[~unclean]
    clean = f"; --require-clean left out {left_out} runs from dirty work trees" if left_out else ""
    runs = every[every["study"] == study]
    if runs.empty:
        studies = ", ".join(sorted(every["study"].unique()))
        raise NplmError(f"no runs of study {study!r} in experiment {experiment!r} (its studies: {studies}{clean})")
    fingerprint = choose_fingerprint(study, runs, fingerprint)
    other = runs[runs["fingerprint"] != fingerprint]
    runs = runs[runs["fingerprint"] == fingerprint]
    if not (runs["state"] == "finished").any():
        states = ", ".join(f"{n} {s}" for s, n in runs["status"].value_counts().sort_index().items())
        raise NplmError(f"no finished runs of study {study!r} in experiment {experiment!r} ({states}{clean})")
    return StudyRuns(every, runs, other, fingerprint, left_out)
