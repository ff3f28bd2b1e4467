"""nplm-bench's `asynchronous` lines: eq. (1)'s exact training step on W processes of one thread each that share one
set of weights (models/asynchronous.py, the paper's §3.1), each on its own shuffle of the training windows.

A line gives the job's tokens/s: every process adds the words of each step it ends to one shared count, and process
0's Clock times that count in the bench's rounds (the others stop when it ends). Lock-free, a process updates the
weights as soon as its gradients are computed; locked, it first takes the one lock, and `lock_wait_share` is the part
of process 0's time spent waiting for it. The step is the module's (its float32 logits, torch's SGD, fused), without
Lightning's loop.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig
from torch.nn import functional as F

from nplm_repro.clock import Clock
from nplm_repro.data.corpus import Corpus
from nplm_repro.models.parallel_speed import context, start, training_batches
from nplm_repro.models.training import build_module


def shared_rate(cfg: DictConfig, corpus: Corpus, workers: int, locked: bool) -> dict[str, Any]:
    """The `asynchronous` line's numbers for `workers` processes, with the lock or without (the module doc)."""
    L.seed_everything(cfg.seed, verbose=False)
    model = build_module(cfg, corpus).model
    model.share_memory()
    made = context()
    lock = made.Lock() if locked else None
    total, done, ready, results = made.Value("q", 0), made.Event(), made.Barrier(workers), made.SimpleQueue()
    start(_steps, (workers, cfg, corpus, (model, lock, total, done, ready, results)), workers)
    return results.get()


def _steps(rank: int, workers: int, cfg: DictConfig, corpus: Corpus, shared: tuple) -> None:
    model, lock, total, done, ready, results = shared
    torch.set_num_threads(1)
    groups = [
        {"params": model.decayed(), "weight_decay": cfg.optim.weight_decay},
        {"params": model.biases(), "weight_decay": 0.0},
    ]
    optimizer = torch.optim.SGD(groups, lr=cfg.optim.lr * cfg.optim.batch_size, fused=True)  # one process's rate
    batches, waited = training_batches(cfg, corpus, model.n, cfg.seed + rank), [0.0]

    def step() -> None:
        context, target = next(batches)
        F.cross_entropy(model(context), target).backward()
        start = time.perf_counter()
        with lock if lock is not None else contextlib.nullcontext():
            waited[0] += time.perf_counter() - start
            optimizer.step()
        optimizer.zero_grad()
        with total.get_lock():
            total.value += len(target)

    ready.wait()
    if rank:
        while not done.is_set():
            step()
        return
    clock, counted = Clock(cfg.bench.warmup, cfg.bench.min_seconds, cfg.bench.repeats), 0
    start, finished = time.perf_counter(), False
    while not finished:
        step()
        now = total.value  # every process's words since process 0's last step
        finished, counted = clock.tick(now - counted), now
    done.set()
    wait = {"lock_wait_share": waited[0] / (time.perf_counter() - start)} if lock is not None else {}
    results.put(clock.report("steps") | wait)
