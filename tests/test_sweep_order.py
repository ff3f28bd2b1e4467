"""A sweep launches a mixed row's jobs after those of the rows it mixes, whatever order the command line gives them
(sweeping/sweep_order.py): under the basic launcher one job after the other, under the parallel launcher a batch
of the rows, then one of the mixtures. Real sweeps of tests/data/tiny_brown.zip into real stores."""

from pathlib import Path

import mlflow
import pytest
from helpers import data_slice, run_script

from nplm_repro.sweeping.sweep_order import levels

TINY = data_slice(5_000, 1_000, 1_000)

# A mixture of two counted rows, outside conf/ (hydra.searchpath): cheap, and written before its rows
MIXTURE = """# @package _global_
defaults:
  - override /model: mixture
row: KN + DI
model:
  components: [Kneser-Ney back-off, Del. Int.]
  mode: fixed
"""


def test_a_mixture_comes_after_every_row_it_mixes_and_jobs_keep_their_order_otherwise() -> None:
    rows = {"m": ("A + B", ("A", "B")), "a": ("A", ()), "b": ("B", ()), "c": ("C", ())}
    rows |= {"mm": ("A + B + C", ("A + B", "C")), "elsewhere": ("D + E", ("D", "E"))}  # D, E: not in this sweep
    jobs = [["x=mm"], ["x=m"], ["x=c"], ["x=a"], ["x=b"], ["x=elsewhere"]]

    def rows_of(job: list[str]) -> tuple[str, tuple[str, ...]]:
        return rows[job[0].removeprefix("x=")]

    assert levels(jobs, rows_of) == [[["x=c"], ["x=a"], ["x=b"], ["x=elsewhere"]], [["x=m"]], [["x=mm"]]]
    assert levels([["x=a"], ["x=c"]], rows_of) == [[["x=a"], ["x=c"]]]


@pytest.mark.parametrize("launcher", ["basic", pytest.param("parallel", marks=pytest.mark.slow)])  # 18 s, 45 s
def test_a_mixed_row_written_first_runs_after_its_rows(launcher: str, tiny_brown_path: Path, tmp_path: Path) -> None:
    """`-m experiment=lstm_trigram,del_int,lstm` ran the mixture first (basic launcher), or beside its rows (parallel
    launcher): it failed with "run that row first", the sweep exited 2 and its parent run was FAILED."""
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "kn_di.yaml").write_text(MIXTURE)
    common = [f"data.path={tiny_brown_path}", *TINY, f"tracking.uri=sqlite:///{tmp_path}/m.db"]
    sweep = ["-m", f"hydra.searchpath=[file://{tmp_path}/conf]", "experiment=kn_di,kn3,del_int"]
    result = run_script("nplm-train", *sweep, f"hydra/launcher={launcher}", *common, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    runs = mlflow.search_runs(experiment_names=["brown"])
    assert (runs["status"] == "FINISHED").all() and len(runs) == 4  # the parent and its three jobs
    jobs = runs[runs["tags.sweep"] != "true"].sort_values("start_time")
    assert list(jobs["tags.row"])[-1] == "KN + DI"
    mixture = jobs.iloc[-1]
    assert mixture["start_time"] >= jobs.iloc[:2]["end_time"].max()  # started once both rows had ended
