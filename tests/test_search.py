"""Hyperparameter search (`hparams_search=...`, nplm_repro/sweeping/search.py): Optuna's trials launched by Hydra's
launcher, each a run under the search's MLflow parent run, each epoch's validation perplexity reported to its trial,
a trial the pruner stops scored like any run, the study kept in ./optuna.db so that the same command continues it,
a trial left running by a stopped search resumed with its own number."""

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from helpers import SLICE, STACKS, console_script, ends_within, run_script
from mlflow.tracking import MlflowClient

optuna = pytest.importorskip("optuna", reason="the search needs the extra optuna: pip install -e '.[optuna]'")

TINY_MLP = ["experiment=mlp3", "model.m=8", "trainer.max_epochs=1", "trainer.limit_train_batches=5"]


def search(brown_path: Path, where: Path, *overrides: str) -> None:
    uri = f"sqlite:///{where}/mlflow.db"
    args = [*TINY_MLP, *SLICE, *overrides, f"data.path={brown_path}", f"tracking.uri={uri}"]
    result = run_script("nplm-train", "hparams_search=paper_lr", *args, cwd=where)
    assert result.returncode == 0, result.stderr[-4000:]


def study_of(where: Path, name: str = "paper_lr") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{where}/optuna.db")


def trials(where: Path, name: str = "paper_lr") -> list:
    return study_of(where, name).trials


@pytest.mark.slow
def test_a_search_minimises_valid_ppl_under_one_parent_and_the_same_command_continues_it(
    brown_path: Path, tmp_path: Path
) -> None:
    """Three trials, two at a time: each trial's value its run's valid_ppl, every run under one parent run that
    keeps the search's report; the same command again finds its budget spent and adds nothing. The study was left
    by a search stopped while trial 0 ran (made here, unbound, so adopted): the command runs trial 0 (its number, its
    values) before any new one."""
    distributions = {"optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}
    distributions["optim.decay_rate"] = optuna.distributions.FloatDistribution(1e-9, 1e-6, log=True)
    study = optuna.create_study(study_name="paper_lr", storage=f"sqlite:///{tmp_path}/optuna.db")
    left = study.ask(distributions)
    for _ in range(2):
        search(brown_path, tmp_path, "hydra.sweeper.n_trials=3", "hydra.sweeper.adopt=true")
    found = trials(tmp_path)
    assert len(found) == 3 and all(t.state == optuna.trial.TrialState.COMPLETE for t in found)
    assert found[0].number == 0 and found[0].params == left.params  # the trial left running, launched again
    assert all(t.intermediate_values == {1: pytest.approx(t.value, rel=1e-3)} for t in found)  # epoch 1, the quarter
    assert all(t.user_attrs["cpu_seconds"] > 0 for t in found)

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["brown"])
    parents, jobs = runs[runs["tags.sweep"] == "true"], runs[runs["tags.sweep"] != "true"]
    assert len(parents) == 1 and len(jobs) == 3  # the second command resumed the parent run
    parent = parents.iloc[0]
    assert parent["tags.sweeper"].endswith("OptunaSearch") and parent["status"] == "FINISHED"
    assert parent["params.sweep.params.optim.lr"] == "tag(log, interval(1e-4, 1e-2))"
    assert (jobs["tags.mlflow.parentRunId"] == parent["run_id"]).all() and (jobs["tags.study"] == "paper_lr").all()
    assert (jobs["params.optim.recipe"] == "paper").all() and (jobs["status"] == "FINISHED").all()
    by_trial = {int(r["params.callbacks.pruning.trial"]): r["metrics.valid_ppl"] for _, r in jobs.iterrows()}
    assert by_trial == {t.number: pytest.approx(t.value) for t in found}
    kept = {Path(a.path).name for a in MlflowClient().list_artifacts(parent["run_id"], "report")}
    assert {"paper_lr.md", "paper_lr.csv", "paper_lr_test.png"} <= kept
    report = (tmp_path / "reports" / "paper_lr.md").read_text()
    best = min(found, key=lambda t: t.value)
    assert "- Trials: 3 (3 max_epochs; 0 failed, 0 running);" in report
    assert f"- Best on validation: trial {best.number}, valid {best.value:.1f}" in report


@pytest.mark.slow
def test_the_pruner_stops_a_trial_which_is_scored_like_any_run(brown_path: Path, tmp_path: Path) -> None:
    """A pruner that prunes every trial above perplexity 1 stops each after its first epoch of three: PRUNED in the
    study, FINISHED in the store with its valid and test perplexity and the epoch it stopped at."""
    pruner = ["hydra.sweeper.pruner._target_=optuna.pruners.ThresholdPruner", "+hydra.sweeper.pruner.upper=1.0"]
    search(brown_path, tmp_path, "hydra.sweeper.n_trials=2", "trainer.max_epochs=3", *pruner)
    found = trials(tmp_path)
    assert [t.state for t in found] == [optuna.trial.TrialState.PRUNED] * 2
    assert all(list(t.intermediate_values) == [1] and t.user_attrs["pruned_epoch"] == 1 for t in found)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["brown"])
    jobs = runs[runs["tags.sweep"] != "true"]
    assert len(jobs) == 2 and (jobs["status"] == "FINISHED").all()
    assert (jobs["metrics.pruned_epoch"] == 1).all() and (jobs["metrics.epochs"] == 1).all()
    assert jobs["metrics.test_ppl"].notna().all()


@pytest.mark.slow
def test_a_search_without_a_trial_cap_ends_at_its_budget_then_retrains_its_best_on_other_seeds(
    brown_path: Path, tmp_path: Path
) -> None:
    """No n_trials: the budget (spent by the first epoch) stops the two trials started after it (each COMPLETE at
    its epoch's perplexity, saying why) and starts no third, each proposed at random (TPE's start of 10) and saying
    so on its run; then the better trial trains again from scratch on seeds 2 and 3, without pruning or budget, to
    its last epoch, and the report sets its retrained values beside its search value."""
    budget = ["hydra.sweeper.n_trials=null", "hydra.sweeper.cpu_hours=1e-9", "trainer.max_epochs=3"]
    search(brown_path, tmp_path, *budget, "hydra.sweeper.retrain={top:1,seeds:[2,3]}")
    found = trials(tmp_path)
    assert len(found) == 2 and all(t.user_attrs["proposed_by"] == "random" for t in found)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in found)
    assert all(t.user_attrs["budget_epoch"] == 1 and list(t.intermediate_values) == [1] for t in found)
    best = min(found, key=lambda t: t.value)
    retrained = optuna.load_study(study_name="paper_lr", storage=f"sqlite:///{tmp_path}/optuna.db").user_attrs
    assert list(retrained["retrained"]) == [str(best.number)] and set(retrained["retrained"][str(best.number)]) == {
        "2",
        "3",
    }
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    jobs = mlflow.search_runs(experiment_names=["brown"])
    jobs = jobs[jobs["tags.sweep"] != "true"]
    searched = jobs[jobs["params.callbacks.pruning.trial"].notna()]
    again = jobs[jobs["params.callbacks.pruning.trial"].isna()]
    assert (searched["tags.search_proposed_by"] == "random").all()
    assert json.loads(searched["tags.search_space"].iloc[0])["optim.lr"] == {"low": 1e-4, "high": 1e-2, "log": True}
    assert (
        sorted(again["params.seed"]) == ["2", "3"] and (again["params.optim.lr"] == str(best.params["optim.lr"])).all()
    )
    assert (again["metrics.epochs"] == 3).all()  # no budget stops a retrain: it trains to its own end
    report = (tmp_path / "reports" / "paper_lr.md").read_text()
    assert "- Proposals: none proposed by the sampler; 2 drawn at random (the sampler's start)." in report
    assert f"trial {best.number}: valid {best.value:.1f} in the search; retrained " in report
    assert f"Chosen: trial {best.number}." in report


def both_past_an_epoch(where: Path) -> bool:
    """Whether both trials have reported an epoch and written its last.ckpt. The report comes first: the pruning
    callback reports in on_validation_end, and Lightning runs its checkpoint callbacks after every other one, so a
    signal between the two would stop a run with nothing to resume from (right, but not what these tests are about).
    The study is read from its database read-only: Optuna's own `load_study` creates the tables it misses, and when
    the search is creating them at that moment, one of the two fails on the other's (UNIQUE constraint failed:
    alembic_version.version_num)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{where}/optuna.db?mode=ro", uri=True)) as study:
            (reported,) = study.execute("SELECT count(DISTINCT trial_id) FROM trial_intermediate_values").fetchone()
    except sqlite3.OperationalError:  # not created yet, or its tables not yet
        return False
    return reported == 2 and len(list(where.glob("multirun/*/*/*/checkpoints/last.ckpt"))) == 2


def stopped_search(brown_path: Path, where: Path, *overrides: str, env: dict[str, str] | None = None) -> pd.DataFrame:
    """A search of two long trials sent SIGTERM once both have trained an epoch: it ends within 60 s with exit 130,
    its trials RUNNING (the same command launches them again: test_a_search_minimises_...). Its trials' runs."""
    uri = f"sqlite:///{where}/mlflow.db"
    args = [*TINY_MLP, *SLICE, f"data.path={brown_path}", f"tracking.uri={uri}", "hydra.sweeper.n_trials=2"]
    long = ["trainer.max_epochs=200", "trainer.limit_train_batches=40", "callbacks.early_stopping.patience=1000"]
    command = [console_script("nplm-train"), "hparams_search=paper_lr", *args, *long, *overrides]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | STACKS | (env or {})
    output = where / "search.log"
    with output.open("w") as log:
        search = subprocess.Popen(command, cwd=where, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 240
            while not both_past_an_epoch(where):
                assert search.poll() is None and time.monotonic() < deadline, output.read_text()
                time.sleep(1)
            search.send_signal(signal.SIGTERM)
            assert ends_within(search, 60, output) == 130, output.read_text()[-6000:]
        finally:
            search.kill()
    assert [t.state for t in trials(where)] == [optuna.trial.TrialState.RUNNING] * 2
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["brown"])
    jobs = runs[runs["tags.sweep"] != "true"]
    ended = jobs[["status", *[c for c in ("tags.error", "tags.killed_because") if c in jobs]]].to_dict("records")
    assert len(jobs) == 2 and (jobs["status"] == "KILLED").all(), (ended, output.read_text()[-6000:])
    return jobs


@pytest.mark.slow
def test_sigterm_stops_a_search_at_once_leaving_its_trials_to_resume(brown_path: Path, tmp_path: Path) -> None:
    """SIGTERM while two trials train stops the search within seconds, not when the trials end (the search waited
    on its launches): exit 130, the trials' runs KILLED with their last checkpoints and the trials RUNNING, which the
    same command launches again with their numbers, resuming the runs."""
    for _, run in stopped_search(brown_path, tmp_path).iterrows():  # what the ledger's find_resumable resumes from
        assert (Path(run["tags.checkpoint_dir"]) / "last.ckpt").is_file()


STUCK = """
import time

from lightning.pytorch.callbacks import Callback


class Stuck(Callback):
    def on_exception(self, trainer, pl_module, exception):
        time.sleep(3600)
"""


@pytest.mark.slow
def test_a_trial_stuck_after_the_stop_is_killed_and_its_run_still_ends_killed(brown_path: Path, tmp_path: Path) -> None:
    """Trials whose jobs never end once interrupted (a callback stuck in on_exception): the search kills their
    workers stop_seconds after the stop instead of waiting on them, and still ends in seconds with exit 130, each
    run KILLED by the sweep's end (its process gone) and each trial RUNNING, resumable."""
    (tmp_path / "stuck.py").write_text(STUCK)
    stuck = ["hydra.sweeper.stop_seconds=3", "+callbacks.stuck._target_=stuck.Stuck"]
    jobs = stopped_search(brown_path, tmp_path, *stuck, env={"PYTHONPATH": str(tmp_path)})
    assert jobs["tags.killed_because"].notna().all()
    assert "had not ended 3 s after the stop: their workers are killed" in (tmp_path / "search.log").read_text()


TINY_SEARCH = [
    "hparams_search=paper_lr",
    *TINY_MLP,
    "hydra/launcher=basic",
    "data.split.valid=1000",
    "data.split.test=1000",
    "hydra.sweeper.n_trials=1",
]


def tiny_search(tiny_brown_path: Path, where: Path, *overrides: str) -> tuple[int, str, str]:
    """A one-trial search of tiny_brown.zip in the folder `where`: its exit code, last line on stderr, and all it
    printed (Hydra's log, with the search's summary, goes to stdout)."""
    result = run_script("nplm-train", *TINY_SEARCH, f"data.path={tiny_brown_path}", *overrides, cwd=where)
    return result.returncode, (result.stderr.strip().splitlines() or [""])[-1], result.stdout + result.stderr


@pytest.mark.slow  # three searches, about 45 s
def test_a_search_in_the_folder_of_another_never_reports_its_result(tiny_brown_path: Path, tmp_path: Path) -> None:
    """Both searches named paper_lr, kept in the folder's ./optuna.db: the second, on other data into another store,
    ran no trial and exited 0 with the first's best value as its own, leaving an empty FINISHED parent run. The same
    command resumes its own study; another corpus, store or config is refused before its store is made."""
    first = ["data.split.train=5000", "tracking.uri=sqlite:///first.db"]
    for store in ("sqlite:///first.db", f"sqlite:///{tmp_path}/../{tmp_path.name}/first.db"):
        # one store, named two ways: the second finds its one trial done and its binding the same
        code, _, stderr = tiny_search(tiny_brown_path, tmp_path, "data.split.train=5000", f"tracking.uri={store}")
        assert code == 0 and "search paper_lr: 1 complete" in stderr, stderr[-3000:]
    binding = optuna.load_study(study_name="paper_lr", storage=f"sqlite:///{tmp_path}/optuna.db").user_attrs["binding"]
    assert binding["store"] == "sqlite:///first.db" and len(binding["corpus"]) == 16

    code, line, stderr = tiny_search(tiny_brown_path, tmp_path, "data.split.train=6000", "tracking.uri=sqlite:///2.db")
    assert code == 2 and "best value" not in stderr, stderr[-3000:]
    assert line.startswith("nplm-train: error: search paper_lr in sqlite:///optuna.db searched something else (")
    assert f"corpus fingerprint {binding['corpus']} there, " in line and "tracking store sqlite:///first.db" in line
    assert "key of the config" not in line and "hydra.sweeper.study_name=paper_lr_" in line, line
    assert not (tmp_path / "2.db").exists() and len(trials(tmp_path)) == 1  # no store, no parent run, no trial

    code, line, _ = tiny_search(tiny_brown_path, tmp_path, *first, "model.h=4")  # the same data, another model
    assert code == 2 and "(key of the config less the swept keys " in line and "corpus" not in line, line
    own = line.split("hydra.sweeper.study_name=")[1].split()[0]
    code, _, stderr = tiny_search(tiny_brown_path, tmp_path, *first, "model.h=4", f"hydra.sweeper.study_name={own}")
    assert code == 0 and f"search {own}: 1 complete" in stderr, stderr[-3000:]
    assert len(trials(tmp_path, own)) == 1 and len(trials(tmp_path)) == 1


@pytest.mark.slow  # two searches, about 30 s
def test_a_study_kept_without_a_binding_is_refused_unless_adopted(tiny_brown_path: Path, tmp_path: Path) -> None:
    """An optuna.db from before searches kept a binding was resumed by any search of its name: it ran no trial,
    exited 0 with that study's best value (126.0) as its own, and bound the study to itself."""
    old = optuna.create_study(study_name="paper_lr", storage=f"sqlite:///{tmp_path}/optuna.db")
    lr = optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)
    old.add_trial(optuna.trial.create_trial(params={"optim.lr": 1e-2}, distributions={"optim.lr": lr}, value=126.0))
    other = ["data.split.train=5000", "tracking.uri=sqlite:///other.db"]
    code, line, said = tiny_search(tiny_brown_path, tmp_path, *other)
    assert code == 2 and "126" not in said, said[-3000:]
    assert line.startswith("nplm-train: error: search paper_lr in sqlite:///optuna.db was made before searches kept")
    assert "hydra.sweeper.study_name=paper_lr_" in line and line.endswith("hydra.sweeper.adopt=true (nothing was run)")
    assert not (tmp_path / "other.db").exists() and "binding" not in study_of(tmp_path).user_attrs

    code, _, said = tiny_search(tiny_brown_path, tmp_path, *other, "hydra.sweeper.adopt=true")
    assert code == 0, said[-3000:]
    assert study_of(tmp_path).user_attrs["binding"]["store"] == "sqlite:///other.db"  # it is this search's now


@pytest.mark.parametrize(  # each starts nplm-train (about 10 s): one in the default suite, the others slow
    "override, said",
    [
        ("hydra.sweeper.n_trials=0", "hydra.sweeper.n_trials=0 is invalid: expected an integer >= 1"),
        *(
            pytest.param(override, said, marks=pytest.mark.slow)
            for override, said in [
                ("hydra.sweeper.cpu_hours=-1", "hydra.sweeper.cpu_hours=-1 is invalid: expected a number > 0, or "),
                ("hydra.sweeper.stop_seconds=-1", "hydra.sweeper.stop_seconds=-1 is invalid: expected a number of s"),
                ("hydra.sweeper.n_jobs=0", "hydra.sweeper.n_jobs=0 is invalid: expected an integer >= 1"),
                ("optim.lr=interval(3e-3, 3e-4)", "optim.lr: interval(3e-3, 3e-4) is an empty interval: write the "),
                ("model.h=range(5, 1)", "model.h: range(5, 1) has no value to try"),
                ("hydra.sweeper.n_trials=null", "hydra.sweeper.n_trials and cpu_hours are both null: the search "),
                ("hydra.sweeper.retrain={top:0,seeds:[2]}", "hydra.sweeper.retrain.top=0 is invalid: expected an "),
                ("hydra.sweeper.retrain={top:1,seeds:[2,2]}", "hydra.sweeper.retrain.seeds=[2, 2] is invalid: expec"),
            ]
        ),
    ],
)
def test_a_search_that_could_run_nothing_is_refused_before_its_store(
    override: str, said: str, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """n_trials=0 and cpu_hours=-1 ran no trial and exited 0, n_jobs=0 failed with joblib's words after its store and
    a FAILED parent run were made, a reversed interval with Optuna's."""
    code, line, stderr = tiny_search(tiny_brown_path, tmp_path, "tracking.uri=sqlite:///m.db", override)
    assert code == 2 and line.startswith(f"nplm-train: error: {said}"), stderr[-3000:]
    assert line.endswith("(nothing was run)") and stderr.strip() == line
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "optuna.db").exists()
