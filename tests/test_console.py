"""A sweep's one progress line (nplm_repro/sweeping/console.py) and the job status it reads (nplm_repro/progress.py)."""

from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from nplm_repro.progress import STATUS_ENV, read_status, report_status
from nplm_repro.sweeping.console import Plan, duration, job_key, plan, progress_line

MLP1, MLP3, KN3, MLP2 = "experiment=mlp1", "experiment=mlp3", "experiment=kn3", "experiment=mlp2"
# Table 1 in small: two MLPs (trained), a Kneser-Ney row (counted) and a mixture (mixed), three seeds each
ROWS = ((MLP1, "trained"), (MLP3, "trained"), (KN3, "counted"), (MLP2, "mixed"))
TABLE = Plan(tuple(row for row in ROWS for _ in range(3)), workers=2)
NOW = 10_000.0


def test_the_line_counts_jobs_names_the_running_ones_and_estimates_the_time_left() -> None:
    statuses = [
        {"row": "MLP1", "job": MLP1, "state": "training", "epoch": 3, "max_epochs": 5, "started": NOW - 120},
        {"row": "Kneser-Ney back-off", "job": KN3, "state": "done", "seconds": 40.0},
        {"row": "MLP2", "job": MLP2, "state": "waiting", "started": NOW - 10},
        {"row": "MLP3", "job": MLP3, "state": "failed", "error": "boom"},
    ]
    line = progress_line("table", TABLE, statuses, elapsed=120.0, now=NOW)
    # MLP1: 2 epochs in 120 s, 3 to go: 180 s; 2 more MLP1 and 2 MLP3 at its pace, 300 s each: 1,200 s; 2 more
    # Kneser-Ney rows, 40 s each: 80 s; three mixtures untimed. 1,460 s on 2 workers: 730 s
    assert line == "table: 1/12 done, 2 running, 1 failed | MLP1 epoch 3/5, MLP2 waiting | ~12m10s left, 3 untimed"


def test_the_first_mlps_minutes_are_not_taken_for_the_pace_of_the_rows_that_only_count() -> None:
    """Table 1 said ~4h44m left for a sweep of 50 minutes: its first MLP took 9 minutes, and the display took every
    job to come for one as long, though the 48 n-gram and mixed jobs after the 15 MLPs take seconds to a minute."""
    statuses = [{"row": "MLP1", "job": MLP1, "state": "done", "seconds": 540.0} for _ in range(3)]
    statuses += [{"row": "MLP3", "job": MLP3, "state": "done", "seconds": 300.0} for _ in range(3)]
    statuses += [{"row": "Kneser-Ney back-off", "job": KN3, "state": "done", "seconds": 60.0}]
    statuses += [{"row": "Kneser-Ney back-off", "job": KN3, "state": "done", "seconds": 2.0}]  # its run found made
    line = progress_line("table", TABLE, statuses, elapsed=2600.0, now=NOW)
    # one Kneser-Ney row to go, 60 s (not 2 s, nor an MLP's minutes, nor halved: one job runs on one worker),
    # beside three mixtures not yet timed
    assert line == "table: 8/12 done, 0 running, 0 failed | ~1m00s left, 3 untimed"
    mixed = statuses + [{"row": "MLP2", "job": MLP2, "state": "done", "seconds": 40.0}]
    assert progress_line("table", TABLE, mixed, elapsed=2600.0, now=NOW).endswith("| ~1m10s left")  # 140 s on 2


def test_a_training_job_is_expected_to_stop_where_the_done_jobs_of_its_row_stopped() -> None:
    """brown_precision's MLP9 stops early at epoch 15 or so of its 40-epoch ceiling: the display said ~10h left for a
    sweep of about three, counting every training job to its ceiling. MLP1's seed 1 stopped at 15 epochs; MLP3, not
    yet done, is expected to stop as its kind did; a job past that has its current epoch to go."""
    at = {"max_epochs": 40, "epochs_before": 0}
    statuses = [{"row": "MLP1", "job": MLP1, "state": "done", "epoch": 15, "seconds": 900.0, **at}]
    mlp3 = {"row": "MLP3", "job": MLP3, "state": "training", "epoch": 3, "started": NOW - 240, **at}  # 120 s an epoch
    mlp1 = {"row": "MLP1", "job": MLP1, "state": "training", "epoch": 6, "started": NOW - 300, **at}  # 60 s an epoch
    line = progress_line("t", TABLE, [*statuses, mlp1, mlp3], elapsed=1200.0, now=NOW)
    # MLP1: 10 epochs to go, 600 s, and one more at 900 s; MLP3: 13 epochs to go, 1,560 s, and two more at 15
    # epochs of its pace, 3,600 s; 6,660 s on 2 workers
    assert line == "t: 1/12 done, 2 running, 0 failed | MLP1 epoch 6/40, MLP3 epoch 3/40 | ~55m30s left, 6 untimed"
    past = mlp1 | {"epoch": 18, "started": NOW - 17 * 60}  # past where seed 1 stopped: its epoch to go, 60 s
    assert progress_line("t", TABLE, [*statuses, past, mlp3], 1200.0, NOW).endswith("| ~51m00s left, 6 untimed")


def test_the_line_says_nothing_of_the_time_left_before_any_job_is_timed_and_the_time_taken_at_the_end() -> None:
    running = [{"row": "MLP1", "job": MLP1, "state": "running", "started": NOW - 5}]
    assert progress_line("s", TABLE, running, 5.0, NOW) == "s: 0/12 done, 1 running, 0 failed | MLP1"
    quick = [{"row": "MLP1", "job": MLP1, "state": "done", "seconds": 1.0}]
    assert "left" not in progress_line("s", TABLE, quick, 5.0, NOW)  # a run found made tells nothing
    done = [{"row": "MLP1", "job": key, "state": "done"} for key, _ in TABLE.jobs]
    assert progress_line("s", TABLE, done, 3725.0, NOW) == "s: 12/12 done, 0 running, 0 failed | 1h02m"


def test_epochs_a_resumed_job_had_trained_before_this_launch_are_not_its_pace() -> None:
    """A study resumed: an MLP1 picked up at its epoch 11 of 20 and finished in 600 s, so a whole one takes
    1,200 s; another MLP1, resumed at its epoch 16, has a quarter of that to go; an MLP3 trains from its start."""
    resumed = {"row": "MLP1", "job": MLP1, "epochs_before": 10, "max_epochs": 20}
    statuses = [resumed | {"state": "done", "seconds": 600.0}]
    statuses += [resumed | {"state": "running", "epochs_before": 15, "started": NOW - 100}]  # before its 1st epoch
    statuses += [{"row": "MLP3", "job": MLP3, "state": "training", "epoch": 1, "max_epochs": 20, "started": NOW}]
    line = progress_line("resumed", TABLE, statuses, elapsed=700.0, now=NOW)
    # MLP1: 300 - 100 s to go, and one more whole: 1,200 s; MLP3 as MLP1 (trained) 3 times, 3,600 s less the
    # running one's 0 s in; 5,000 s on 2 workers
    assert line == "resumed: 1/12 done, 2 running, 0 failed | MLP1, MLP3 epoch 1/20 | ~41m40s left, 6 untimed"


def test_a_sweep_plans_each_job_by_its_overrides_less_the_seed_and_its_familys_kind(brown_path: Path) -> None:
    """brown_table1 composed as `nplm-train -m study=brown_table1` composes it: 21 rows, here three jobs at a time;
    a job's key is what its own config will give (`hydra.overrides.task`, Hydra's own keys apart)."""
    overrides = ["study=brown_table1", f"data.path={brown_path}"]
    with initialize_config_module(config_module="nplm_repro.conf", version_base="1.3"):
        config = compose("config", overrides=[*overrides, "hydra.launcher.n_jobs=3"], return_hydra_config=True)
        planned = plan(config)
    kinds = dict(planned.jobs)
    assert len(planned.jobs) == len(kinds) == 21 and planned.workers == 3
    assert Counter(kinds.values()) == {"trained": 5, "counted": 11, "mixed": 5}
    assert kinds[job_key(["experiment=mlp9", "seed=2", *overrides])] == "trained"
    assert kinds[job_key(["experiment=mlp10", *overrides])] == "mixed"
    assert kinds[job_key(["experiment=kn5", *overrides])] == "counted"


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
