"""What a sweep refuses before it starts, and how it fails when its report cannot be written at its end: one line,
the exit code of the cause, and a store that says the same (no parent run at all, or one FAILED with the tag
`error`). Real commands on tests/data/tiny_brown.zip, real MLflow stores."""

import re
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from helpers import data_slice, run_script

TINY = data_slice(5_000, 1_000, 1_000)  # of tiny_brown.zip's 10,973 tokens


def sweep(tmp_path: Path, tiny_brown_path: Path, *overrides: str) -> tuple[int, str, str]:
    """`nplm-train -m` one job after the other into tmp_path's store; its exit code, last line on stderr, stderr."""
    common = ["hydra/launcher=basic", f"data.path={tiny_brown_path}", *TINY, f"tracking.uri=sqlite:///{tmp_path}/m.db"]
    result = run_script("nplm-train", "-m", *overrides, *common, cwd=tmp_path)
    return result.returncode, (result.stderr.strip().splitlines() or [""])[-1], result.stderr


def runs_of(tmp_path: Path) -> pd.DataFrame:
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    return mlflow.search_runs(experiment_names=["brown"])


@pytest.mark.parametrize(  # each starts a sweep (about 6 s): one in the default suite, the others slow
    "report", ["a_file", *(pytest.param(r, marks=pytest.mark.slow) for r in ("a_file/reports", "/proc/forbidden"))]
)
def test_a_report_directory_that_cannot_be_written_stops_the_sweep_before_anything_is_written(
    report: str, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """It exited 0 once every job had run, with only Hydra's warning that the callback raised FileExistsError or
    FileNotFoundError, and a FINISHED parent run without report or headline numbers."""
    if report.startswith("/proc") and not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    (tmp_path / "a_file").write_text("not a directory\n")
    code, line, _ = sweep(tmp_path, tiny_brown_path, "study=brown_table1", "experiment=kn3", f"report={report}")
    if report.startswith("/proc"):
        assert code == 2 and re.fullmatch(
            rf"nplm-train: error: report={report}: cannot create a directory in /proc \(.+\)", line
        ), line
    else:
        assert (code, line) == (2, f"nplm-train: error: report={report}: {tmp_path}/a_file is a file, not a directory")
    assert not (tmp_path / "m.db").exists()  # no store, no parent run


@pytest.mark.slow  # a sweep (about 6 s); the test above keeps one in the default suite
def test_a_key_that_some_jobs_refuse_stops_the_sweep_naming_them(tiny_brown_path: Path, tmp_path: Path) -> None:
    """An n-gram has no h: it exited 2 with Hydra's words alone, and left a FAILED parent run with no children."""
    code, line, _ = sweep(tmp_path, tiny_brown_path, "experiment=kn3,del_int,mlp9", "model.h=16")
    said = (
        "Could not override 'model.h': Key 'h' is not in struct, in 2 of 3 jobs: experiment=kn3, experiment=del_int "
        "(nothing was run)"
    )
    assert (code, line) == (2, f"nplm-train: error: {said}")
    assert not (tmp_path / "m.db").exists()


@pytest.mark.slow  # two sweeps (about 7 s each)
def test_a_value_or_a_corpus_that_a_job_would_refuse_stops_the_sweep_before_anything_is_written(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    """Each job checks its values and its corpus before any work; a sweep now checks them for every job before the
    store or the parent run exists. It created both, then every job failed with the same line."""
    code, line, _ = sweep(tmp_path, tiny_brown_path, "experiment=mlp9", "model.h=0,8", "model.direct=false")
    said = "model.h=0 needs model.direct=true (without hidden units, W is the only path to the output)"
    assert (code, line) == (2, f"nplm-train: error: {said}, in 1 of 2 jobs: model.h=0 (nothing was run)")
    missing = tmp_path / "nowhere" / "brown.zip"
    store = f"tracking.uri=sqlite:///{tmp_path}/m.db"
    result = run_script("nplm-train", "-m", "experiment=kn3", f"data.path={missing}", "seed=1,2", store, cwd=tmp_path)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last.startswith(
        f"nplm-train: error: Brown corpus not found (looked in: {missing}"
    )
    assert last.endswith(", in all 2 jobs (nothing was run)"), last
    assert not (tmp_path / "m.db").exists()  # no store, no parent run


@pytest.mark.slow  # about 8-16 s: outside the default suite's 5 minutes
def test_a_sweep_whose_report_cannot_be_written_at_its_end_fails(tiny_brown_path: Path, tmp_path: Path) -> None:
    """The report's directory passes the check when the sweep starts, and is a file when it ends: the job's own
    log file, train.log, written there meanwhile. The command fails with one line naming the cause, the parent
    run is FAILED with that line as its tag `error`. The same sweep once the way is clear resumes that parent,
    which ends FINISHED, with the report and without the tag."""
    report = tmp_path / "sweep" / "0" / "train.log"  # job 0's log, once job 0 has run
    job = ["study=brown_table1", "experiment=kn3", f"report={report}"]
    code, line, stderr = sweep(tmp_path, tiny_brown_path, *job, f"hydra.sweep.dir={tmp_path}/sweep")
    said = (
        f"report={report}: the study's report was not written: FileExistsError: [Errno 17] File exists: '{report}' "
        "(its runs are recorded: nplm-report --study brown_table1 writes it)"
    )
    assert (code, line) == (1, f"nplm-train: error: ReportNotWritten: {said} (HYDRA_FULL_ERROR=1 shows the traceback)")
    assert "MlflowSweep" not in stderr  # not Hydra's warning of a callback's error
    runs = runs_of(tmp_path)
    parent = runs[runs["tags.sweep"] == "true"].iloc[0]
    assert parent["status"] == "FAILED" and parent["tags.error"] == said
    assert list(runs.loc[runs["tags.sweep"] != "true", "status"]) == ["FINISHED"]

    report.unlink()  # the same command, its jobs' logs elsewhere (hydra.* is not part of the sweep's identity)
    code, line, stderr = sweep(tmp_path, tiny_brown_path, *job, f"hydra.sweep.dir={tmp_path}/sweep2")
    assert code == 0, stderr[-3000:]
    runs = runs_of(tmp_path)
    again = runs[runs["tags.sweep"] == "true"].iloc[0]
    assert again["run_id"] == parent["run_id"] and again["status"] == "FINISHED" and pd.isna(again.get("tags.error"))
    assert (report / "brown_table1.md").is_file()
