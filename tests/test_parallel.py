"""The paper's §3.2, parameter-parallel training (trainer.strategy=parameter_parallel, models/parallel.py): M processes
that each own a block of eq. (1)'s output units train the model one process trains, as one ordinary run. Real
Hydra composition, real spawned processes (gloo), a real MLflow store, on tests/data/tiny_brown.zip."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import psutil
import pytest
from helpers import STACKS, check_loaded_model, composed, console_script, data_slice, ends_within, run_command
from lightning.pytorch.loggers import CSVLogger
from mlflow.tracking import MlflowClient

from nplm_repro.data.load import load_corpus
from nplm_repro.data.splits import Sizes
from nplm_repro.errors import NplmError
from nplm_repro.models.lightning_module import NPLMModule
from nplm_repro.models.training import train_neural
from nplm_repro.tracking.config_checks import check_config

SMALL = [*data_slice(6_000, 2_000, 2_000), "experiment=mlp1", "model.m=8", "model.h=10", "trainer.precision=32-true"]
SMALL += ["trainer.accelerator=cpu", "trainer.enable_progress_bar=false"]
BLOCKS = ["trainer.strategy=parameter_parallel", "trainer.devices=2"]
BLOCKS_VALUES = ("parameter_parallel", "2")  # as the run records them
SHARED = ["trainer.strategy=asynchronous", "trainer.devices=2"]
SHARED_LINES = ["asynchronous W=1", "asynchronous W=2", "asynchronous_locked W=1", "asynchronous_locked W=2"]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two processes need two cores")


@TWO_CORES
def test_each_parallel_strategy_trains_one_recorded_run_beside_one_process(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    """Same seed, same batches, direct connections on, 2 epochs, on one process and on two under each strategy: each
    arm is one MLflow run (not one per process), FINISHED with its epochs and fit seconds and its strategy recorded.
    Parameter-parallel: valid and test perplexities agree with one process's within 1e-4 relative (they differ only
    in the order of float sums); without direct connections: the next test. Lock-free asynchronous: its tag says a
    repeat is not bit-identical, its config_key is its own, and its perplexities are within 10% of one process's
    (the tiny corpus's epoch is 23 steps: the asynchronous noise is not what is measured here). Each two-process
    run's Model loads and answers in one process."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = [f"data.path={tiny_brown_path}", *SMALL, "trainer.max_epochs=2"]
    for arm in (BLOCKS, SHARED, []):
        done = run_command([console_script("nplm-train"), *common, *arm, f"tracking.uri={uri}"], cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("brown").experiment_id], order_by=["start_time ASC"])
    assert len(runs) == 3
    blocked, shared, one = runs
    assert (blocked.data.params["trainer.strategy"], blocked.data.params["trainer.devices"]) == BLOCKS_VALUES
    assert (shared.data.params["trainer.strategy"], shared.data.params["trainer.devices"]) == ("asynchronous", "2")
    assert "not bit-identical" in shared.data.tags["asynchronous"]
    assert "asynchronous" not in one.data.tags and "asynchronous" not in blocked.data.tags
    assert shared.data.tags["config_key"] != one.data.tags["config_key"]
    for split in ("valid", "test"):
        assert blocked.data.metrics[f"{split}_tokens"] == shared.data.metrics[f"{split}_tokens"] == 2_000
        assert one.data.metrics[f"{split}_tokens"] == 2_000
        assert blocked.data.metrics[f"{split}_ppl"] == pytest.approx(one.data.metrics[f"{split}_ppl"], rel=1e-4)
        assert shared.data.metrics[f"{split}_ppl"] == pytest.approx(one.data.metrics[f"{split}_ppl"], rel=0.1)
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.metrics["epochs"] == 2 and run.data.metrics["fit_seconds"] > 0
    for run in (blocked, shared):
        check_loaded_model(uri, run.info.run_id, "it was in the", tmp_path)


@TWO_CORES
def test_a_checkpoint_resumes_with_another_number_of_processes(tiny_brown_path: Path, tmp_path: Path) -> None:
    """Without direct connections (dL/dx then comes through the hidden layer alone), two processes train each epoch
    as one does, and checkpoints are whole: epoch 1 on two processes then epoch 2 on one, and epoch 1 on one then
    epoch 2 on two, end where two epochs on one end. Trained as a job trains (`train_neural`), seeded as a job is."""
    base = [f"data.path={tiny_brown_path}", *SMALL, "model.direct=false", "callbacks.early_stopping.patience=5"]
    corpus = load_corpus(composed(*base).data)

    def fit(arm: list[str], epochs: int, name: str, resume: Path | None = None) -> tuple[dict[str, float], Path]:
        folder = tmp_path / name
        cfg = composed(*base, *arm, f"trainer.max_epochs={epochs}", f"callbacks.model_checkpoint.dirpath={folder}")
        L.seed_everything(cfg.seed, workers=True)  # as a job is seeded (tracking/ledger.py)
        metrics, _ = train_neural(cfg, corpus, CSVLogger(tmp_path, name=name), resume_from=resume)
        return metrics, folder / "last.ckpt"

    whole, _ = fit([], 2, "whole")
    _, two_first = fit(BLOCKS, 1, "two_first")
    _, one_first = fit([], 1, "one_first")
    ends = {"two, then one": fit([], 2, "then_one", resume=two_first)[0]}
    ends["one, then two"] = fit(BLOCKS, 2, "then_two", resume=one_first)[0]
    for name, end in ends.items():
        assert end["epochs"] == 2
        for split in ("valid", "test"):
            assert end[f"{split}_ppl"] == pytest.approx(whole[f"{split}_ppl"], rel=1e-4), (name, split)


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["optim=sampled", "trainer.devices=1"], "trains the exact softmax (optim=fast or paper)"),
        (["model.output=classes"], "model.output=classes has no such layer"),
        (["trainer.precision=bf16-mixed"], "trains in float32: trainer.precision=bf16-mixed"),
        (["trainer.devices=4096"], "trainer.devices=4096 and threads=1 needs 4096 cores"),
        (["trainer.devices=1", "threads=4096"], "needs 4096 cores (one process a core at least)"),
        (["experiment=lstm"], "trainer.strategy='parameter_parallel' is invalid: expected auto or ddp_spawn"),
    ],
)
def test_what_parameter_parallel_training_cannot_train_is_refused(overrides: list[str], error: str) -> None:
    with pytest.raises(NplmError, match=re.escape(error)):
        check_config(composed(*BLOCKS, *overrides, "trainer.accelerator=cpu"))


def test_more_processes_than_words_is_refused() -> None:
    cfg = composed("trainer.strategy=parameter_parallel", "trainer.devices=3")
    with pytest.raises(NplmError, match="trainer.devices=3: more processes than the 2 words of the training split"):
        NPLMModule.check_sizes(cfg, Sizes(train=10, words=2, read=True))
    NPLMModule.check_sizes(cfg, Sizes(train=10, words=3, read=True))


def test_a_refused_parallel_run_is_one_line_and_writes_no_store(tiny_brown_path: Path, tmp_path: Path) -> None:
    command = [console_script("nplm-train"), f"data.path={tiny_brown_path}", *BLOCKS, "model.output=classes"]
    done = run_command([*command, f"tracking.uri=sqlite:///{tmp_path}/m.db"], cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "has no such layer" in lines[0], done.stderr[-2000:]
    assert not (tmp_path / "m.db").exists()


@TWO_CORES
@pytest.mark.parametrize("strategy", ["parameter_parallel", "asynchronous"])
def test_a_process_that_dies_mid_epoch_ends_the_run_failed_naming_it(
    strategy: str, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """SIGKILL to one of the two processes once an epoch has been validated: the job ends within 60 s (no process
    waits forever on a collective, or on the shared weights), its last line names the process, and its run is
    FAILED."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = [f"data.path={tiny_brown_path}", *SMALL, "trainer.max_epochs=500", "callbacks.early_stopping.patience=500"]
    log = tmp_path / "train.log"
    with log.open("w") as out:
        job = subprocess.Popen(
            [
                console_script("nplm-train"),
                *common,
                f"trainer.strategy={strategy}",
                "trainer.devices=2",
                f"tracking.uri={uri}",
            ],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **STACKS},
        )
    client = MlflowClient(uri)
    while not (tmp_path / "mlflow.db").exists() or not validated(client):
        assert job.poll() is None, log.read_text()[-3000:]
        time.sleep(0.5)
    spawned = [p for p in psutil.Process(job.pid).children() if "spawn_main" in " ".join(p.cmdline())]
    assert len(spawned) == 2
    spawned[0].kill()  # which rank it is, its start time cannot tell: both start within one clock tick
    assert ends_within(job, 60, log) != 0
    assert re.search(r"process [01] terminated with signal SIGKILL", log.read_text().strip().splitlines()[-1])
    (run,) = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
    assert run.info.status == "FAILED"


def validated(client: MlflowClient) -> bool:
    """Whether the store's run has logged a validation perplexity (an epoch has been trained)."""
    experiment = client.get_experiment_by_name("brown")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return bool(runs) and "valid_ppl_epoch" in runs[0].data.metrics


@TWO_CORES
def test_the_bench_times_the_blocks_on_one_and_two_processes(tiny_brown_path: Path, tmp_path: Path) -> None:
    """nplm-bench's parallel lines: tokens/s on M = 1 and 2 processes, the speed-up over M = 1, and the share of a step
    in collectives, which two processes cannot do without; the asynchronous lines, lock-free and locked, on W = 1
    and 2, with the share of time waiting for the lock; and the projection script's table and figure from them."""
    bench = [console_script("nplm-bench"), f"data.path={tiny_brown_path}", *SMALL, "bench.what=[parallel]"]
    done = run_command([*bench, "bench.min_seconds=0.2", "bench.repeats=1", "bench.warmup=1"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line["what"]: line for line in map(json.loads, done.stdout.strip().splitlines())}
    assert list(lines) == ["parallel M=1", "parallel M=2", "allreduce M=2", *SHARED_LINES]
    one, two, allreduce = (lines[what] for what in ("parallel M=1", "parallel M=2", "allreduce M=2"))
    free_one, free_two, locked_one, locked_two = (lines[what] for what in SHARED_LINES)
    assert free_one["x_W1"] == 1 and locked_two["x_W1"] == pytest.approx(
        locked_two["tokens_per_s"] / free_one["tokens_per_s"], rel=1e-2
    )
    assert all(line["tokens_per_s"] > 0 for line in (free_two, locked_one, locked_two))
    assert 0 < locked_two["lock_wait_share"] < 1 and "lock_wait_share" not in free_two
    assert allreduce["latency_us"] > 0 and allreduce["bandwidth_gb_per_s"] > 0 and len(allreduce["us"]) == 5
    assert one["x_M1"] == 1 and two["x_M1"] == pytest.approx(two["tokens_per_s"] / one["tokens_per_s"], rel=1e-2)
    assert (one["processes"], two["processes"], two["threads"]) == (1, 2, 1)
    assert all(line["tokens_per_s"] > 0 and 0 <= line["communication_share"] < 1 for line in (one, two))
    assert two["communication_share"] > 0 and 0 < one["output_share"] < 1
    (tmp_path / "bench.jsonl").write_text(done.stdout)
    figure = tmp_path / "projection.svg"
    script = [sys.executable, str(SCRIPTS / "parallel_projection.py"), str(tmp_path / "bench.jsonl")]
    projected = run_command([*script, "--figure", str(figure)], cwd=tmp_path)
    assert projected.returncode == 0, projected.stderr
    table = projected.stdout.strip().splitlines()
    names = [row.split(" | ")[0] for row in table[2:]]
    assert names[0] == r"| measured row (\|V\| = 384, h = 10), from the Allreduces" and len(names) in (2, 4)
    assert names[len(names) // 2] == r"| AP network (\|V\| = 17,964), from the Allreduces"
    assert all(row.split(" | ")[1] == "1.00 (0%)" for row in table[2:])  # one process: all of it, no communication
    assert figure.read_text().startswith("<?xml")
    (tmp_path / "empty.jsonl").write_text("")
    refused = run_command(
        [sys.executable, str(SCRIPTS / "parallel_projection.py"), str(tmp_path / "empty.jsonl")], cwd=tmp_path
    )
    assert refused.returncode == 2 and "has no 'parallel M=1' and 'allreduce M=2' lines" in refused.stderr
    (tmp_path / "log.txt").write_text("Epoch 0: 100%\n")
    garbled = run_command([sys.executable, str(SCRIPTS / "parallel_projection.py"), "log.txt"], cwd=tmp_path)
    assert (
        garbled.returncode == 2
        and garbled.stderr.count("\n") == 1
        and "is not nplm-bench's JSON lines" in garbled.stderr
    )
