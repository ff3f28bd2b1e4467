"""A sweep's one progress line (nplm_repro/sweeping/console.py) and the job status it reads (nplm_repro/progress.py)."""

from pathlib import Path

import pytest

from nplm_repro.progress import STATUS_ENV, read_status, report_status
from nplm_repro.sweeping.console import duration, progress_line


def test_the_line_counts_jobs_names_the_running_ones_and_estimates_the_time_left() -> None:
    statuses = [
        {"row": "MLP9", "state": "training", "epoch": 3, "max_epochs": 5},  # 2 of 5 epochs done: 0.4 of a job
        {"row": "Del. Int.", "state": "done"},
        {"row": "MLP10", "state": "waiting"},
        {"row": "Kneser-Ney back-off", "state": "failed", "error": "boom"},
    ]
    line = progress_line("quickstart", 4, statuses, elapsed=120.0)
    # 2.4 of 4 jobs in 120 s: 1.6 more take 80 s
    assert line == "quickstart: 1/4 done, 2 running, 1 failed | MLP9 epoch 3/5, MLP10 waiting | ~1m20s left"


def test_the_line_says_nothing_of_the_time_left_before_any_progress_and_the_time_taken_at_the_end() -> None:
    assert (
        progress_line("s", 2, [{"row": "MLP1", "state": "running"}], 5.0) == "s: 0/2 done, 1 running, 0 failed | MLP1"
    )
    done = [{"row": r, "state": "done"} for r in ("MLP1", "MLP2")]
    assert progress_line("s", 2, done, 3725.0) == "s: 2/2 done, 0 running, 0 failed | 1h02m"


def test_jobs_that_found_their_run_made_tell_nothing_of_the_pace() -> None:
    """brown_sampled in a store that holds Table 1's sampled MLPs: five jobs adopt theirs in seconds, five train."""
    statuses = [{"row": f"MLP{i}", "state": "done", "seconds": 2.0} for i in (1, 3, 5, 7, 9)]
    statuses += [{"row": "MLP9", "state": "training", "epoch": 3, "max_epochs": 20}]
    # 2 of MLP9's 20 epochs in 600 s: 0.1 of the 5 jobs that train, so 4.9 more take 29,400 s
    line = progress_line("brown_sampled", 10, statuses, elapsed=600.0)
    assert line == "brown_sampled: 5/10 done, 1 running, 0 failed | MLP9 epoch 3/20 | ~8h10m left"
    assert "left" not in progress_line("s", 2, [{"row": "MLP1", "state": "done", "seconds": 1.0}], 5.0)  # no pace yet


def test_epochs_a_resumed_job_had_trained_before_this_launch_are_not_its_pace() -> None:
    """brown_extensions resumed: two jobs pick up at their epoch 11 of 20 and finish, two more start."""
    statuses = [{"row": r, "state": "done", "epochs_before": 10, "max_epochs": 20, "seconds": 600.0} for r in "AB"]
    statuses += [{"row": "C", "state": "training", "epochs_before": 0, "epoch": 1, "max_epochs": 20}]
    statuses += [{"row": "D", "state": "running", "epochs_before": 5, "max_epochs": 20}]  # before its first epoch
    # of 30 jobs, 1.25 were trained before (A, B: 10/20 each, D: 5/20); of the 28.75 left, 1 took 600 s: 27.75 more
    line = progress_line("brown_extensions", 30, statuses, elapsed=600.0)
    assert line == "brown_extensions: 2/30 done, 2 running, 0 failed | C epoch 1/20, D | ~4h37m left"


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (185, "3m05s"), (7200, "2h00m")])
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_a_job_status_is_merged_and_only_written_where_the_sweep_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "0.json"
    monkeypatch.delenv(STATUS_ENV, raising=False)
    report_status(state="training")  # a single run: no file anywhere
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(STATUS_ENV, str(path))
    report_status(row="MLP9", state="starting")
    report_status(state="training", epoch=1, max_epochs=3)
    assert read_status(path) == {"row": "MLP9", "state": "training", "epoch": 1, "max_epochs": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["0.json"]  # no partial file left behind
    assert read_status(tmp_path / "missing.json") == {}
