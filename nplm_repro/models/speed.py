"""How fast a trained family computes on this machine: nplm-bench's timed measurements of its module (the matmul
ceilings, eq. (1)'s plain PyTorch baseline and its steps as the simplest loop, training steps in a real Trainer, their profile, the class layer's rows
and the exact validation; bench.py's doc says what each of its lines is), on the device `trainer.accelerator` takes.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig
from torch import nn

from nplm_repro.clock import Clock
from nplm_repro.data.corpus import Corpus
from nplm_repro.data.module import CorpusData
from nplm_repro.data.windows import loader
from nplm_repro.models.language_module import LanguageModule
from nplm_repro.models.training import build_module


def device_of(cfg: DictConfig) -> torch.device:
    """Where the MLP lines compute: a GPU when `trainer.accelerator` takes one (`auto` does when there is one)."""
    accelerator = cfg.trainer.accelerator
    gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    return torch.device("cuda" if gpu else "cpu")


def step_clock(cfg: DictConfig, warmup: int) -> Clock:
    """A clock for steps on the MLP's device, waiting for the GPU at the end of each round."""
    sync = torch.cuda.synchronize if device_of(cfg).type == "cuda" else (lambda: None)
    return Clock(warmup, cfg.bench.min_seconds, cfg.bench.repeats, sync)


def ceiling(flops: float, rate: dict[str, Any], matmul: dict[str, Any]) -> dict[str, float]:
    """A line's FLOPs a token (forward and backward: three times the forward), the model FLOP/s its median rate
    achieves, and that as a share of its dtype's matmul rate measured in the same run."""
    achieved = rate["tokens_per_s"] * flops / 1e9
    return {
        "flops_per_token": flops,
        "achieved_gflops": achieved,
        "share_of_matmul": achieved / matmul["matmul_gflops"],
    }


def matmul_rates(cfg: DictConfig, vocab_size: int, batch: int, width: int) -> dict[str, dict[str, Any]]:
    """GFLOP/s of the output layer's three products (z: batch x width, O: |V| x width) at the training batch's
    tokens, per dtype, on the device: `matmul_gflops` (the median round's) and its timing."""
    width += 1  # the bias column of bf16_loss
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        shapes = (batch, width), (vocab_size, width), (batch, vocab_size)
        z, O, dy = (torch.randn(*shape, dtype=dtype, device=device_of(cfg)) for shape in shapes)
        products, clock = ((z, O.T), (dy, O), (dy.T, z)), step_clock(cfg, warmup=1)  # the first set: kernels' setup
        done = False
        while not done:
            for a, b in products:
                torch.mm(a, b)
            done = clock.tick(batch)
        rates[str(dtype).removeprefix("torch.")] = clock.report("steps", "matmul_gflops", 6 * width * vocab_size / 1e9)
    return rates


class _Windows(torch.utils.data.Dataset):
    """The straightforward way: one (context, target) pair per item, collated by the DataLoader."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows[i, :-1], self.rows[i, -1]


class _PlainNPLM(nn.Module):
    def __init__(self, vocab_size: int, n: int, m: int, h: int, direct: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, m)
        self.hidden = nn.Sequential(nn.Linear((n - 1) * m, h), nn.Tanh(), nn.Linear(h, vocab_size)) if h else None
        self.direct = nn.Linear((n - 1) * m, vocab_size, bias=not h) if direct else None

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        x = self.embed(context).flatten(1)
        parts = [layer(x) for layer in (self.hidden, self.direct) if layer is not None]
        return sum(parts[1:], parts[0])


def baseline(cfg: DictConfig, corpus: Corpus) -> dict[str, Any]:
    """Training tokens/s of the straightforward float32 implementation (on the MLP's device), after a warm-up."""
    rows = loader(corpus, "train", cfg.model.n, 1).rows
    data = torch.utils.data.DataLoader(_Windows(rows), batch_size=cfg.optim.batch_size, shuffle=True)
    m, device = cfg.model, device_of(cfg)
    model = _PlainNPLM(corpus.vocab_size, m.n, m.m, m.h, m.direct).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr * cfg.optim.batch_size, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    clock, done = step_clock(cfg, cfg.bench.warmup), False
    while not done:  # as many epochs as the rounds take
        clock.resume()
        for context, target in data:
            optimizer.zero_grad()
            loss_fn(model(context.to(device)), target.to(device)).backward()
            optimizer.step()
            done = clock.tick(len(target))
            if done:
                break
    return clock.report("steps")


class PlainFloor:
    """The family's step as the simplest loop that computes the same (its `plain_loop`: no Lightning, no optimiser
    object), on the MLP's device, over the same shuffled batches, warmed up by the bench's untimed steps, and timed a
    round at a time: a training line's rounds alternate with its floor's, so `x_plain` compares two rates the
    machine gave within the same seconds. Timed minutes apart, the two moved by a third between runs on a VM
    (docs/performance.md), more than the gap they measure."""

    def __init__(self, cfg: DictConfig, corpus: Corpus, precision: str) -> None:
        self.cfg, self.module = cfg, build_module(cfg, corpus).to(device_of(cfg))
        self._batches = self.module.reads.batches(corpus, "train", cfg.optim.batch_size, True, cfg.seed)
        self.loop = self.module.plain_loop(precision, self._batches)
        self._batches.to(self.module.device)
        self._epoch = 0
        self._next = self._shuffled()
        warmup = step_clock(cfg, cfg.bench.warmup)
        for _ in range(cfg.bench.warmup):
            warmup.tick(self._step(warmup))

    def _shuffled(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._batches.set_epoch(self._epoch)
        self._epoch += 1
        return iter(self._batches)

    def _step(self, clock: Clock) -> int:
        """One step on the next batch, the next epoch's first once an epoch ends (its shuffle outside `clock`, as the
        training line's epoch start is outside its own): the tokens it trained."""
        batch = next(self._next, None)
        if batch is None:
            self._next = self._shuffled()
            batch = next(self._next)
            clock.resume()
        self.loop.step(*batch)
        return len(batch[1])

    def run_round(self, clock: Clock) -> None:
        """Steps until `clock` has one more round, counted from now: what ran before is not the floor's."""
        rounds = len(clock.rounds)
        clock.resume()
        while len(clock.rounds) == rounds:
            clock.tick(self._step(clock))

    def rate(self) -> dict[str, Any]:
        """Its own line: the bench's rounds of it, one after another."""
        clock = step_clock(self.cfg, 0)
        while len(clock.rounds) < clock.repeats:
            self.run_round(clock)
        return clock.report("steps")


class _StepClock(Callback):
    """Ticks the clock after each training step, leaves out what comes between epochs (validation), runs `between`
    after each round (outside the clock) and stops the training once the clock's last round is done."""

    def __init__(self, clock: Clock, between: Callable[[], None] = lambda: None) -> None:
        self.clock, self.between = clock, between

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.clock.resume()

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, out: Any, batch: Any, index: int
    ) -> None:
        rounds = len(self.clock.rounds)
        done = self.clock.tick(batch[1].numel())  # a window's target, or a sequence batch's rows of targets
        if len(self.clock.rounds) > rounds:
            self.between()
            self.clock.resume()
        if done:
            trainer.should_stop = True  # Lightning then validates once (the clock has stopped) and ends the fit


PROFILED_STEPS = 200
EPOCHS = 1000  # the bench trainer's epochs at most: its clock stops it long before
TOP_OPS = 15


class _Profiled(Callback):
    """Profiles `steps` training steps after `warmup` untimed ones (torch.profiler), then stops the training."""

    def __init__(self, warmup: int, steps: int, device: torch.device) -> None:
        self.warmup, self.steps, self.done = warmup, steps, 0
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.seconds = 0.0

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, out: Any, batch: Any, index: int
    ) -> None:
        self.done += 1
        if self.done == self.warmup:
            self.sync()
            self.profiler.start()
            self.seconds = time.perf_counter()
        elif self.done == self.warmup + self.steps:
            self.sync()
            self.seconds = time.perf_counter() - self.seconds
            self.profiler.stop()
            trainer.should_stop = True


def profile_steps(cfg: DictConfig, corpus: Corpus) -> dict[str, Any]:
    """Where a training step's time goes: the wall time per profiled step and the operators that take most of it
    (their own time per step, in ms), from PROFILED_STEPS steps after the bench's warm-up."""
    profiled = _Profiled(cfg.bench.warmup, PROFILED_STEPS, device_of(cfg))
    _fit(cfg, corpus, "32-true", profiled)
    ops = sorted(profiled.profiler.key_averages(), key=lambda op: op.self_cpu_time_total, reverse=True)
    per_step = 1e3 / PROFILED_STEPS
    return {
        "ms_per_step": profiled.seconds * per_step,
        "steps": PROFILED_STEPS,
        "self_ms_per_step": {op.key: op.self_cpu_time_total / 1e6 * per_step for op in ops[:TOP_OPS]},
        "others_ms_per_step": sum(op.self_cpu_time_total for op in ops[TOP_OPS:]) / 1e6 * per_step,
    }


def _fit(cfg: DictConfig, corpus: Corpus, precision: str, callback: Callback) -> LanguageModule:
    """The family's module trained in a real Lightning Trainer (as nplm-train runs it, without validation) until `callback`
    stops it."""
    module = build_module(cfg, corpus)
    trainer = L.Trainer(
        # as many epochs as the rounds take (sampled training runs an epoch of Brown in seconds), and finite: a
        # schedule over the run (AdamW's warm-up and cosine) needs its length
        max_epochs=EPOCHS,
        limit_val_batches=1,  # the fast recipe's plateau schedule needs a validation per epoch; outside the clock
        precision=precision,
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        logger=False,
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    batch = cfg.optim.batch_size
    trainer.fit(module, datamodule=CorpusData(corpus, module.reads, batch, batch, cfg.seed))
    return module


def train_steps(
    cfg: DictConfig, corpus: Corpus, precision: str, floor: PlainFloor | None = None
) -> tuple[dict[str, Any], LanguageModule]:
    """Training tokens/s of the family's module in a real Lightning Trainer (as nplm-train runs it, without
    validation); with its `floor`, a round of the floor after each of its own: `x_plain`, the median of the rounds'
    ratios to the floor's, with their lowest and highest (`x_plain_range`), and `plain_tokens_per_s`, the median of
    the floor's rounds."""
    clock, paired = step_clock(cfg, cfg.bench.warmup), step_clock(cfg, 0)
    between = functools.partial(floor.run_round, paired) if floor else lambda: None
    module = _fit(cfg, corpus, precision, _StepClock(clock, between))
    result = clock.report("steps")
    if floor:
        floors = paired.round_rates()
        ratios = sorted(ours / its for ours, its in zip(clock.round_rates(), floors, strict=True))
        result |= {"x_plain": statistics.median(ratios), "x_plain_range": [ratios[0], ratios[-1]]}
        result["plain_tokens_per_s"] = statistics.median(floors)
    return result, module


def rows_per_token(module: LanguageModule, corpus: Corpus) -> float:
    """Output rows a class layer computes per training token: the classes, and the words of the token's class (the
    mean over the training tokens), against eq. (1)'s |V|."""
    start, end = corpus.bounds["train"]
    classes = module.classes
    return len(classes.size) + float(classes.size[classes.word_class[corpus.ids[start:end]]].double().mean())


def validate(cfg: DictConfig, module: LanguageModule, corpus: Corpus) -> float:
    """Perplexity of the whole validation split as every run scores it (Trainer.validate, validation_step)."""
    trainer = L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    batch = cfg.data.eval_batch_size
    (metrics,) = trainer.validate(module, datamodule=CorpusData(corpus, module.reads, batch, batch), verbose=False)
    return metrics["valid_ppl_epoch"]
