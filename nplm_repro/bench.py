"""`nplm-bench`: how fast this machine trains, evaluates and counts, printed as one JSON object per line.

nplm-bench experiment=mlp9                       # the MLP9 configuration on real Brown data
nplm-bench experiment=mlp1 bench.what=[matmul,train]
nplm-bench bench.what=[ngram] bench.ngram_rows=[del_int,kn3]

Takes the same overrides as `nplm-train`. Every line has `what`, `tokens_per_s` (where tokens apply) and
`seconds`; the neural lines add `achieved_gflops` (model FLOPs per second, counted from the layer shapes:
forward 2 flops per multiply-add, backward twice the forward) and `matmul_gflops`, the rate of the output
layer's own matrix products measured by this process in the same dtype, so the two compare in one run.
- matmul: the three output-layer products of a training step (forward y = z O^T, backward dy O and
  dy^T z), best of several repetitions, float32 and bfloat16;
- baseline: a straightforward PyTorch implementation of the same model (map-style Dataset of windows,
  shuffled DataLoader, nn.Embedding + nn.Linear, CrossEntropyLoss, plain SGD, float32): the reference;
- train: our LightningModule in a real Trainer, for each precision in `bench.precisions`; the `auto` line
  says what `trainer.precision=auto` resolved to here (`resolved`) and the probe's rates it chose by;
- sampled: the same with `optim=sampled` (or the command's own optim when it is sampled), float32, and its
  speed-up over each `train` line (`x_32-true`, ...);
- eval: the exact float32 perplexity of the whole validation split, as every run computes it (Trainer.validate);
- ngram: fit on train and score train, valid and test, for each row in `bench.ngram_rows`;
- mixture: the MLP's probability of every valid and test token (`probs` lines), then EM of the learned and
  context-conditioned mixtures with the interpolated trigram on valid and scoring valid and test with them.
Run it on a quiet machine: numbers move with load, which is why each line is measured in the same run.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import hydra
import lightning as L
import numpy as np
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig, OmegaConf
from torch import nn

from nplm_repro.baselines.mixture import TrigramMixture
from nplm_repro.baselines.ngram import DeletedInterpolation, perplexity_of
from nplm_repro.checks import check_config
from nplm_repro.cli import cli, errors_exit
from nplm_repro.data.corpus import Corpus
from nplm_repro.data.load import load_corpus
from nplm_repro.data.windows import loader
from nplm_repro.errors import NplmError
from nplm_repro.memory import keep_freed_memory
from nplm_repro.models.lightning_module import NPLMModule
from nplm_repro.models.precision import PRECISIONS, output_layer_gflops, resolve
from nplm_repro.models.training import token_probs

log = logging.getLogger(__name__)


def emit(what: str, **numbers: Any) -> None:
    """One JSON line on stdout (logs go to stderr), floats rounded for reading."""
    fields = {k: round(v, 3) if isinstance(v, float) else v for k, v in numbers.items()}
    print(json.dumps({"what": what, **fields}), flush=True)


def output_width(cfg: DictConfig) -> int:
    """Inputs of the output layer: (n-1)m through W (if direct) plus h through U."""
    m = cfg.model
    return (m.n - 1) * m.m * bool(m.direct) + m.h


def flops_per_token(cfg: DictConfig, vocab_size: int, train: bool) -> float:
    """Multiply-adds x 2 of the hidden and output layers; training adds the backward (twice the forward)."""
    m = cfg.model
    forward = 2.0 * (output_width(cfg) * vocab_size + (m.n - 1) * m.m * m.h)
    return 3 * forward if train else forward


def matmul_rates(cfg: DictConfig, vocab_size: int) -> dict[str, float]:
    """GFLOP/s of the output layer's three products at the training batch size, per dtype."""
    batch, width = cfg.optim.batch_size, output_width(cfg) + 1  # + the bias column of bf16_loss
    return {
        str(dtype).removeprefix("torch."): output_layer_gflops(
            batch, width, vocab_size, dtype, cfg.bench.matmul_repeats
        )
        for dtype in (torch.float32, torch.bfloat16)
    }


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


def baseline(cfg: DictConfig, corpus: Corpus) -> dict[str, float]:
    """Training tokens/s of the straightforward float32 implementation, after a warm-up."""
    rows = loader(corpus, "train", cfg.model.n, 1).rows
    data = torch.utils.data.DataLoader(_Windows(rows), batch_size=cfg.optim.batch_size, shuffle=True)
    m = cfg.model
    model = _PlainNPLM(corpus.vocab_size, m.n, m.m, m.h, m.direct)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr * cfg.optim.batch_size, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    warmup, steps, tokens = cfg.bench.warmup, cfg.bench.steps, 0
    for step, (context, target) in enumerate(data):
        if step == warmup:
            start, tokens = time.perf_counter(), 0
        if step == warmup + steps:
            break
        optimizer.zero_grad()
        loss_fn(model(context), target).backward()
        optimizer.step()
        tokens += len(target)
    seconds = time.perf_counter() - start
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens}


class _StepTimer(Callback):
    """Times the training batches after the warm-up ones."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.tokens, self.start, self.end = warmup, 0, 0.0, 0.0

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, index: int) -> None:
        if index == self.warmup:
            self.start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, out: Any, batch: Any, index: int
    ) -> None:
        if index >= self.warmup:
            self.tokens += len(batch[1])
            self.end = time.perf_counter()


def train_steps(cfg: DictConfig, corpus: Corpus, precision: str) -> tuple[dict[str, float], NPLMModule]:
    """Training tokens/s of NPLMModule in a real Lightning Trainer (as nplm-train runs it, without validation)."""
    architecture = {k: v for k, v in cfg.model.items() if k != "mix"}
    module = instantiate(architecture, vocab_size=corpus.vocab_size, optim=cfg.optim, _convert_="all")
    timer = _StepTimer(cfg.bench.warmup)
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=cfg.bench.warmup + cfg.bench.steps,
        limit_val_batches=1,  # the fast recipe's plateau schedule needs one validation; after the clock stops
        precision=precision,
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        logger=False,
        callbacks=[timer],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    n, batch = cfg.model.n, cfg.optim.batch_size
    trainer.fit(module, loader(corpus, "train", n, batch, True, cfg.seed), loader(corpus, "valid", n, batch))
    seconds = timer.end - timer.start
    return {"tokens_per_s": timer.tokens / seconds, "seconds": seconds, "tokens": timer.tokens}, module


def validate(cfg: DictConfig, module: NPLMModule, corpus: Corpus) -> tuple[float, float]:
    """Perplexity of the whole validation split as every run scores it (Trainer.validate, validation_step), and
    the seconds it took."""
    trainer = L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    start = time.perf_counter()
    (metrics,) = trainer.validate(
        module, loader(corpus, "valid", module.model.n, cfg.data.eval_batch_size), verbose=False
    )
    return metrics["valid_ppl_epoch"], time.perf_counter() - start


def bench_ngrams(cfg: DictConfig, corpus: Corpus) -> None:
    for row in cfg.bench.ngram_rows:
        model_cfg = hydra.compose("config", overrides=[f"experiment={row}"]).model
        start = time.perf_counter()
        model = instantiate(model_cfg, _convert_="all").fit(corpus)
        fitted = time.perf_counter()
        ppl = {f"{split}_ppl": model.perplexity(corpus, split) for split in ("train", "valid", "test")}
        seconds = time.perf_counter() - start
        emit(
            f"ngram {row}",
            tokens_per_s=corpus.size("train") / seconds,
            seconds=seconds,
            fit_seconds=fitted - start,
            score_seconds=seconds - (fitted - start),
            **ppl,
        )


def bench_mixture(corpus: Corpus, mlp: dict[str, np.ndarray]) -> None:
    trigram = DeletedInterpolation().fit(corpus)
    for mode in ("learned", "context"):
        start = time.perf_counter()
        mixture = TrigramMixture(mode, trigram).fit(corpus, mlp["valid"])
        ppl = {f"{s}_ppl": perplexity_of(mixture.probs(corpus, s, mlp[s])) for s in ("valid", "test")}
        seconds = time.perf_counter() - start
        tokens = len(mlp["valid"]) + len(mlp["test"])
        emit(f"mixture {mode}", tokens_per_s=tokens / seconds, seconds=seconds, **ppl, **mixture.describe())


MEASURES = ("matmul", "baseline", "train", "sampled", "eval", "mixture", "ngram")


def check_bench(b: DictConfig) -> None:
    """The bench keys, named in one line when wrong (the rest of the config is check_config's)."""
    unknown = set(b.what) - set(MEASURES)
    if unknown:
        raise NplmError(f"bench.what: unknown {sorted(unknown)} (known: {', '.join(MEASURES)})")
    for key, low in (("warmup", 0), ("steps", 1), ("matmul_repeats", 1)):
        if not isinstance(b[key], int) or b[key] < low:
            raise NplmError(f"bench.{key}={b[key]} is invalid: expected an integer >= {low}")
    if set(b.precisions) - {"auto", *PRECISIONS}:
        raise NplmError(f"bench.precisions={list(b.precisions)} is invalid: expected auto, 32-true and/or bf16-mixed")


def bench(cfg: DictConfig) -> None:
    check_config(cfg)
    check_bench(cfg.bench)
    what, corpus = set(cfg.bench.what), load_corpus(cfg.data)
    cfg.trainer.precision = resolve(cfg.trainer.precision, cfg.trainer.accelerator)[0]  # what nplm-train would use
    log.info("measuring %s", OmegaConf.to_container(cfg.bench, resolve=True))
    L.seed_everything(cfg.seed, verbose=False)
    shape = {k: cfg.model[k] for k in ("n", "m", "h", "direct")} | {"vocab_size": corpus.vocab_size}
    train_flops, eval_flops = (flops_per_token(cfg, corpus.vocab_size, train) / 1e9 for train in (True, False))
    rates = matmul_rates(cfg, corpus.vocab_size) if what - {"ngram"} else {}  # the MLP lines compare with it
    if "matmul" in what:
        for dtype, rate in rates.items():
            emit(f"matmul {dtype}", matmul_gflops=rate, batch=cfg.optim.batch_size, **shape)
    if "baseline" in what:
        result = baseline(cfg, corpus)
        emit(
            "train baseline float32",
            **result,
            achieved_gflops=result["tokens_per_s"] * train_flops,
            matmul_gflops=rates["float32"],
            **shape,
        )
    keep_freed_memory()  # after the baseline, which runs as a straightforward script would
    module, speeds = None, {}
    exact = OmegaConf.merge(cfg, {"optim": {"output": "exact"}})  # the train lines are the exact softmax's
    for precision in cfg.bench.precisions if what & {"train", "eval", "mixture"} else []:
        concrete, tags = resolve(precision, cfg.trainer.accelerator)  # auto: what nplm-train would pick here
        result, module = train_steps(exact, corpus, concrete)
        speeds[precision] = result["tokens_per_s"]
        if "train" in what:
            chosen = {"resolved": concrete, **{k.removeprefix("precision."): v for k, v in tags.items()}}
            emit(
                f"train {precision}",
                **result,
                achieved_gflops=result["tokens_per_s"] * train_flops,
                matmul_gflops=rates["bfloat16" if concrete.startswith("bf16") else "float32"],
                **(chosen if precision == "auto" else {}),
                **shape,
            )
    if "sampled" in what:
        optim = cfg.optim if cfg.optim.output == "sampled" else hydra.compose("config", ["optim=sampled"]).optim
        result, _ = train_steps(OmegaConf.merge(cfg, {"optim": optim}), corpus, "32-true")
        speedups = {f"x_{p}": result["tokens_per_s"] / speed for p, speed in speeds.items()}
        emit(
            "train sampled",
            **result,
            samples=optim.samples,
            proposal=optim.proposal,
            estimator=optim.estimator,
            **speedups,
            **shape,
        )
    if module is not None and "eval" in what:
        ppl, seconds = validate(cfg, module, corpus)
        tokens = corpus.size("valid")
        emit(
            "eval valid float32",
            tokens_per_s=tokens / seconds,
            seconds=seconds,
            tokens=tokens,
            batch=cfg.data.eval_batch_size,
            achieved_gflops=tokens / seconds * eval_flops,
            matmul_gflops=rates["float32"],
            ppl=float(ppl),
            **shape,
        )
    if module is not None and "mixture" in what:
        mlp, quiet = {}, OmegaConf.merge(cfg, {"trainer": {"enable_progress_bar": False}})  # stdout is for JSON
        for split in ("valid", "test"):
            start = time.perf_counter()
            mlp[split] = token_probs(quiet, module, corpus, split)
            seconds = time.perf_counter() - start
            emit(f"probs {split} float32", tokens_per_s=len(mlp[split]) / seconds, seconds=seconds, **shape)
        bench_mixture(corpus, mlp)
    if "ngram" in what:
        bench_ngrams(cfg, corpus)


@hydra.main(config_path="pkg://nplm_repro.conf", config_name="bench", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    with errors_exit():
        bench(cfg)


main = cli(_main)

if __name__ == "__main__":
    main()
