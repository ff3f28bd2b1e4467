"""The paper's §3.1, asynchronous training in shared memory (trainer.strategy=asynchronous and asynchronous_locked,
models/asynchronous.py): W processes update one set of weights, as one ordinary run. Real Hydra composition, real
spawned processes, on tests/data/tiny_brown.zip. A lock-free job's MLflow run beside one process's:
tests/test_parallel.py, with the parameter-parallel one."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import composed, console_script, data_slice, run_command
from lightning.pytorch.loggers import CSVLogger

from nplm_repro.data.load import load_corpus
from nplm_repro.errors import NplmError
from nplm_repro.models.training import train_neural
from nplm_repro.tracking.config_checks import check_config

SMALL = [*data_slice(6_000, 2_000, 2_000), "experiment=mlp1", "model.m=8", "model.h=10", "trainer.precision=32-true"]
SMALL += ["trainer.accelerator=cpu", "trainer.enable_progress_bar=false"]
TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two processes need two cores")


class Weights(L.Callback):
    """Each process's sum of its weights (float64) when its training starts and ends, and whether they are in shared
    memory: `folder`/<rank>.json."""

    def __init__(self, folder: str) -> None:
        self.folder, self.seen = Path(folder), {}

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.seen["start"] = sum(p.detach().double().sum().item() for p in module.parameters())

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.seen["end"] = sum(p.detach().double().sum().item() for p in module.parameters())
        self.seen["shared"] = all(p.is_shared() for p in module.parameters())
        (self.folder / f"{trainer.global_rank}.json").write_text(json.dumps(self.seen))


@TWO_CORES
def test_the_processes_share_their_weights_and_a_checkpoint_resumes_into_them(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    """Locked, after one epoch on one process: each of the two processes starts from the checkpoint's weights, trains,
    and ends holding the same weights as the other, in shared memory (two processes with weights of their own, each
    trained on its half, would end apart)."""
    base = [f"data.path={tiny_brown_path}", *SMALL, "callbacks.early_stopping.patience=5"]
    corpus = load_corpus(composed(*base).data)

    def fit(arm: list[str], epochs: int, name: str, resume: Path | None = None) -> tuple[dict[str, float], Path]:
        folder = tmp_path / name
        probe = [f"+callbacks.weights._target_={__name__}.Weights", f"+callbacks.weights.folder={folder}"]
        cfg = composed(
            *base, *arm, *probe, f"trainer.max_epochs={epochs}", f"callbacks.model_checkpoint.dirpath={folder}"
        )
        folder.mkdir()
        L.seed_everything(cfg.seed, workers=True)  # as a job is seeded (tracking/ledger.py)
        metrics, _ = train_neural(cfg, corpus, CSVLogger(tmp_path, name=name), resume_from=resume)
        return metrics, folder

    _, first = fit([], 1, "first")
    saved = torch.load(first / "last.ckpt", weights_only=False)
    at_one = sum(w.double().sum().item() for k, w in saved["state_dict"].items() if k.startswith("model."))
    metrics, then = fit(
        ["trainer.strategy=asynchronous_locked", "trainer.devices=2"], 2, "then", resume=first / "last.ckpt"
    )
    ranks = [json.loads((then / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert metrics["epochs"] == 2
    for seen in ranks:
        assert seen["start"] == pytest.approx(at_one, rel=1e-12) and seen["shared"]
    assert ranks[0]["end"] == ranks[1]["end"] != ranks[0]["start"]


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["optim=sampled", "trainer.devices=1"], "a count of steps each process keeps of its own"),
        (["optim=sampled", "trainer.devices=2"], "trainer.devices=2 is invalid: expected 1"),
        (["trainer.accelerator=gpu"], "shares the weights in a CPU's memory: set trainer.accelerator=cpu"),
        (["trainer.devices=4096"], "trainer.devices=4096 and threads=1 needs 4096 cores"),
        (["experiment=lstm"], "trainer.strategy='asynchronous' is invalid: expected auto or ddp_spawn"),
    ],
)
def test_what_asynchronous_training_cannot_train_is_refused(overrides: list[str], error: str) -> None:
    with pytest.raises(NplmError, match=re.escape(error)):
        check_config(composed("trainer.strategy=asynchronous", "trainer.accelerator=cpu", *overrides))


@pytest.mark.parametrize("strategy", ["asynchronous", "parameter_parallel"])
def test_a_parallel_strategy_under_torchrun_is_refused(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun each process would run the whole job (its own MLflow run); the strategies spawn their own."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "1")  # what torchrun sets in each process it starts
    with pytest.raises(NplmError, match="spawns its processes from the job's one process; under torchrun"):
        check_config(composed(f"trainer.strategy={strategy}", "trainer.devices=1", "trainer.accelerator=cpu"))


def test_a_refused_asynchronous_run_is_one_line_and_writes_no_store(tiny_brown_path: Path, tmp_path: Path) -> None:
    command = [console_script("nplm-train"), f"data.path={tiny_brown_path}", "trainer.strategy=asynchronous_locked"]
    done = run_command([*command, "trainer.devices=4096", f"tracking.uri=sqlite:///{tmp_path}/m.db"], cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "needs 4096 cores" in lines[0], done.stderr[-2000:]
    assert not (tmp_path / "m.db").exists()
