"""A study's archive made from a store (`study_archive`), kept up to date as each of its runs ends (`keep_run`), and
where it goes (`archive_dir`): beside the study's report, unless what is there was made of runs this store does not
hold (storage/archive.py gives the format; docs/archive.md).

What it holds: every run of the study, the runs of other studies that its report reads (`archived_runs`), and the
sweeps' parent runs they nest under.

Where it goes: a report in `out` (committed in reports/) is replaced only by one of the same data made of a store
that holds every run it was made of (its archive's runs, else the run ids of its table); any other goes to a folder
of its own, `out/<study>-<fingerprint>/`, so that a scratch store never rewrites a committed report.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pandas as pd

from nplm_repro.errors import NplmError
from nplm_repro.paper import paper_table
from nplm_repro.storage.archive import Archive, export, path_of
from nplm_repro.storage.importing import held_runs
from nplm_repro.storage.locks import archive_lock
from nplm_repro.tracking.runs import StudyRuns, study_runs

log = logging.getLogger(__name__)

NOTES_READING_MIXTURES = "other_mixtures"  # notes.py: the paper's mixed rows beside the learned weightings
FINGERPRINT = re.compile(r"fingerprint `([0-9a-f]+)`")  # the markdown report's data line (render.py `markdown`)


def archived_runs(found: StudyRuns, spec: dict[str, Any]) -> pd.Series:
    """The ids of the runs the report of `found` (a study's runs) reads: the study's own on its data (any state) and
    on other data (the report counts them), and what its declaration reads beyond them: a recipe's `against` rows,
    the learned and per-context mixtures beside the fixed ones (`other_mixtures`), the counted rows of the corpus on
    other data (`data_effect`), for a paper table's study the runs of other studies named after its rows
    (`excluded`), and the runs its mixed rows mix (`mixes`: brown_mixtures mixes brown_table1's MLPs and Del. Int., and
    its report shows each mixture as its MLP mixed)."""
    every, fingerprint, notes = found.every, found.fingerprint, spec.get("notes") or []
    same_data = every[every["fingerprint"] == fingerprint]
    parts = [found.runs, found.other]
    if "recipe" in spec:
        parts.append(same_data[same_data["study"] == spec["recipe"]["against"]])
    if NOTES_READING_MIXTURES in notes:
        parts.append(same_data[same_data["mix"].isin(["learned", "context"])])
    if "data_effect" in notes:
        corpus = found.runs["corpus"].iloc[0]
        parts.append(every[(every["corpus"] == corpus) & (every["fingerprint"] != fingerprint)])
    if spec.get("paper"):
        named = set(paper_table(spec["paper"])["row"])
        parts.append(same_data[same_data["row_tag"].isin(named)])
    chosen = pd.concat(parts).drop_duplicates("run_id")
    mixes = {run_id for ids in chosen["mixes"] for run_id in ids.split(",") if run_id}
    return pd.concat([chosen, every[every["run_id"].isin(mixes)]]).drop_duplicates("run_id")["run_id"]


def study_archive(
    uri: str, experiment: str, study: str, spec: dict[str, Any], fingerprint: str | None = None
) -> Archive:
    """The archive of `study`'s report from the store at `uri` (its data: the newest run's unless named)."""
    found = study_runs(uri, experiment, study, fingerprint)
    archive = Archive(study, experiment, found.fingerprint)
    archive.add(export(uri, archived_runs(found, spec), archive.texts))
    return archive


def former(out: Path, study: str) -> tuple[str | None, set[str]] | None:
    """The data fingerprint and run ids of what is in `out` for `study`: its archive's, else its report's (the data
    line of its page, the run ids of its table); None when neither is there."""
    archived = path_of(out, study)
    if archived.is_file():
        try:
            header = json.loads(archived.read_text(encoding="utf-8").partition("\n")[0])
            ids = {json.loads(line)["run_id"] for line in archived.read_text(encoding="utf-8").splitlines()[1:]}
            return header.get("fingerprint"), ids
        except (ValueError, KeyError, TypeError, AttributeError):
            return None, set()
    page, table = out / f"{study}.md", out / f"{study}.csv"
    if not page.is_file() or not table.is_file():
        return None
    found = FINGERPRINT.search(page.read_text(encoding="utf-8", errors="replace"))
    try:
        ids = pd.read_csv(table, usecols=["run_ids"])["run_ids"].dropna()
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        ids = pd.Series([], dtype=str)
    return (found[1] if found else None), {i for text in ids for i in str(text).split()}


def archive_dir(out: Path, study: str, fingerprint: str, held: set[str]) -> Path:
    """`out`, where the study's report and archive go when what is there is of runs `held` on this data, or there
    is nothing; else `out/<study>-<fingerprint>`, said in one line."""
    before = former(out, study)
    if before is None or (before[0] == fingerprint and before[1] <= held):
        return out
    elsewhere = out / f"{study}-{fingerprint}"
    why = (
        f"of another corpus (fingerprint {before[0]})"
        if before[0] != fingerprint
        else f"from {len(before[1] - held)} runs this store does not hold"
    )
    log.warning("report: %s is made %s: it is kept, and this one is written to %s/", out / f"{study}.md", why, elsewhere)
    return elsewhere


def keep_run(uri: str, experiment: str, study: str, fingerprint: str, out: Path, run_id: str) -> Path | None:
    """Add one ended run of `study` (and its sweep's parent) to the study's archive in its place under `out`, as soon
    as it ends: a study whose machine is lost keeps every run that finished. Concurrent jobs take turns (a lock).
    Returns the archive's path; None, with a warning, if it could not be written (the run itself is recorded)."""
    try:
        with archive_lock(study, fingerprint):
            place = archive_dir(out, study, fingerprint, held_runs(uri, experiment))
            path = path_of(place, study)
            archive = Archive.read(path) if path.is_file() else Archive(study, experiment, fingerprint)
            return add_runs(uri, archive, path, [run_id])
    except (NplmError, OSError) as error:
        log.warning("run %s is recorded, but not added to the archive of study %s: %s", run_id, study, error)
        return None


def add_runs(uri: str, archive: Archive, path: Path, run_ids: list[str]) -> Path:
    """`archive` with these runs of the store (as they are now) written to `path`."""
    archive.add(export(uri, run_ids, archive.texts))
    return archive.write(path)
