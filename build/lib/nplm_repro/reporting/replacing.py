"""Where a sweep's report of a study goes when a report of that study is already there (`place`).

A sweep writes its study's report into `report` (reports/, committed) when it ends, whatever its store: one tiny job
of brown_modern on the tiny corpus into a scratch store (`nplm-train experiment=kn3 study=brown_modern
data.path=tests/data/tiny_brown.zip tracking.uri=sqlite:///scratch.db`) rewrote the committed 45-run report as a
one-row report of the tiny corpus, for the next commit to publish. A report there is therefore replaced only by one
of the same corpus (its data fingerprint) built from a store that holds every run it was made of (its csv's
run_ids); any other goes to a folder of its own beside it, `<report>/<study>-<fingerprint>/`, and one line says so.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pandas as pd

from nplm_repro.reporting.tables import Report

log = logging.getLogger(__name__)

FINGERPRINT = re.compile(r"fingerprint `([0-9a-f]+)`")  # the markdown report's data line (render.py `markdown`)


def former(out: Path, study: str) -> tuple[str | None, set[str]] | None:
    """The data fingerprint and run ids of the report of `study` in `out`, or None when there is none; a fingerprint
    None when its page says none."""
    page, table = out / f"{study}.md", out / f"{study}.csv"
    if not page.is_file() or not table.is_file():
        return None
    found = FINGERPRINT.search(page.read_text(encoding="utf-8", errors="replace"))
    try:
        ids = pd.read_csv(table, usecols=["run_ids"])["run_ids"].dropna()
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        ids = pd.Series([], dtype=str)
    return (found[1] if found else None), {i for text in ids for i in str(text).split()}


def place(report: Report, out: Path) -> Path:
    """`out`, where `report` may replace the report of its study there (none there, or one of the same fingerprint
    whose runs `report` has all of); else `out/<study>-<fingerprint>`, said in one line."""
    before = former(out, report.study)
    if before is None:
        return out
    fingerprint, ids = before
    mine = {i for text in report.table.get("run_ids", pd.Series([], dtype=str)).dropna() for i in str(text).split()}
    if fingerprint == report.fingerprint and ids <= mine:
        return out
    elsewhere = out / f"{report.study}-{report.fingerprint}"
    why = (
        f"of another corpus (fingerprint {fingerprint})"
        if fingerprint != report.fingerprint
        else f"from {len(ids - mine)} runs this store does not hold"
    )
    log.warning(
        "report: %s is made %s: it is kept, and this report is written to %s/",
        out / f"{report.study}.md",
        why,
        elsewhere,
    )
    return elsewhere
