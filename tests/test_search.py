"""Hyperparameter search with Hydra's Optuna sweeper (the extra `optuna`): `hparams_search=paper_lr` minimises the
validation perplexity that nplm-train returns, every trial a run under the search's MLflow parent run, the study
kept in ./optuna.db so that the same command continues it. Skipped where the extra is not installed."""

from pathlib import Path

import mlflow
import pytest
from helpers import SLICE, run_script
from mlflow.tracking import MlflowClient

pytest.importorskip(
    "hydra_plugins.hydra_optuna_sweeper", reason="Hydra's Optuna sweeper is not installed: pip install -e '.[optuna]'"
)
optuna = pytest.importorskip("optuna")

TINY_MLP = ["experiment=mlp3", "model.m=8", "trainer.max_epochs=1", "trainer.limit_train_batches=5"]


@pytest.mark.slow
def test_optuna_search_minimises_valid_ppl_under_one_parent_and_resumes(brown_path: Path, tmp_path: Path) -> None:
    """Two trials at a time (joblib), the same command twice: four trials in one study, four runs under one parent
    run, each trial's value its run's valid_ppl; the parent keeps the search's report and best numbers."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = ["hparams_search=paper_lr", "hydra.sweeper.n_trials=2", *TINY_MLP, *SLICE]
    for _ in range(2):
        result = run_script("nplm-train", *command, f"data.path={brown_path}", f"tracking.uri={uri}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-4000:]

    storage = optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path}/optuna.db", engine_kwargs={"isolation_level": "AUTOCOMMIT"}
    )
    trials = optuna.load_study(study_name="paper_lr", storage=storage).trials
    assert len(trials) == 4 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["brown"])
    parents, jobs = runs[runs["tags.sweep"] == "true"], runs[runs["tags.sweep"] != "true"]
    assert len(parents) == 1 and len(jobs) == 4  # the second command resumed the parent run
    parent = parents.iloc[0]
    assert parent["tags.sweeper"].endswith("OptunaSweeper") and parent["status"] == "FINISHED"
    assert parent["params.sweep.params.optim.lr"] == "tag(log, interval(1e-4, 1e-2))"
    assert (jobs["tags.mlflow.parentRunId"] == parent["run_id"]).all() and (jobs["tags.study"] == "paper_lr").all()
    assert (jobs["params.optim.recipe"] == "paper").all() and (jobs["status"] == "FINISHED").all()
    by_params = {
        (float(r["params.optim.lr"]), float(r["params.optim.decay_rate"])): r["metrics.valid_ppl"]
        for _, r in jobs.iterrows()
    }
    for trial in trials:
        assert by_params[(trial.params["optim.lr"], trial.params["optim.decay_rate"])] == pytest.approx(trial.value)

    best = jobs.sort_values("metrics.valid_ppl").iloc[0]
    client = MlflowClient(uri)
    assert client.get_run(parent["run_id"]).data.metrics["best_mlp_test_ppl"] == pytest.approx(best["metrics.test_ppl"])
    kept = {Path(a.path).name for a in client.list_artifacts(parent["run_id"], "report")}
    assert {"paper_lr.md", "paper_lr.csv", "paper_lr_test.png"} <= kept
    assert "paper_lr_optim.lr.png" not in kept  # its trials differ in lr and decay_rate at once: no like with like
