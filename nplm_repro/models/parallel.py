"""§3.2 of the paper, parameter-parallel training of eq. (1): `trainer.strategy=parameter_parallel trainer.devices=M`.

Each of the M processes owns the output units of one block of words, ceil(|V| / M) of them (the last block may be
shorter): the rows of U, W and b for those words (DTensor's Shard(0), so block i starts at i * ceil(|V| / M), the
paper's start_i). Every process keeps the same C, H and d, reads the same batch, repeats the cheap word-feature and
hidden-layer work, and computes the scores y of its own block only. The softmax over the blocks is torch's
`loss_parallel`: an Allreduce of each row's largest score and one of its normaliser S. In the backward pass DTensor
sums what each block sends back to the hidden layer and the features, dL/da (and dL/dx with direct connections): one
Allreduce each. So a process computes and stores 1/M of the output layer, the part where a Brown MLP spends most of
its multiply-adds, and the model is eq. (1) trained as on one process, up to the order of float sums.

This is Lightning's ModelParallelStrategy (torch's tensor parallelism on a one-dimensional mesh, gloo on a CPU, NCCL
on GPUs). Its processes are spawned, as ddp_spawn's are, so the job (its MLflow run, its lock) stays in the process
that started it; the strategy's own launcher would run the whole command again in each process. Under torchrun or
several SLURM tasks each process would run the whole job, so that is refused (`check_processes`). Checkpoints are
whole (rank 0 gathers the blocks): a run resumes with any M, or with none, and its best checkpoint is scored on one
process like any run's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.trainer import Trainer
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn import functional as F

from nplm_repro.data.splits import Sizes
from nplm_repro.errors import NplmError
from nplm_repro.models.outputs import Head, OutputLayer, training_of

STRATEGY = "parameter_parallel"
MESH = "tensor_parallel"  # the strategy's mesh dimension that holds the blocks (its data-parallel dimension is 1)
BLOCKED = ("U", "W", "b")  # eq. (1)'s weights with a row per output word
# an optimiser group's entries that say how it computes, not what: the blocks' own (no fused step on blocks)
HOW = ("params", "fused", "foreach", "capturable", "differentiable")


class ParameterParallel(ModelParallelStrategy):
    """Every process of the job in one block-parallel group, whole checkpoints, processes spawned (module doc)."""

    batches_a_step = 1  # every process reads the same batch

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(data_parallel_size=1, save_distributed_checkpoint=False, **kwargs)

    def _configure_launcher(self) -> None:
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = _MultiProcessingLauncher(self, start_method="spawn")

    def setup_environment(self) -> None:
        self._tensor_parallel_size = self.num_nodes * self.num_processes  # every process of every machine
        super().setup_environment()

    def load_checkpoint(self, checkpoint_path: str | Path, weights_only: bool | None = None) -> dict[str, Any]:
        """A whole checkpoint, of any number of processes, into the blocks. Eq. (1)'s SGD keeps no state a weight
        (no momentum), so its optimiser resumes from its groups' values (the rate, after any drop); Lightning's own
        loader of a whole checkpoint reads the first weight's state, and fails on a one-process run's, which has
        none."""
        checkpoint = torch.load(Path(self.broadcast(checkpoint_path)), map_location="cpu", weights_only=weights_only)
        whole = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.model, checkpoint.pop("state_dict"), options=whole)
        for optimizer, saved in zip(self.optimizers, checkpoint.pop("optimizer_states")):
            if saved["state"]:
                raise NplmError(f"{STRATEGY} resumes an optimiser without a state a weight (SGD, no momentum)")
            for group, kept in zip(optimizer.param_groups, saved["param_groups"]):
                group.update({key: value for key, value in kept.items() if key not in HOW})
        return checkpoint


StrategyRegistry.register(
    STRATEGY, ParameterParallel, description="the paper's §3.2: eq. (1)'s output units in blocks over the processes"
)


def data_parallel_size(trainer: Trainer) -> int:
    """How many batches one step averages: the processes under DDP; one under a strategy whose processes split the
    output units instead, or step on their own (its `batches_a_step`)."""
    return getattr(trainer.strategy, "batches_a_step", trainer.world_size)


def is_blocked(model: nn.Module) -> bool:
    return isinstance(getattr(model, "b", None), DTensor)


def block(model: nn.Module, mesh: DeviceMesh) -> None:
    """Process i keeps block i of U's, W's and b's rows, and every process the same C, H and d (process 0's)."""
    tensor_parallel = mesh[MESH]
    for name, weight in list(model.named_parameters(recurse=False)):
        placement = Shard(0) if name in BLOCKED else Replicate()
        blocked = distribute_tensor(weight.detach(), tensor_parallel, [placement])
        setattr(model, name, nn.Parameter(blocked, requires_grad=weight.requires_grad))


def unblock(model: nn.Module) -> None:
    """Every weight whole again, on every process (each process takes part): what the job's process gets back."""
    for name, weight in list(model.named_parameters(recurse=False)):
        if isinstance(weight, DTensor):
            setattr(model, name, nn.Parameter(weight.full_tensor().detach(), requires_grad=weight.requires_grad))


def on_mesh(batch: Any, model: nn.Module) -> Any:
    """A batch's tensors as the same tensor on every process of the blocked model's mesh."""
    mesh = model.b.device_mesh
    return type(batch)(DTensor.from_local(t, mesh, [Replicate()], run_check=False) for t in batch)


@contextlib.contextmanager
def blocked_loss(model: nn.Module) -> Iterator[None]:
    """The softmax over the blocks, forward and backward (`loss_parallel`), where the model is blocked."""
    with loss_parallel() if is_blocked(model) else contextlib.nullcontext():
        yield


class BlockSoftmax(OutputLayer):
    """Eq. (1)'s exact softmax in float32 over the blocks' scores, each process holding its block's."""

    name = "exact float32, in blocks"

    def loss(self, head: Head) -> torch.Tensor:
        with loss_parallel():
            return F.cross_entropy(head.all_logits(), head.target).full_tensor()

    def token_nll(self, head: Head) -> torch.Tensor:
        with loss_parallel():
            return F.cross_entropy(head.all_logits(), head.target, reduction="none").full_tensor()

    def log_probs(self, head: Head) -> torch.Tensor:
        return F.log_softmax(head.all_logits().full_tensor(), dim=-1)


def check_blocks(cfg: Any) -> None:
    """What trainer.strategy=parameter_parallel trains: eq. (1)'s exact softmax in float32 (NplmError otherwise)."""
    said = f"trainer.strategy={STRATEGY}"
    if training_of(cfg.optim).sampled:
        raise NplmError(f"{said} trains the exact softmax (optim=fast or paper): a sampled step reads a few rows")
    if (output := cfg.model.get("output", "standard")) != "standard":
        raise NplmError(f"{said} splits eq. (1)'s softmax over V in blocks; model.output={output} has no such layer")
    if cfg.trainer.precision not in ("auto", "32-true"):
        raise NplmError(f"{said} trains in float32: trainer.precision={cfg.trainer.precision} is not supported")
    check_processes(cfg, said)


def check_processes(cfg: Any, said: str) -> None:
    """trainer.devices is a number of processes, the job spawns them itself (not under torchrun or several SLURM
    tasks, whose processes would each run the whole job), and on a CPU they have a core each at least (NplmError
    otherwise)."""
    tasks = int(os.environ.get("SLURM_NTASKS", "1"))
    if TorchElasticEnvironment.detect() or (SLURMEnvironment.detect() and tasks > 1):
        launcher = "torchrun" if TorchElasticEnvironment.detect() else f"SLURM's {tasks} tasks"
        raise NplmError(
            f"{said} spawns its processes from the job's one process; under {launcher} each process would run the "
            f"whole job: start one process (one SLURM task with trainer.devices cores)"
        )
    devices, threads, cores = cfg.trainer.devices, cfg.get("threads") or 1, len(os.sched_getaffinity(0))
    on_cpu = cfg.trainer.accelerator == "cpu" or (cfg.trainer.accelerator == "auto" and not torch.cuda.is_available())
    if not isinstance(devices, int) or devices < 1:
        raise NplmError(f"{said} needs trainer.devices, a number of processes (got {devices})")
    if on_cpu and devices * threads > cores:
        raise NplmError(
            f"{said} with trainer.devices={devices} and threads={threads} needs {devices * threads} cores (one "
            f"process a core at least); this machine has {cores}"
        )


def check_block_sizes(cfg: Any, sizes: Sizes) -> None:
    """At most one process a word (NplmError otherwise)."""
    if cfg.trainer.strategy == STRATEGY and sizes.words is not None and cfg.trainer.devices > sizes.words:
        raise NplmError(
            f"trainer.strategy={STRATEGY} with trainer.devices={cfg.trainer.devices}: more processes than the "
            f"{sizes.words:,} words of the training split, so some would own no output unit"
        )
