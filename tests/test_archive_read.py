"""What `Archive.read` refuses, each in one line naming the file and the line, read from the quickstart's committed
archive with one thing broken; and what an archive's values read as."""

import json
import math
from pathlib import Path

import pytest
from helpers import ROOT

from nplm_repro.errors import NplmError
from nplm_repro.storage.archive import SUFFIX, Archive, dumps, metric_value

SHIPPED = ROOT / "reports" / f"quickstart{SUFFIX}"


def lines() -> list[str]:
    return SHIPPED.read_text().splitlines()


def refused(path: Path, text: str | None) -> str:
    if text is not None:
        path.write_text(text)
    with pytest.raises(NplmError) as error:
        Archive.read(path)
    return str(error.value)


def test_a_broken_archive_is_refused_naming_its_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / f"bad{SUFFIX}"
    header, first, *rest = lines()
    assert refused(tmp_path, None).startswith(f"{tmp_path}: not a readable archive of runs (IsADirectoryError")
    assert refused(bad, "") == f"{bad}:1: empty: an archive of runs starts with its header line"
    other = dumps(json.loads(header) | {"version": 99})
    assert refused(bad, other) == f"{bad}:1: not an archive of runs (format 'nplm-repro runs', version 1 expected)"
    assert refused(bad, "\n".join([header, first, first])) == (
        f"{bad}:3: run {json.loads(first)['run_id']} is archived twice"
    )
    running = dumps(json.loads(first) | {"status": "RUNNING", "tags": {}})
    assert refused(bad, "\n".join([header, running])).endswith("status 'RUNNING' is not one an archived run ends in")
    assert refused(bad, "\n".join([header, "[1, 2]"])) == f"{bad}:2: not a JSON object"
    assert len(Archive.read(SHIPPED).runs) == len(rest) + 1


def test_an_archive_of_another_experiment_has_no_runs_of_this_one() -> None:
    archive = Archive.read(SHIPPED)
    assert archive.frame("no such experiment").empty and len(archive.frame(archive.experiment)) == len(archive.runs)


def test_metrics_are_numbers_or_the_words_json_has_for_what_it_has_no_number_for() -> None:
    assert math.isnan(metric_value("nan")) and metric_value("-inf") == -math.inf and metric_value(3) == 3.0
    for value in ("NaN", True, None, "3"):
        with pytest.raises(ValueError, match="is not a number"):
            metric_value(value)
