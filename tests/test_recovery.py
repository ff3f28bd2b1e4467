"""Interrupted and failing runs, with real processes and a real MLflow store: nothing is lost, nothing lies.

A run is stopped by SIGKILL, SIGTERM or Ctrl-C (SIGINT) in the middle of its second epoch; the same command
continues it in the same MLflow run from epoch 1's checkpoint and ends where an uninterrupted run of the same
seed ends. A run killed before any checkpoint is marked KILLED by the next run of its command.
"""

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import lightning as L
import mlflow
import pytest
import torch
from helpers import SWEEPS, composed, console_script, data_slice, run_command
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from nplm_repro import errors
from nplm_repro.errors import NplmError, interrupted
from nplm_repro.models.training import fit_callbacks
from nplm_repro.progress import STATUS_ENV, read_status
from nplm_repro.reporting.tables import build
from nplm_repro.tracking import ledger
from nplm_repro.tracking.ledger import ORPHANED

STOPPED = "nplm-train: interrupted (any run it was recording is now KILLED; the same command resumes it)"

SLICE = data_slice(60_000, 5_000, 5_000)
SMALL = [*SLICE, "experiment=mlp3", "model.m=8", "trainer.max_epochs=2", "seed=5", "trainer.enable_progress_bar=false"]
NPLM_TRAIN, NPLM_REPORT = console_script("nplm-train"), console_script("nplm-report")


def command(brown_path: Path, uri: str, *overrides: str) -> list[str]:
    return [NPLM_TRAIN, f"data.path={brown_path}", *SMALL, f"tracking.uri={uri}", *overrides]


def runs(uri: str, experiment: str = "brown") -> list[mlflow.entities.Run]:
    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def runs_if_any(uri: str) -> list[mlflow.entities.Run]:
    """The runs of experiment brown, none while the store or the experiment does not exist yet."""
    client = MlflowClient(uri)
    try:
        experiment = client.get_experiment_by_name("brown")
    except Exception:  # noqa: BLE001  the store's tables are being created by the process under test
        return []
    return client.search_runs([experiment.experiment_id]) if experiment else []


def running(uri: str) -> int:
    """How many runs of experiment brown are RUNNING."""
    return len([r for r in runs_if_any(uri) if r.info.status == "RUNNING"])


@pytest.fixture(scope="module")
def uninterrupted(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    uri = f"sqlite:///{workdir}/mlflow.db"
    result = run_command(command(brown_path, uri), cwd=workdir, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = runs(uri)
    return run.data.metrics


def stderr_tail(result: subprocess.CompletedProcess) -> str:
    return result.stderr[-3000:]


def stop_when(
    args: list[str], workdir: Path, ready: Callable[[], bool], how: signal.Signals = signal.SIGTERM
) -> subprocess.CompletedProcess:
    """Start the command; once `ready()`, send `how`, and wait for the command to end."""
    process = subprocess.Popen(args, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ready():
        assert process.poll() is None and time.monotonic() < deadline, "the command ended before it was stopped"
        time.sleep(0.05)
    process.send_signal(how)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def stop_mid_second_epoch(args: list[str], workdir: Path, uri: str, how: signal.Signals) -> subprocess.CompletedProcess:
    """Once epoch 1's last.ckpt exists and MLflow holds a training step past it (train_loss_step, every 50 steps
    of about 235 an epoch), send `how`: training is then inside epoch 2."""
    saved_at = None

    def in_epoch_2() -> bool:
        nonlocal saved_at
        if saved_at is None:
            if not (checkpoints := list(workdir.glob("outputs/*/*/checkpoints/last.ckpt"))):
                return False
            saved_at = torch.load(checkpoints[0], weights_only=False)["global_step"]
        (run,) = runs(uri)
        history = MlflowClient(uri).get_metric_history(run.info.run_id, "train_loss_step")
        return max((m.step for m in history), default=0) > saved_at

    return stop_when(args, workdir, in_epoch_2, how)


@pytest.mark.parametrize(
    "how,status,exit_code",
    [
        pytest.param(signal.SIGKILL, "RUNNING", -9, marks=pytest.mark.slow),
        pytest.param(signal.SIGTERM, "KILLED", 130, marks=pytest.mark.slow),
        pytest.param(signal.SIGINT, "KILLED", 130, marks=pytest.mark.slow),
    ],
)
def test_stopped_run_resumes_in_the_same_run_and_ends_as_an_uninterrupted_one(
    how: signal.Signals,
    status: str,
    exit_code: int,
    uninterrupted: dict[str, float],
    brown_path: Path,
    tmp_path: Path,
) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    stopped = stop_mid_second_epoch(command(brown_path, uri), tmp_path, uri, how)
    assert stopped.returncode == exit_code, stderr_tail(stopped)
    if how != signal.SIGKILL:
        assert stopped.stderr.strip().splitlines()[-1] == STOPPED
    (run,) = runs(uri)
    assert run.info.status == status  # kill -9 gives no chance to mark it: RUNNING, with its process gone
    client = MlflowClient(uri)
    assert len(client.get_metric_history(run.info.run_id, "valid_ppl_epoch")) == 1  # epoch 2 never ended
    last = Path(run.data.tags["checkpoint_dir"]) / "last.ckpt"
    saved = torch.load(last, weights_only=False)  # usable: written atomically
    assert saved["epoch"] == 0
    trained = max(m.step for m in client.get_metric_history(run.info.run_id, "train_loss_step"))
    assert trained > saved["global_step"]  # steps of epoch 2 ran after the checkpoint: they are lost, and redone
    assert not [p for p in last.parent.iterdir() if p.suffix != ".ckpt"]  # no half-written temporary left

    status = tmp_path / "status.json"  # what a sweep's job tells the sweep's progress display
    env = os.environ | {STATUS_ENV: str(status)}
    resumed = run_command(command(brown_path, uri), cwd=tmp_path, timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming run {run.info.run_id} from {last}" in resumed.stdout + resumed.stderr
    # epoch 1 was trained before: the display's time left counts epoch 2 only as this launch's pace
    told = read_status(status)
    assert (told["epochs_before"], told["epoch"], told["max_epochs"]) == (1, 2, 2)
    (after,) = runs(uri)  # the same run, not a second one
    assert after.info.run_id == run.info.run_id and after.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "valid_ppl_epoch")
    assert len({m.step for m in history}) == len(history) == 2  # each epoch once, none lost or repeated
    for split in ("train", "valid", "test"):
        ours, reference = after.data.metrics[f"{split}_ppl"], uninterrupted[f"{split}_ppl"]
        assert abs(ours / reference - 1) < 0.01, (split, ours, reference)


@pytest.mark.slow
def test_a_killed_sampled_run_resumes_and_ends_as_an_uninterrupted_one(brown_path: Path, tmp_path: Path) -> None:
    """Sampled training decays C and U lazily: the checkpoint must hold every row brought up to date, and the
    optimiser's bookkeeping must resume with it, or the resumed run's rows would be decayed twice or not at all."""
    # a weight decay 100 times the recipe's, so that a row decayed twice or not at all moves the perplexities
    sampled = ["optim=sampled", "optim.weight_decay=1e-2"]
    whole, stopped_dir = tmp_path / "whole", tmp_path / "stopped"
    whole.mkdir()
    stopped_dir.mkdir()
    reference_uri, uri = f"sqlite:///{whole}/mlflow.db", f"sqlite:///{stopped_dir}/mlflow.db"
    reference = run_command(command(brown_path, reference_uri, *sampled), cwd=whole, timeout=600)
    assert reference.returncode == 0, stderr_tail(reference)
    stopped = stop_mid_second_epoch(command(brown_path, uri, *sampled), stopped_dir, uri, signal.SIGKILL)
    assert stopped.returncode == -9, stderr_tail(stopped)
    resumed = run_command(command(brown_path, uri, *sampled), cwd=stopped_dir, timeout=600)
    assert resumed.returncode == 0, stderr_tail(resumed)
    assert "resuming run" in resumed.stdout + resumed.stderr
    ((run,), (expected,)) = runs(uri), runs(reference_uri)
    for split in ("train", "valid", "test"):  # the same draws as well: the checkpoint keeps torch's generator
        ours, reference_ppl = run.data.metrics[f"{split}_ppl"], expected.data.metrics[f"{split}_ppl"]
        assert ours == pytest.approx(reference_ppl, rel=1e-6), (split, ours, reference_ppl)


@pytest.mark.slow
def test_rerun_true_starts_afresh_instead_of_resuming(brown_path: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    stopped = stop_mid_second_epoch(command(brown_path, uri), tmp_path, uri, signal.SIGINT)
    assert stopped.returncode == 130, stderr_tail(stopped)
    fresh = run_command(command(brown_path, uri, "rerun=true", "trainer.max_epochs=1"), cwd=tmp_path)
    assert fresh.returncode == 0, stderr_tail(fresh)
    assert "resuming" not in fresh.stderr
    assert sorted(r.info.status for r in runs(uri)) == ["FINISHED", "KILLED"]


@pytest.mark.parametrize(
    "overrides,progress,study",
    [
        (["experiment=class_n3_c150"], "exchange c=150 pass 1:", "brown_table1"),  # an n-gram row, clustering
        (["experiment=mlp3", "model.m=8", "trainer.max_epochs=1"], "MLflow run ", "adhoc"),  # before a checkpoint
    ],
)
@pytest.mark.slow
def test_run_killed_without_checkpoint_is_marked_killed_by_the_next_run(
    overrides: list[str], progress: str, study: str, brown_path: Path, tmp_path: Path
) -> None:
    """kill -9 leaves the run RUNNING; the same command proves it orphaned (it holds the config's lock), marks it
    KILLED and records a new run, so the report shows a finished row and the killed run, nothing running."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [NPLM_TRAIN, f"data.path={brown_path}", *SLICE, *overrides, f"tracking.uri={uri}"]
    args.append("trainer.enable_progress_bar=false")
    env = {**os.environ, "NPLM_CACHE": str(tmp_path / "cache")}  # no clustering cached by an earlier run
    process = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert any(progress in line for line in process.stdout), "the job ended before it was under way"
    process.kill()
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    (orphan,) = runs(uri)
    assert orphan.info.status == "RUNNING" and not list(tmp_path.glob("outputs/*/*/checkpoints/*.ckpt"))

    again = run_command(args, cwd=tmp_path, timeout=600, env=env)
    assert again.returncode == 0, stderr_tail(again)
    assert f"run {orphan.info.run_id} of this config was left RUNNING by a process now gone" in again.stdout
    by_id = {r.info.run_id: r for r in runs(uri)}
    killed = by_id.pop(orphan.info.run_id)
    assert killed.info.status == "KILLED" and killed.data.tags["killed_because"] == ORPHANED
    (new,) = by_id.values()
    assert new.info.status == "FINISHED" and new.data.tags["config_key"] == killed.data.tags["config_key"]
    report = build(uri, "brown", study)
    assert report.running.empty and list(report.failed["run_id"]) == [killed.info.run_id]
    assert list(report.table["status"]).count("finished") == 1 and "running" not in set(report.table["status"])


@pytest.mark.slow
def test_diverging_job_fails_with_its_error_and_the_sweep_completes(brown_path: Path, tmp_path: Path) -> None:
    """MLP3 with a huge learning rate reaches a NaN loss; the Kneser-Ney job beside it finishes."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweep = [NPLM_TRAIN, "-cd", str(SWEEPS), "-cn", "brown_table1"]
    sweep += [f"data.path={brown_path}", *SLICE, "experiment=mlp3,kn3", "optim.lr=10", f"tracking.uri={uri}"]
    result = run_command(sweep, cwd=tmp_path, timeout=600)
    assert result.returncode == 2
    message = "the model diverged (try a smaller optim.lr)"
    assert result.stderr.strip().splitlines()[-1].endswith(message)
    by_row = {r.data.tags.get("row", "parent"): r for r in runs(uri)}
    assert by_row["parent"].info.status == "FAILED"
    assert by_row["Kneser-Ney back-off"].info.status == "FINISHED"
    failed = by_row["MLP3"]
    assert failed.info.status == "FAILED" and failed.data.tags["error"].endswith(message)
    error = MlflowClient(uri).download_artifacts(failed.info.run_id, "error.txt", str(tmp_path))
    assert "Traceback" in Path(error).read_text()
    report = build(uri, "brown", "brown_table1")
    assert report.table.set_index("row").loc["MLP3", "status"] == "failed"
    written = (tmp_path / "reports" / "brown_table1.md").read_text()  # by the sweep, though Hydra skipped its end
    assert re.search(r"^\| MLP3 .*\| +failed \|", written, re.MULTILINE)
    assert f"run {failed.info.run_name}, {failed.info.run_id[:8]}, seed 1): FAILED" in written


@pytest.mark.slow  # about 15 s
def test_an_lstm_whose_perplexity_is_infinite_fails_as_diverged(tiny_brown_path: Path, tmp_path: Path) -> None:
    """A learning rate of a million: the loss stays a finite 1e25 while the perplexity overflows to inf. The run
    fails as diverged (exit 2, one line), so that no report, claim or registry takes it."""
    uri = f"sqlite:///{tmp_path}/m.db"
    args = [NPLM_TRAIN, "experiment=lstm", "optim=sampled", "model.output=standard", "optim.lr=1e6"]
    args.append("data.eval_batch_size=256")
    args += [f"data.path={tiny_brown_path}", *data_slice(7_000, 1_500, 1_500), "trainer.max_epochs=1"]
    args += [f"tracking.uri={uri}", "trainer.enable_progress_bar=false"]
    result = run_command(args, cwd=tmp_path, timeout=600)
    assert result.returncode == 2, stderr_tail(result)
    assert result.stderr.strip().splitlines()[-1].endswith("the model diverged (try a smaller optim.lr)")
    (run,) = runs(uri)
    assert run.info.status == "FAILED" and run.data.tags["error"].endswith(
        "the model diverged (try a smaller optim.lr)"
    )


@pytest.mark.slow  # about 15 s
def test_an_mlp_far_worse_than_uniform_fails_as_diverged_though_its_numbers_are_finite(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    """MLP9 at optim.lr=0.05 on the tiny corpus trained at 343 nats a token (uniform over |V| = 384 is 5.95) and
    FINISHED, valid 3.1e155 printed as a 157-digit number. A validation perplexity over 10 |V| fails the run."""
    uri = f"sqlite:///{tmp_path}/m.db"
    args = [NPLM_TRAIN, "experiment=mlp9", "optim.lr=0.05", f"data.path={tiny_brown_path}"]
    args += [*data_slice(7_000, 1_500, 1_500), "trainer.max_epochs=2", f"tracking.uri={uri}"]
    result = run_command(args, cwd=tmp_path, timeout=600)
    assert result.returncode == 2, stderr_tail(result)
    last = result.stderr.strip().splitlines()[-1]
    assert re.search(r"validation perplexity is \S+ after epoch 1, over 10 times \|V\| = \d+ ", last), last
    assert last.endswith("the model diverged (try a smaller optim.lr)")
    (run,) = runs(uri)
    assert run.info.status == "FAILED" and "valid_ppl" not in run.data.metrics


@pytest.mark.slow  # about 8-16 s: outside the default suite's 5 minutes
def test_unexpected_error_is_one_line_and_a_failed_run_with_its_traceback(brown_path: Path, tmp_path: Path) -> None:
    """A typo in an extra Trainer argument is a TypeError inside the run, not a bad value check_config knows."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = run_command(command(brown_path, uri, "+trainer.max_epoch=1"), cwd=tmp_path, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "Error executing job" not in result.stderr  # Hydra's own report, before ours
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("nplm-train: error: TypeError: ") and "'max_epoch'" in last
    assert last.endswith("(HYDRA_FULL_ERROR=1 shows the traceback)")
    (run,) = runs(uri)
    assert run.info.status == "FAILED" and "'max_epoch'" in run.data.tags["error"]
    error = MlflowClient(uri).download_artifacts(run.info.run_id, "error.txt", str(tmp_path))
    assert "Traceback" in Path(error).read_text()


def processes_naming(path: Path) -> list[str]:
    """The command lines of the live processes that name `path` (a test's store): a sweep's workers."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if str(path) in line and "pytest" not in line:
                found.append(line)
    return found


@pytest.mark.slow
def test_signals_to_sweeps_kill_their_runs_and_the_runs_they_resumed_and_the_same_command_finishes_them(
    brown_path: Path, tmp_path: Path
) -> None:
    """SIGINT to the launching process alone (not Ctrl-C, which reaches every process of the terminal) while two MLP
    jobs train (joblib), once both have saved epoch 1's checkpoint: the parent run ends KILLED, not RUNNING, and so do
    the jobs' runs, whose workers joblib kills outright: none is left. A second sweep that differs from the first (it
    adds a seed) resumes those two runs, which keep their first parent; SIGTERM on it while they train: its parent
    and the resumed runs end KILLED too, the resumed ones found by their tag `resumed_in`. The second sweep's command
    again resumes its parent run and finishes every job, and nothing is left running."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweep = [NPLM_TRAIN, "-cd", str(SWEEPS), "-cn", "brown_table1", f"data.path={brown_path}", *SLICE]
    sweep += ["experiment=mlp3", "model.m=8", f"tracking.uri={uri}"]
    sweep += ["trainer.max_epochs=3", "trainer.enable_progress_bar=false"]

    def checkpointed() -> bool:
        """Both jobs have saved epoch 1's checkpoint: the second sweep resumes both runs."""
        dirs = [Path(r.data.tags["checkpoint_dir"]) for r in runs_if_any(uri) if "checkpoint_dir" in r.data.tags]
        return sum((d / "last.ckpt").is_file() for d in dirs) == 2

    def parents() -> list[mlflow.entities.Run]:
        return sorted((r for r in runs(uri) if r.data.tags.get("sweep")), key=lambda r: r.info.start_time)

    def stopped(seeds: str, ready: Callable[[], bool], how: signal.Signals) -> dict[str, mlflow.entities.Run]:
        """The sweep of these seeds stopped by `how` once `ready()`; its jobs' runs by seed, each checked KILLED."""
        result = stop_when([*sweep, f"seed={seeds}"], tmp_path, ready, how)
        assert result.returncode == 130, stderr_tail(result)
        assert result.stderr.strip().splitlines()[-1] == STOPPED
        assert processes_naming(tmp_path) == []
        assert parents()[-1].info.status == "KILLED"
        by_seed = {r.data.params["seed"]: r for r in runs(uri) if "seed" in r.data.params}
        assert {r.info.status for r in by_seed.values()} == {"KILLED"}
        with pytest.raises(NplmError, match=r"no finished runs .*\(2 KILLED\)"):  # never numbers for them
            build(uri, "brown", "brown_table1")
        return by_seed

    first = stopped("1,2", checkpointed, signal.SIGINT)
    assert sorted(first) == ["1", "2"] and len(parents()) == 1
    second = stopped("1,2,3", lambda: running(uri) == 3, signal.SIGTERM)  # its parent and the two resumed runs
    (first_parent, second_parent) = parents()
    assert [r.info.status for r in runs(uri) if r.info.status == "RUNNING"] == []
    for seed in ("1", "2"):  # the same runs, resumed by the second sweep, which kept their first parent
        resumed = second[seed]
        assert resumed.info.run_id == first[seed].info.run_id and resumed.info.status == "KILLED"
        assert resumed.data.tags["resumed_in"] == second_parent.info.run_id
        assert resumed.data.tags["mlflow.parentRunId"] == first_parent.info.run_id != second_parent.info.run_id

    again = run_command([*sweep, "seed=1,2,3"], cwd=tmp_path, timeout=600)
    assert again.returncode == 0, stderr_tail(again)
    after = runs(uri)
    assert [(r.info.run_id, r.info.status) for r in parents()] == [  # the same parent run
        (first_parent.info.run_id, "KILLED"),
        (second_parent.info.run_id, "FINISHED"),
    ]
    finished = sorted(r.data.params["seed"] for r in after if r.info.status == "FINISHED" and "seed" in r.data.params)
    assert finished == ["1", "2", "3"] and {r.info.status for r in after} <= {"FINISHED", "KILLED"}  # none RUNNING


@pytest.mark.parametrize(
    "uri,message",
    [
        ("http://127.0.0.1:9", "tracking store 'http://127.0.0.1:9' is unreachable: ConnectionError on /health"),
        pytest.param("bogus://x", "tracking store 'bogus://x' is unusable: ", marks=pytest.mark.slow),
    ],
)
def test_unusable_tracking_store_is_one_line_before_any_work(
    uri: str, message: str, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """MLflow's own client would retry an unreachable server for minutes; the check answers in seconds. (The
    corpus's path is checked before: it must be there.)"""
    train = run_command(
        [NPLM_TRAIN, "experiment=kn3", f"data.path={tiny_brown_path}", f"tracking.uri={uri}"], cwd=tmp_path, timeout=120
    )
    report_args = [NPLM_REPORT, "--tracking-uri", uri, "--out", str(tmp_path / "reports")]
    report = run_command(report_args, cwd=tmp_path, timeout=120)
    for result, prog in ((train, "nplm-train"), (report, "nplm-report")):
        assert result.returncode == 2
        assert result.stderr.strip().splitlines()[-1].startswith(f"{prog}: error: {message}")
    assert not (tmp_path / "reports").exists() and not list(tmp_path.glob("outputs/*/*/checkpoints"))


@pytest.mark.slow  # over 10 s
def test_a_cache_that_is_a_file_is_one_line_and_no_run(brown_path: Path, tmp_path: Path) -> None:
    """NPLM_CACHE naming a file was a NotADirectoryError, an "unexpected error" with exit 1."""
    (tmp_path / "cache").write_text("not a directory")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cache = os.environ | {"NPLM_CACHE": str(tmp_path / "cache")}
    result = run_command(command(brown_path, uri), cwd=tmp_path, timeout=300, env=cache)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"nplm-train: error: cache directory {tmp_path / 'cache'} is not a directory: point NPLM_CACHE at a directory"
    )
    assert runs_if_any(uri) == []


def cache_refused(cache: Path, tiny_brown_path: Path, workdir: Path) -> str:
    """The error of a run whose $NPLM_CACHE is `cache`, after checking that it was one line, exit 2 and no store."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    train = [NPLM_TRAIN, f"data.path={tiny_brown_path}", "experiment=kn3", f"tracking.uri={uri}"]
    env = os.environ | {"NPLM_CACHE": str(cache)}
    result = run_command(train, cwd=workdir, timeout=300, env=env)
    assert result.returncode == 2 and not (workdir / "mlflow.db").exists()
    (line,) = result.stderr.strip().splitlines()
    return line


@pytest.mark.slow  # a command each (about 6 s): test_a_cache_that_is_a_file_is_one_line_and_no_run is the default suite's
def test_a_cache_that_cannot_be_created_is_one_line_and_no_store(tiny_brown_path: Path, tmp_path: Path) -> None:
    """NPLM_CACHE=/proc/... was a FileNotFoundError (exit 1) that never named NPLM_CACHE, after the store was made."""
    assert cache_refused(Path("/proc/nplm_cache"), tiny_brown_path, tmp_path) == (
        "nplm-train: error: cache directory /proc/nplm_cache/locks cannot be created (No such file or directory): "
        "point NPLM_CACHE at a writable directory"
    )


@pytest.mark.slow  # a command (about 6 s), like the test above
def test_a_read_only_cache_is_one_line_and_no_store(tiny_brown_path: Path, small_disk: Path) -> None:
    """Its lock files could not be written: a PermissionError or OSError (exit 1) once the store was made."""
    (small_disk / "cache" / "locks").mkdir(parents=True)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    assert cache_refused(small_disk / "cache", tiny_brown_path, small_disk.parent) == (
        f"nplm-train: error: cache directory {small_disk}/cache/locks is not writable: "
        "point NPLM_CACHE at a writable directory"
    )


@pytest.mark.slow
def test_a_mixed_row_whose_mlp_lost_its_scores_is_one_line_and_recovers(brown_path: Path, tmp_path: Path) -> None:
    """MLP4 mixes the kept scores of MLP3's finished run (and Del. Int.'s): scores.npz truncated, one line and exit 2;
    deleted with its Model's best.ckpt gone too, one line and exit 2 (each mixed run FAILED); deleted with the
    checkpoint back, the MLP is scored again from it, keeps its scores again, and the mixed row finishes."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"

    def train(*overrides: str) -> subprocess.CompletedProcess:
        return run_command(command(brown_path, uri, "trainer.max_epochs=1", *overrides), cwd=tmp_path, timeout=300)

    def row(experiment: str) -> subprocess.CompletedProcess:
        args = [NPLM_TRAIN, f"data.path={brown_path}", *SLICE, "seed=5", f"tracking.uri={uri}", experiment]
        return run_command(args, cwd=tmp_path, timeout=300)

    def mix() -> subprocess.CompletedProcess:
        return row("experiment=mlp4")

    assert train().returncode == 0
    (mlp,) = runs(uri)
    assert row("experiment=del_int").returncode == 0
    artifacts = next(tmp_path.glob(f"mlruns/*/{mlp.info.run_id}/artifacts"))
    scores = artifacts / "scores.npz"
    checkpoint = next(tmp_path.glob("mlruns/*/models/*/artifacts/artifacts/best.ckpt"))  # the weights, in its Model
    scores.write_bytes(scores.read_bytes()[:1000])
    truncated = mix()
    assert truncated.returncode == 2
    said = truncated.stderr.strip().splitlines()[-1]
    assert said.startswith(f"nplm-train: error: the kept scores of run {mlp.info.run_id} (scores.npz) are unreadable (")
    scores.unlink()
    data = checkpoint.read_bytes()
    checkpoint.unlink()
    lost = mix()
    assert lost.returncode == 2
    assert lost.stderr.strip().splitlines()[-1] == (
        f"nplm-train: error: run {mlp.info.run_id}, which this row mixes, kept no scores (scores.npz) and has no "
        "weights (Model or checkpoints/best.ckpt) to score it again: train its row again (rerun=true) so that the "
        "mixture finds the new run"
    )
    assert sorted(r.info.status for r in runs(uri)) == ["FAILED", "FAILED", "FINISHED", "FINISHED"]
    checkpoint.write_bytes(data)
    assert mix().returncode == 0
    assert scores.is_file()
    assert sorted(r.info.status for r in runs(uri)) == ["FAILED", "FAILED", "FINISHED", "FINISHED", "FINISHED"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB filesystem of its own (tmpfs), so that filling it fills nothing else."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    """Write zeros into `disk` until it has no byte left; the file that holds them (appended to, so that a second
    call takes up whatever was freed since the first)."""
    filler = disk / "filler"
    with filler.open("ab", buffering=0) as out:
        for chunk in (65536, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(bytes(chunk))
    return filler


@pytest.mark.slow
def test_a_disk_that_fills_up_during_a_run_is_one_line_and_the_next_run_recovers(
    brown_path: Path, small_disk: Path
) -> None:
    """The store, checkpoints and cache on a small disk that fills up once the run trains: the store cannot
    record the end, so the run stays RUNNING; after space is freed, the same command marks it KILLED and
    finishes."""
    uri = f"sqlite:///{small_disk}/mlflow.db"
    train = [*command(brown_path, uri, "trainer.max_epochs=2", f"hydra.run.dir={small_disk}/out")]
    env = os.environ | {"NPLM_CACHE": str(small_disk / "cache")}
    process = subprocess.Popen(
        train, cwd=small_disk.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    while process.poll() is None and not [r for r in runs_if_any(uri) if r.info.status == "RUNNING" and r.data.metrics]:
        time.sleep(
            0.2
        )  # training: its first metric is logged (a disk full as the run is created is exit 2, the store's)
    # kept full until the run exits: a run that fails removes what it had half-written, and the space that frees
    # would otherwise let the store record FAILED after all, or not, as the timing falls
    filler = fill(small_disk)
    stop = threading.Event()

    def keep_full() -> None:
        while not stop.wait(0.01):
            fill(small_disk)

    filling = threading.Thread(target=keep_full)
    filling.start()
    try:
        _, stderr = process.communicate(timeout=300)
    finally:
        stop.set()
        filling.join()
    assert process.returncode == 1, stderr[-3000:]
    assert re.fullmatch(
        r"nplm-train: error: .*(disk is full|No space left on device).*", stderr.strip().splitlines()[-1]
    )
    assert [r.info.status for r in runs(uri)] == ["RUNNING"]
    filler.unlink()
    again = run_command(train, cwd=small_disk.parent, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "left RUNNING by a process now gone: marked KILLED" in again.stdout
    assert sorted(r.info.status for r in runs(uri)) == ["FINISHED", "KILLED"]


@pytest.mark.slow
def test_paths_with_spaces_and_non_ascii_and_stale_lock_files_just_work(brown_path: Path, tmp_path: Path) -> None:
    """The corpus and the store in a folder named with a space and non-ASCII letters, and lock files left behind
    by a process long gone (beside the store and in the cache): the run finishes, and reads from there."""
    folder = tmp_path / "my data ünï"
    folder.mkdir()
    corpus = folder / "brown.zip"
    corpus.write_bytes(brown_path.read_bytes())
    (folder / "mlflow.db.lock").write_text("left behind")
    (tmp_path / "cache" / "locks").mkdir(parents=True)
    for name in ("run-0000000000000000.lock", "mlp-0000000000000000.lock"):
        (tmp_path / "cache" / "locks" / name).write_text("left behind")
    uri = f"sqlite:///{folder}/mlflow.db"
    train = [NPLM_TRAIN, f"data.path='{corpus}'", *SLICE, "experiment=kn3", f"tracking.uri='{uri}'"]
    env = os.environ | {"NPLM_CACHE": str(tmp_path / "cache")}
    result = run_command(train, cwd=tmp_path, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = runs(uri)
    assert run.info.status == "FINISHED" and run.data.tags["data_source"] == "brown.zip"


@pytest.mark.slow
def test_ctrl_c_while_the_corpus_is_read_is_exit_130_and_leaves_no_run(brown_path: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    train = [NPLM_TRAIN, f"data.path={brown_path}", "experiment=mlp3", f"tracking.uri={uri}"]
    process = subprocess.Popen(train, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if "torch threads" in line:  # logged just before the whole of Brown is read
            break
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130
    assert stderr.strip().splitlines()[-1] == STOPPED
    assert runs_if_any(uri) == []


@pytest.mark.slow
def test_a_read_only_store_is_one_line_for_training_and_still_reports(brown_path: Path, small_disk: Path) -> None:
    """A store on a filesystem mounted read-only (root ignores file permissions, so a mount it is): nplm-train
    stops with the database's own one line and exit 2, and nplm-report still reads the store."""
    uri = f"sqlite:///{small_disk}/mlflow.db"
    rows = [
        NPLM_TRAIN,
        f"data.path={brown_path}",
        *SLICE,
        f"tracking.uri={uri}",
        f"hydra.run.dir={small_disk.parent}/o",
    ]
    assert run_command([*rows, "experiment=kn3"], cwd=small_disk.parent).returncode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    result = run_command([*rows, "experiment=kn4"], cwd=small_disk.parent)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"nplm-train: error: tracking store '{uri}' is unusable: "
        "(sqlite3.OperationalError) attempt to write a readonly database"
    )
    out = small_disk.parent / "reports"
    report = [NPLM_REPORT, "--tracking-uri", uri, "--out", str(out)]
    assert run_command(report, cwd=small_disk.parent).returncode == 0
    assert "Kneser-Ney back-off" in (out / "brown_table1.md").read_text()


@pytest.mark.slow
def test_mlflow_tracking_uri_pointing_nowhere_is_one_line_before_any_work(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    env = os.environ | {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    train = [NPLM_TRAIN, "experiment=kn3", f"data.path={tiny_brown_path}"]
    result = run_command(train, cwd=tmp_path, timeout=120, env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "nplm-train: error: tracking store 'http://127.0.0.1:9' is unreachable: ConnectionError on /health"
    )


@pytest.mark.slow  # over 10 s
def test_a_mixed_row_before_its_rows_is_one_line_and_records_no_run(brown_path: Path, tmp_path: Path) -> None:
    """MLP4 mixes the runs of MLP3's and Del. Int.'s rows: with neither run yet, one line naming the first, exit 2."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mixed = [NPLM_TRAIN, f"data.path={brown_path}", *SLICE, f"tracking.uri={uri}", "experiment=mlp4", "seed=5"]
    result = run_command(mixed, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "nplm-train: error: model.components: no finished run of row 'MLP3' with seed 5 in study (none) on this data: "
        "run that row first (a mixed row comes after its rows)"
    )
    assert runs(uri) == []


def tiny_mlp(tiny_brown_path: Path, tmp_path: Path, *overrides: str) -> DictConfig:
    """A small MLP job on the tiny corpus, into tmp_path's store."""
    return composed(
        f"data.path={tiny_brown_path}",
        *data_slice(5_000, 1_000, 1_000),
        *("experiment=mlp3", "model.m=8", "trainer.enable_progress_bar=false"),
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        f"callbacks.model_checkpoint.dirpath={tmp_path}/c",
        *overrides,
    )


class SigtermAfterFirstBatch(L.Callback):
    """SIGTERM to this process once the first batch has trained."""

    def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
        if trainer.global_step == 1:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_lightning_alone_saw_still_ends_the_run_killed(
    tiny_brown_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the KeyboardInterrupt of nplm-train's SIGTERM handler is lost (raised inside a finalizer, which Python
    ignores), Lightning's own handler still saw the signal and stops the fit with its SIGTERMException, a SystemExit
    with no code: the run ends KILLED (resumable) and with no error, and the command would exit 130, not 0."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = tiny_mlp(tiny_brown_path, tmp_path, f"+callbacks.sigterm._target_={__name__}.SigtermAfterFirstBatch")
    lost = signal.signal(signal.SIGTERM, lambda *_: None)  # the handler whose KeyboardInterrupt was lost
    try:
        with pytest.raises(SystemExit) as stopped:
            ledger.run(cfg)
    finally:
        signal.signal(signal.SIGTERM, lost)
    assert interrupted(stopped.value)
    (run,) = runs(uri)
    assert run.info.status == "KILLED" and "error" not in run.data.tags


class CtrlCInAFinalizer(L.Callback):
    """Ctrl-C (SIGINT to this process) once the first batch has trained, while a finalizer runs: the KeyboardInterrupt
    raised there is printed as "Exception ignored" and dropped, as in SQLAlchemy's weakref callbacks (seen in
    test_rerun_true_..., whose run then trained to its end and exited 0)."""

    class Finalized:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # Python runs the handler between instructions, here inside __del__
                pass

    def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
        if trainer.global_step == 1:
            self.Finalized()


def test_a_ctrl_c_lost_in_a_finalizer_still_stops_the_run_killed(
    tiny_brown_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nplm-train's handler keeps the signal, and the fit stops at the next batch all the same: KILLED, no error."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(errors, "_signalled", None)  # and so back to none after this test
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = tiny_mlp(tiny_brown_path, tmp_path, f"+callbacks.ctrl_c._target_={__name__}.CtrlCInAFinalizer")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        errors.sigterm_interrupts()  # as nplm-train's job does
        with pytest.raises((KeyboardInterrupt, SystemExit)) as stopped:
            ledger.run(cfg)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert errors.interrupted(stopped.value)
    (run,) = runs(uri)
    assert run.info.status == "KILLED" and "error" not in run.data.tags
    assert MlflowClient(uri).get_metric_history(run.info.run_id, "valid_ppl_epoch") == []  # stopped in epoch 1


class ScriptedValidation(L.LightningModule):
    """One weight to train, and a validation perplexity read from a script, one value per epoch."""

    def __init__(self, script: list[float]) -> None:
        super().__init__()
        self.w, self.script = torch.nn.Parameter(torch.zeros(1)), script

    def training_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
        return (self.w - batch[0]).pow(2).mean()

    def validation_step(self, batch: list[torch.Tensor], _: int) -> None:
        self.log("valid_ppl_epoch", self.script[self.current_epoch])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_resume_point_is_the_last_epoch_even_when_it_was_not_the_best(tmp_path: Path) -> None:
    """With conf/callbacks/default.yaml's callbacks, last.ckpt holds the latest epoch and best.ckpt the best one.
    Lightning 2.6's own save_last wrote last.ckpt only with a new best: a killed run went back to its best epoch."""
    cfg = composed(f"callbacks.model_checkpoint.dirpath={tmp_path}", "trainer.enable_progress_bar=false")
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 1)), batch_size=2)
    trainer = L.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, callbacks=fit_callbacks(cfg))
    trainer.fit(ScriptedValidation([300.0, 310.0, 320.0]), data, data)
    epoch = {name: torch.load(tmp_path / name, weights_only=False)["epoch"] for name in ("best.ckpt", "last.ckpt")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt"]
    assert epoch == {"best.ckpt": 0, "last.ckpt": 2}


SEQUENCES = {  # small enough for seconds an epoch on Brown's slice, with dropout (and shuffled windows) to resume
    "lstm": ["experiment=lstm", "model.width=24", "model.layers=1"],
    "transformer": ["experiment=transformer", "model.width=24", "model.layers=1", "model.heads=2", "model.context=32"],
}


@pytest.mark.slow
@pytest.mark.parametrize("family,how", [("lstm", signal.SIGKILL), ("transformer", signal.SIGTERM)])
def test_a_stopped_sequence_model_resumes_and_ends_as_the_run_that_never_stopped(
    family: str, how: signal.Signals, brown_path: Path, tmp_path: Path
) -> None:
    """The LSTM and the Transformer draw dropout masks from torch's generator every step: a run resumed from epoch
    1's checkpoint must draw epoch 2's as the uninterrupted run did (the checkpoint keeps the generators' states),
    or its numbers differ. Every validation and the final perplexities are the uninterrupted run's, to float
    rounding."""
    overrides = [*SEQUENCES[family], "trainer.precision=32-true", "trainer.max_epochs=2", "optim.batch_size=8"]
    whole, stopped_dir = tmp_path / "whole", tmp_path / "stopped"
    whole.mkdir()
    stopped_dir.mkdir()
    reference_uri, uri = f"sqlite:///{whole}/mlflow.db", f"sqlite:///{stopped_dir}/mlflow.db"
    args = [NPLM_TRAIN, f"data.path={brown_path}", *SLICE, "seed=5", "trainer.enable_progress_bar=false", *overrides]
    reference = run_command([*args, f"tracking.uri={reference_uri}"], cwd=whole, timeout=600)
    assert reference.returncode == 0, stderr_tail(reference)
    stopped = stop_mid_second_epoch([*args, f"tracking.uri={uri}"], stopped_dir, uri, how)
    assert stopped.returncode in (-9, 130), stderr_tail(stopped)
    resumed = run_command([*args, f"tracking.uri={uri}"], cwd=stopped_dir, timeout=600)
    assert resumed.returncode == 0, stderr_tail(resumed)
    assert "resuming run" in resumed.stdout + resumed.stderr
    ((run,), (expected,)) = runs(uri), runs(reference_uri)
    client, reference_client = MlflowClient(uri), MlflowClient(reference_uri)
    ours = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "valid_ppl_epoch")}
    theirs = {m.step: m.value for m in reference_client.get_metric_history(expected.info.run_id, "valid_ppl_epoch")}
    assert ours == pytest.approx(theirs, rel=1e-6)
    for name in ("train_loss_epoch", "valid_ppl", "test_ppl"):
        assert run.data.metrics[name] == pytest.approx(expected.data.metrics[name], rel=1e-6), name
