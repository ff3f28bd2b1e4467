"""Quick checks never land among a study's runs: `debug=default` records a few steps in experiment debug_<corpus>,
and Lightning's fast_dev_run (a run with no perplexities, which the report would list as failed) is refused."""

from pathlib import Path

import mlflow
import pytest
from helpers import composed, composed_study, run_script

from nplm_repro.errors import NplmError
from nplm_repro.tracking.config_checks import FAST_DEV_RUN, check_config


@pytest.mark.parametrize("value", ["true", "1", "5"])
def test_fast_dev_run_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(NplmError, match=r"^trainer\.fast_dev_run is refused: .*debug=default"):
        check_config(composed(f"+trainer.fast_dev_run={value}"))
    check_config(composed("+trainer.fast_dev_run=false"))


def test_fast_dev_run_is_one_line_and_exit_2_before_the_store_is_touched(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = run_script(
        "nplm-train", "experiment=mlp3", "+trainer.fast_dev_run=true", f"tracking.uri={uri}", cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"nplm-train: error: {FAST_DEV_RUN}"]
    assert not (tmp_path / "mlflow.db").exists()


def test_debug_runs_a_few_steps_on_a_slice_into_an_experiment_of_its_own() -> None:
    cfg = composed_study("brown_table1", "debug=default")  # last in the defaults: it wins over the study's keys
    assert cfg.tracking.experiment == "debug_brown" and cfg.report is None and cfg.rerun
    assert (cfg.trainer.max_epochs, cfg.trainer.limit_train_batches) == (1, 5)
    assert (cfg.data.split.train, cfg.data.split.valid, cfg.data.split.test) == (20_000, 4_000, 4_000)
    assert composed("data=ap", "debug=default").tracking.experiment == "debug_ap"


@pytest.mark.slow
def test_a_debug_study_runs_every_job_apart_from_the_study(brown_path: Path, tmp_path: Path) -> None:
    """The whole path of a study in seconds: an MLP and an n-gram row under their parent run, all in experiment
    debug_brown with their perplexities; nothing in experiment brown, no report; the same command runs again."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = ["-m", "study=brown_table1", "debug=default", "hydra/launcher=basic", "experiment=mlp3,kn3"]
    for _ in range(2):
        result = run_script("nplm-train", *command, f"data.path={brown_path}", f"tracking.uri={uri}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-4000:]
    mlflow.set_tracking_uri(uri)
    assert mlflow.get_experiment_by_name("brown") is None and not (tmp_path / "reports").exists()
    runs = mlflow.search_runs(experiment_names=["debug_brown"])
    parents, jobs = runs[runs["tags.sweep"] == "true"], runs[runs["tags.sweep"] != "true"]
    assert len(parents) == 1 and sorted(jobs["tags.row"]) == ["Kneser-Ney back-off"] * 2 + ["MLP3"] * 2
    assert (jobs["tags.mlflow.parentRunId"] == parents.iloc[0]["run_id"]).all()
    assert (jobs["status"] == "FINISHED").all() and jobs["metrics.valid_ppl"].notna().all()
