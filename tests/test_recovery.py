"""Interrupted and failing runs, with real processes and a real MLflow store: nothing is lost, nothing lies.

A run is stopped by SIGKILL, SIGTERM or Ctrl-C (SIGINT) after its first epoch's checkpoint; the same command
continues it in the same MLflow run and ends where an uninterrupted run of the same seed ends.
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient

from nplm_repro.report import build

SLICE = ["data.split.train=60000", "data.split.valid=5000", "data.split.test=5000"]
SMALL = [*SLICE, "+experiment=mlp3", "model.m=8", "trainer.max_epochs=3", "seed=5", "trainer.enable_progress_bar=false"]
NPLM_TRAIN = str(Path(sys.executable).parent / "nplm-train")


def command(brown_path: Path, uri: str, *overrides: str) -> list[str]:
    return [NPLM_TRAIN, f"data.path={brown_path}", *SMALL, f"tracking.uri={uri}", *overrides]


def runs(uri: str, experiment: str = "brown") -> list[mlflow.entities.Run]:
    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


@pytest.fixture(scope="module")
def uninterrupted(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    uri = f"sqlite:///{workdir}/mlflow.db"
    result = subprocess.run(command(brown_path, uri), cwd=workdir, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = runs(uri)
    return run.data.metrics


def stderr_tail(result: subprocess.CompletedProcess) -> str:
    return result.stderr[-3000:]


def stop_after_first_checkpoint(args: list[str], workdir: Path, how: signal.Signals) -> subprocess.CompletedProcess:
    """Start the command; once epoch 1's last.ckpt exists, send `how` (training is then in epoch 2)."""
    process = subprocess.Popen(args, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(workdir.glob("outputs/*/*/checkpoints/last.ckpt")):
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.02)
    process.send_signal(how)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


@pytest.mark.parametrize(
    "how,status,exit_code",
    [
        (signal.SIGKILL, "RUNNING", -9),
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
    stopped = stop_after_first_checkpoint(command(brown_path, uri), tmp_path, how)
    assert stopped.returncode == exit_code, stderr_tail(stopped)
    if how != signal.SIGKILL:
        assert stopped.stderr.strip().splitlines()[-1] == "nplm-train: interrupted (a run being recorded is now KILLED)"
    (run,) = runs(uri)
    assert run.info.status == status  # kill -9 gives no chance to mark it: RUNNING, with its process gone
    client = MlflowClient(uri)
    epochs_before = len(client.get_metric_history(run.info.run_id, "valid_ppl_epoch"))
    assert 1 <= epochs_before < 3
    last = Path(run.data.tags["checkpoint_dir"]) / "last.ckpt"
    assert torch.load(last, weights_only=False)["epoch"] == epochs_before - 1  # usable: written atomically
    assert not [p for p in last.parent.iterdir() if p.suffix != ".ckpt"]  # no half-written temporary left

    resumed = subprocess.run(command(brown_path, uri), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming run {run.info.run_id} from {last}" in resumed.stdout + resumed.stderr
    (after,) = runs(uri)  # the same run, not a second one
    assert after.info.run_id == run.info.run_id and after.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "valid_ppl_epoch")
    assert len({m.step for m in history}) == len(history) == 3  # each epoch once, none lost or repeated
    for split in ("train", "valid", "test"):
        ours, reference = after.data.metrics[f"{split}_ppl"], uninterrupted[f"{split}_ppl"]
        assert abs(ours / reference - 1) < 0.01, (split, ours, reference)


@pytest.mark.slow
def test_rerun_true_starts_afresh_instead_of_resuming(brown_path: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    stopped = stop_after_first_checkpoint(command(brown_path, uri), tmp_path, signal.SIGINT)
    assert stopped.returncode == 130, stderr_tail(stopped)
    fresh = subprocess.run(
        command(brown_path, uri, "rerun=true", "trainer.max_epochs=1"), cwd=tmp_path, capture_output=True, text=True
    )
    assert fresh.returncode == 0, stderr_tail(fresh)
    assert "resuming" not in fresh.stderr
    assert sorted(r.info.status for r in runs(uri)) == ["FINISHED", "KILLED"]


@pytest.mark.slow
def test_diverging_job_fails_with_its_error_and_the_sweep_completes(brown_path: Path, tmp_path: Path) -> None:
    """MLP3 with a huge learning rate reaches a NaN loss; the Kneser-Ney job beside it finishes."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweep = [NPLM_TRAIN, "-cd", str(Path(__file__).resolve().parents[1] / "sweeps"), "-cn", "brown_table1"]
    sweep += [f"data.path={brown_path}", *SLICE, "+experiment=mlp3,kn3", "optim.lr=10", f"tracking.uri={uri}"]
    result = subprocess.run(sweep, cwd=tmp_path, capture_output=True, text=True, timeout=600)
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


@pytest.mark.parametrize(
    "uri,message",
    [
        ("http://127.0.0.1:9", "tracking store 'http://127.0.0.1:9' is unreachable: ConnectionError on /health"),
        ("bogus://x", "tracking store 'bogus://x' is unusable: "),
    ],
)
def test_unusable_tracking_store_is_one_line_before_any_work(uri: str, message: str, tmp_path: Path) -> None:
    """MLflow's own client would retry an unreachable server for minutes; the check answers in seconds."""
    train = subprocess.run([NPLM_TRAIN, "+experiment=kn3", f"tracking.uri={uri}"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    report = subprocess.run([str(Path(sys.executable).parent / "nplm-report"), "--tracking-uri", uri, "--out",
                             str(tmp_path / "reports")], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    for result, prog in ((train, "nplm-train"), (report, "nplm-report")):
        assert result.returncode == 2
        assert result.stderr.strip().splitlines()[-1].startswith(f"{prog}: error: {message}")
    assert not (tmp_path / "reports").exists() and not list(tmp_path.glob("outputs/*/*/checkpoints"))
