"""§3.1 of the paper, asynchronous data-parallel training in shared memory: `trainer.strategy=asynchronous
trainer.devices=W` (no locks) or `trainer.strategy=asynchronous_locked` (each update under one lock).

The W processes share one copy of the weights (shared memory). Each trains on its own part of every epoch's shuffle,
computes its gradients from the weights as it reads them, and writes its update into the shared weights at once,
without waiting for the others and, lock-free, without a lock: an update may read weights another process is
writing, and some updates are overwritten. This is the paper's "asynchronous" training, later called Hogwild!. The
locked variant holds one lock from the start of each update to its end (the gradients are still computed from the
weights as read, without it): the paper's "first version used locks and was extremely slow".

Each process takes its own steps of B words at the rate of one process (the rate is not multiplied by W as DDP's
averaged W x B batch is). Validation waits for every process to end its part of the epoch, so each scores the
whole validation split with the same weights; the rate's drop, early stopping and checkpoints are as under DDP.
The updates interleave as the operating system schedules the processes, so a repeated or resumed run is not
bit-identical: the run says so in its tag `asynchronous`. The exact softmax only (optim=fast or paper): the sampled
recipe's optimiser decays each word's row when a step reads it, from a count of steps each process keeps of its own
(models/sampled_loss.py `SparseSGD`), which shared rows would make wrong. On a CPU only: the processes share the
machine's memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.trainer import Trainer
from torch import nn

from nplm_repro.errors import NplmError
from nplm_repro.models.outputs import training_of
from nplm_repro.models.parallel import check_processes

LOCK_FREE, LOCKED = "asynchronous", "asynchronous_locked"
STRATEGIES = (LOCK_FREE, LOCKED)


class Asynchronous(DDPStrategy):
    """W spawned processes, one set of weights in shared memory, no gradient averaging (module doc). Its process
    group serves validation, early stopping and the checkpoint, as DDP's does."""

    batches_a_step = 1  # each process steps on its own batch

    def __init__(self, locked: bool = False, **kwargs: Any) -> None:
        super().__init__(start_method="spawn", **kwargs)
        self.lock = mp.get_context("spawn").Lock() if locked else None
        self.shared: list[torch.Tensor] = []

    def _configure_launcher(self) -> None:
        if self.cluster_environment.creates_processes_externally:
            raise NplmError(
                f"trainer.strategy={LOCKED if self.lock else LOCK_FREE} spawns its processes on one machine, to share "
                f"its weights in memory: it cannot run under torchrun or SLURM, whose processes exist already"
            )
        self._launcher = _SharingLauncher(self, start_method="spawn")

    def setup(self, trainer: Trainer) -> None:
        """Each process's weights are the shared ones; a resumed run's, which every process has read from the
        checkpoint into its own copy, are first written into them by process 0."""
        weights = list(self.lightning_module.parameters())
        if self.global_rank == 0:
            with torch.no_grad():
                for weight, shared in zip(weights, self.shared):
                    shared.copy_(weight)
        self.barrier("shared weights")
        for weight, shared in zip(weights, self.shared):
            weight.data = shared
        super().setup(trainer)

    def on_validation_start(self) -> None:
        """No process validates while another still updates: every process scores the same weights, and the
        checkpoint after it is of them (Lightning's checkpoint save ends in a barrier of its own)."""
        self.barrier("validation")
        super().on_validation_start()

    def _setup_model(self, model: nn.Module) -> nn.Module:
        return model  # no DistributedDataParallel: nothing averages the gradients

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        """Lock-free, the step as on one process. Locked, the update under the lock: the optimiser runs `closure`
        (forward and backward) first, unlocked, then updates the weights."""
        if self.lock is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        held = []

        def computed_then_locked() -> Any:
            result = closure()
            self.lock.acquire()
            held.append(True)
            return result

        try:
            return super().optimizer_step(optimizer, computed_then_locked, model, **kwargs)
        finally:
            if held:
                self.lock.release()


class _SharingLauncher(_MultiProcessingLauncher):
    """ddp_spawn's launcher, which first moves the module's weights into shared memory and hands them to the
    processes beside the module: Lightning gives each spawned CPU process its own copy of the module's weights."""

    def launch(self, function: Callable, *args: Any, trainer: Trainer | None = None, **kwargs: Any) -> Any:
        assert trainer is not None, "asynchronous training launches a Trainer's fit"
        module = trainer.lightning_module
        module.share_memory()
        self._strategy.shared = [weight.data for weight in module.parameters()]
        return super().launch(function, *args, trainer=trainer, **kwargs)


StrategyRegistry.register(LOCK_FREE, Asynchronous, description="the paper's §3.1: shared weights, lock-free updates")
StrategyRegistry.register(
    LOCKED, Asynchronous, description="the paper's §3.1 first version: shared weights, each update locked", locked=True
)


def tags(cfg: Any) -> dict[str, str]:
    """What an asynchronous run says of itself: that it cannot be repeated bit for bit."""
    if cfg.trainer.get("strategy") not in STRATEGIES:
        return {}
    return {"asynchronous": "updates interleave as the processes are scheduled: a repeat is not bit-identical"}


def check(cfg: Any) -> None:
    """What trainer.strategy=asynchronous(_locked) trains: eq. (1)'s exact softmax on a CPU, at most one process a
    core (NplmError otherwise)."""
    said = f"trainer.strategy={cfg.trainer.strategy}"
    if training_of(cfg.optim).sampled:
        raise NplmError(
            f"{said} trains the exact softmax (optim=fast or paper): the sampled recipe's optimiser decays a word's "
            f"row from a count of steps each process keeps of its own, which shared rows would make wrong"
        )
    if cfg.trainer.accelerator not in ("cpu", "auto") or (
        cfg.trainer.accelerator == "auto" and torch.cuda.is_available()
    ):
        raise NplmError(f"{said} shares the weights in a CPU's memory: set trainer.accelerator=cpu")
    check_processes(cfg, said)
