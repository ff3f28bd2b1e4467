"""nplm-bench's `parallel` lines: eq. (1)'s parameter-parallel training step (models/parallel.py) on M processes of
one thread each, on the corpus's training windows, every process taking every step.

A line gives the job's tokens/s (process 0's Clock, in the bench's rounds; every process ends a round with it) and
the communication share: of the wall time of PROFILED_STEPS further steps under torch.profiler, the part spent in the
collectives (their calls and the waits for them, `COLLECTIVES`), the paper's "communication overhead" (1/15 of an
epoch's time on its cluster). With M = 1 the blocks are the whole layer, and DTensor's bookkeeping is the only cost
over ordinary training. The processes talk over gloo on this machine's loopback; each line's are forked from one
server process (`start`).
"""

from __future__ import annotations

import multiprocessing
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import DictConfig
from torch.distributed.device_mesh import init_device_mesh
from torch.profiler import ProfilerActivity, profile

from nplm_repro.clock import Clock
from nplm_repro.data.corpus import Corpus
from nplm_repro.data.windows import NgramWindows
from nplm_repro.models.parallel import MESH, BlockSoftmax, block, blocked_loss, on_mesh
from nplm_repro.models.training import build_module

PROFILED_STEPS = 20
# the profiler's names of a collective's call and of the wait for its result (DTensor's are asynchronous)
COLLECTIVES = ("allreduce", "all_reduce", "allgather", "all_gather", "broadcast", "reduce_scatter", "wait_tensor")
# float32 values an Allreduce sums in the `allreduce` line: one, a batch's maxima or normalisers (256), its dL/da at
# h = 100, its dL/dx at (n - 1) m = 400, and larger, for the bandwidth
ALLREDUCE_SIZES = (1, 256, 25_600, 102_400, 1_048_576)
# how a line's processes start: forked from one server process where the platform has one (not Windows)
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context of the lines' processes and of what they share (queues, locks, counters)."""
    return mp.get_context(START_METHOD)


def start(function: Callable[..., None], args: tuple, processes: int) -> None:
    """Run function(rank, *args) in `processes` processes and wait for them all (an error in one ends them all, as
    torch's `spawn`). They are forked from one server process that imported this module once, for every line of the
    command (multiprocessing's forkserver), not each started afresh: each saves the 6-7 s of CPU that importing torch
    and Lightning takes. The server holds no threads and no tensors, so a fork of it is as clean as a new process."""
    if START_METHOD == "forkserver":
        mp.set_forkserver_preload([__name__])  # read when the server starts, with the first line
    mp.start_processes(function, args=args, nprocs=processes, join=True, start_method=START_METHOD)


def blocked_rate(cfg: DictConfig, corpus: Corpus, processes: int) -> dict[str, Any]:
    """The `parallel` line's numbers for `processes` processes (the module doc)."""
    results = context().SimpleQueue()
    start(_steps, (processes, _free_port(), cfg, corpus, results), processes)
    return results.get()


def allreduce_times(processes: int, sizes: tuple[int, ...] = ALLREDUCE_SIZES, repeats: int = 50) -> dict[str, Any]:
    """The median seconds of one Allreduce (a float32 sum) of each size over `processes` processes of this machine,
    and the line a + bytes / bandwidth fitted to them (least squares): the latency a and the bandwidth, the inputs of
    docs/performance.md's projection of parameter-parallel training to more processes."""
    results = context().SimpleQueue()
    start(_allreduces, (processes, _free_port(), sizes, repeats, results), processes)
    seconds = results.get()
    fitted = np.polyfit([4.0 * size for size in sizes], seconds, 1)  # seconds = bytes / bandwidth + latency
    return {
        "latency_us": fitted[1] * 1e6,
        "bandwidth_gb_per_s": 1e-9 / fitted[0],
        "sizes": list(sizes),
        "us": [t * 1e6 for t in seconds],
    }


def _allreduces(rank: int, processes: int, port: int, sizes: tuple[int, ...], repeats: int, results: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=processes)
    try:
        medians = []
        for size in sizes:
            values, seconds = torch.ones(size), []
            for _ in range(repeats + 5):  # the first 5 untimed
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(values)
                seconds.append(time.perf_counter() - start)
            medians.append(float(np.median(seconds[5:])))
        if rank == 0:
            results.put(medians)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _steps(rank: int, processes: int, port: int, cfg: DictConfig, corpus: Corpus, results: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=processes)
    try:
        L.seed_everything(cfg.seed, verbose=False)
        module = build_module(cfg, corpus)
        model = module.model
        block(model, init_device_mesh("cpu", (1, processes), mesh_dim_names=("data_parallel", MESH)))
        groups = [
            {"params": model.decayed(), "weight_decay": cfg.optim.weight_decay},
            {"params": model.biases(), "weight_decay": 0.0},
        ]
        optimizer = torch.optim.SGD(groups, lr=cfg.optim.lr * cfg.optim.batch_size)  # module.configure_optimizers'
        layer, batches = BlockSoftmax(), training_batches(cfg, corpus, model.n, cfg.seed)

        def step() -> int:
            batch = on_mesh(next(batches), model)
            head = module.head(batch, training=True)
            loss = layer.loss(head)
            with blocked_loss(model):  # as the module's `backward`
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return len(head.target)

        clock, done = Clock(cfg.bench.warmup, cfg.bench.min_seconds, cfg.bench.repeats), torch.zeros(1)
        while not done.item():
            tokens = step()
            done.fill_(float(clock.tick(tokens)) if rank == 0 else 0.0)
            dist.broadcast(done, 0)  # every process ends with process 0's last round
        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            start = time.perf_counter()
            for _ in range(PROFILED_STEPS):
                step()
            wall = time.perf_counter() - start
        waits = [e for e in profiled.key_averages() if any(name in e.key.lower() for name in COLLECTIVES)]
        communication = sum(e.self_cpu_time_total for e in waits) / 1e6
        if rank == 0:
            results.put(
                clock.report("steps")
                | {"communication_share": communication / wall, "ms_per_step_profiled": wall / PROFILED_STEPS * 1e3}
            )
    finally:
        dist.destroy_process_group()


def training_batches(cfg: DictConfig, corpus: Corpus, n: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The training windows in batches, shuffled from `seed`, pass after pass (each reshuffled)."""
    batches = NgramWindows(n, shard=False).batches(corpus, "train", cfg.optim.batch_size, True, seed)
    while True:
        yield from batches
