"""Beyond one process: a real `mlflow server` over HTTP (SQLite, and PostgreSQL where it is installed), the SLURM
launcher's resources as config, and DDP."""

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from helpers import SLICE, SWEEPS, composed_study, console_script, data_slice, free_port, run_command
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from nplm_repro.serving.served import model_of

TINY_MLP = ["trainer.max_epochs=1", "trainer.limit_train_batches=5", "trainer.enable_progress_bar=false"]


@contextlib.contextmanager
def mlflow_server(backend: str, artifacts: Path) -> Iterator[str]:
    """`mlflow server` as a team runs it (one worker here), on 127.0.0.1; yields its URI once /health answers."""
    port = free_port()
    command = [console_script("mlflow"), "server", "--backend-store-uri", backend]
    command += ["--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    log = open(artifacts.parent / "server.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (artifacts.parent / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not answer /health in 180 s"
            with contextlib.suppress(requests.ConnectionError):
                if requests.get(f"{uri}/health", timeout=5).ok:
                    break
            time.sleep(0.5)
        yield uri
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster (initdb, pg_ctl) on 127.0.0.1; as root it runs as the `postgres` user."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *map(str, sorted(Path("/usr/lib/postgresql").glob("*/bin")))])
    initdb, pg_ctl = shutil.which("initdb", path=path), shutil.which("pg_ctl", path=path)  # Debian keeps them off PATH
    if not (initdb and pg_ctl and importlib.util.find_spec("psycopg")):
        pytest.skip("PostgreSQL (initdb, pg_ctl) or psycopg is not installed")
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    home = Path(tempfile.mkdtemp(prefix="nplm-pg-"))
    if as_user:
        shutil.chown(home, "postgres")
    port, data = free_port(), home / "data"
    subprocess.run([*as_user, initdb, "-D", str(data), "-U", "nplm", "--auth=trust"], check=True, capture_output=True)
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1"
    start = [*as_user, pg_ctl, "-D", str(data), "-o", options, "-l", str(home / "log"), "-w", "start"]
    subprocess.run(start, check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://nplm@127.0.0.1:{port}/postgres"  # the driver named, not SQLAlchemy's default
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_sweep_and_report_through_a_real_mlflow_server(backend: str, brown_path: Path, tmp_path: Path) -> None:
    """A sweep (a tiny MLP3, Del. Int., and MLP4 mixing the two) logs over HTTP, checkpoints go to the server's
    artifact store, the mixture reads its rows' kept scores back from it, and `nplm-report` rebuilds the sweep's own report from it."""
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(postgres()) if backend == "postgresql" else f"sqlite:///{tmp_path}/server.db"
        (tmp_path / "artifacts").mkdir()
        uri = stack.enter_context(mlflow_server(store, tmp_path / "artifacts"))
        sweep = [
            console_script("nplm-train"),
            "-cd",
            str(SWEEPS),
            "-cn",
            "brown_table1",
            "experiment=mlp3,del_int,mlp4",
        ]
        sweep += [f"data.path={brown_path}", *SLICE, *TINY_MLP, f"tracking.uri={uri}"]
        result = run_command(sweep, cwd=tmp_path, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
        rows = sorted(r.data.tags.get("row", "parent") for r in runs)
        assert rows == ["Del. Int.", "MLP3", "MLP4", "parent"]
        assert all(r.info.status == "FINISHED" for r in runs)
        mlp3 = next(r for r in runs if r.data.tags.get("row") == "MLP3")
        assert model_of(client, mlp3.info.run_id) is not None
        assert list((tmp_path / "artifacts").rglob("best.ckpt"))  # stored by the server, not by the job
        report = [console_script("nplm-report"), "--study", "brown_table1", "--tracking-uri", uri, "--out", "again"]
        again = run_command(report, cwd=tmp_path, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
    for name in ("brown_table1.md", "brown_table1.csv"):
        assert (tmp_path / "again" / name).read_text() == (tmp_path / "reports" / name).read_text()


def test_slurm_launcher_takes_partition_time_cpus_gpus_and_memory_from_config() -> None:
    """A sweep composed with `hydra/launcher=slurm` (hydra-submitit-launcher's SLURM executor), as "Scaling up" runs
    it, without submitting: the resources are config values, conf/hydra/launcher/slurm.yaml's until the command
    line sets them, and the sweep (its jobs, its MLflow callback) is the one the local launcher runs."""
    resources = ("partition", "timeout_min", "cpus_per_task", "gpus_per_node", "mem_gb")

    def hydra_of(*overrides: str) -> DictConfig:
        return composed_study("ap_table2", *overrides).hydra

    slurm = hydra_of("hydra/launcher=slurm")
    assert slurm.launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert [slurm.launcher[k] for k in resources] == [None, 240, 4, 0, 16]
    values = ["cpu", 30, 2, 1, 8]
    cli = [f"hydra.launcher.{k}={v}" for k, v in zip(resources, values)]
    assert [hydra_of("hydra/launcher=slurm", *cli).launcher[k] for k in resources] == values
    local = hydra_of()
    assert local.launcher._target_.endswith("JoblibLauncher")
    assert slurm.sweeper == local.sweeper and slurm.callbacks == local.callbacks and slurm.mode == local.mode


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_trains_as_one_process_with_their_batches_together(
    brown_path: Path, tmp_path: Path
) -> None:
    """2 processes x 256 words per step (ddp_spawn, gloo) against 1 process x 512: the same windows per step
    and the same per-word learning rate, so the same model up to float rounding."""
    common = [f"data.path={brown_path}", *data_slice(20_480, 4_000, 4_000)]
    common += ["experiment=mlp3", "model.m=8", "trainer.max_epochs=2", "trainer.enable_progress_bar=false"]
    common += ["trainer.accelerator=cpu", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    ddp = ["trainer.strategy=ddp_spawn", "trainer.devices=2", "optim.batch_size=256", "threads=1"]
    for variant in (ddp, ["optim.batch_size=512"]):
        result = run_command([console_script("nplm-train"), *common, *variant], cwd=tmp_path, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("brown").experiment_id], order_by=["start_time ASC"])
    two, one = (r.data for r in runs)
    assert (two.params["trainer.devices"], one.params["trainer.devices"]) == ("2", "1")
    assert two.metrics["epochs"] == 2 and two.metrics["fit_seconds"] > 0  # handed back by the spawned processes
    for split in ("train", "valid", "test"):
        assert two.metrics[f"{split}_tokens"] == one.metrics[f"{split}_tokens"]  # every token scored once
        assert abs(two.metrics[f"{split}_ppl"] / one.metrics[f"{split}_ppl"] - 1) < 0.005, split
