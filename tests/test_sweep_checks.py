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


# A study of one's own (docs/studies.md), outside sweeps/: DIR/study/mine.yaml, run with hydra.searchpath=[file://DIR]
MINE = """\
# @package _global_
study: mine
report: reports
reporting:
{reporting}
hydra:
  mode: MULTIRUN
  sweeper:
    params:
      experiment: kn3,del_int
"""


def own_study(tmp_path: Path, text: str) -> Path:
    """`text` as the study file DIR/study/mine.yaml; its path (DIR is its folder's parent)."""
    path = tmp_path / "studies" / "study" / "mine.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def refusals(tmp_path: Path, tiny_brown_path: Path, path: Path) -> tuple[str, str]:
    """What `nplm-train -m study=mine` and `nplm-report --study FILE` say of the study file at `path`: each the one
    line of a refusal (exit 2), without its `prog: error: `; neither leaves a store or a report behind."""
    said = []
    for prog, args in (
        ("nplm-train", ["-m", f"hydra.searchpath=[file://{path.parent.parent}]", "study=mine", *TINY]),
        ("nplm-report", ["--study", str(path), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]),
    ):
        store = [f"data.path={tiny_brown_path}", f"tracking.uri=sqlite:///{tmp_path}/m.db"]
        result = run_script(prog, *args, *(store if prog == "nplm-train" else []), cwd=tmp_path, timeout=120)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
        assert lines[0].startswith(f"{prog}: error: ")
        said.append(lines[0].removeprefix(f"{prog}: error: "))
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "reports").exists()
    return said[0], said[1]


@pytest.mark.parametrize(
    "text,line,problem",
    [  # PyYAML's words; the line of the problem, as an editor counts them
        (MINE.format(reporting="  claims: [\n  - claim: x"), 6, "expected the node content, but found '-'"),
        ("# @package _global_\nstudy: mine\nstudy: mine\n", 3, "found duplicate key study"),
    ],
    ids=["malformed", "duplicate_key"],
)
@pytest.mark.slow  # commands in subprocesses: about 7-10 s
def test_a_study_file_that_is_not_yaml_is_one_line_naming_the_file_and_the_line(
    text: str, line: int, problem: str, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """nplm-train exited 1 with `ParserError: while parsing a flow node` (or `ConstructorError: while constructing a
    mapping`), naming neither the file nor the line; nplm-report named the file only, and read a key given twice as
    its last value."""
    path = own_study(tmp_path, text)
    train, report = refusals(tmp_path, tiny_brown_path, path)
    assert train == report
    assert train.startswith(f"{path}, line {line}: not valid YAML: {problem}"), train


@pytest.mark.parametrize(
    "reporting,said",
    [
        ("  colour: red", "`reporting` has unknown keys colour (known: "),
        (
            "  claims:\n  - claim: Kneser-Ney beats Del. Int.\n    bigger: [[Del. Int., Kneser-Ney back-off n=3]]",
            (
                "claim 'Kneser-Ney beats Del. Int.' has an unknown kind bigger (kinds: better, equivalent, more, "
                "faster; beside them: claim, by, margin, varies)"
            ),
        ),
        (
            "  claims:\n  - claim: MLP5 beats Del. Int.\n    better: [[Del. Int., MLP5]]",
            (
                "claim 'MLP5 beats Del. Int.' is on row 'MLP5', which no job of the study gives (its rows: Del. Int., "
                "Kneser-Ney back-off)"
            ),
        ),
    ],
    ids=["unknown_key", "unknown_kind", "unknown_row"],
)
@pytest.mark.slow  # commands in subprocesses: about 7-10 s
def test_a_declaration_its_report_cannot_apply_is_refused_before_any_job(
    reporting: str, said: str, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """Each was found only by the report: an unknown key once every job had run (a warning, no report, exit 0), a
    mistyped kind of claim or a row no job gives as a claim "not measured" (exit 0), in the sweep's report and
    nplm-report's alike."""
    path = own_study(tmp_path, MINE.format(reporting=reporting))
    train, report = refusals(tmp_path, tiny_brown_path, path)
    assert train.startswith(f"study=mine: {said}"), train
    assert report.startswith(f"{path}: {said}"), report
