"""`nplm-bench`: how fast this machine trains, evaluates and counts, printed as one JSON object per line.

nplm-bench experiment=mlp9                       # the MLP9 configuration on real Brown data
nplm-bench experiment=lstm 'bench.what=[matmul,train,sampled,classes]'   # any family: lstm, transformer
nplm-bench experiment=mlp1 bench.what=[matmul,train]
nplm-bench experiment=mlp9 'bench.what=[train,sampled,classes,plain,profile]'   # each step against its floor
nplm-bench bench.what=[ngram] bench.ngram_rows=[del_int,kn3]

Takes the same overrides as `nplm-train`. Every line is timed in `bench.repeats` rounds (3) of at least
`bench.min_seconds` each (5): a step or a pass is repeated until its round has lasted that long, after
`bench.warmup` untimed training steps. Rates measured over a second moved twofold between two runs of the same code
(300 sampled steps took 0.9 s on a Xeon with AMX: 9.5x and 4.96x float32), so a line gives the median round's
`tokens_per_s` with `tokens_per_s_range`, the slowest and the fastest round, and `seconds` (timed, all rounds),
`repeats` and `steps` (or `passes`, of a whole job) that it rests on. Every line of a trained family says how far
it is from the machine's limit: `flops_per_token` (counted from the layer shapes by the family, `flops_per_token`:
2 flops a multiply-add, the backward twice the forward, the output layer at the rows the line computes: |V|, the k
drawn words (at most |V|: a repeat is computed once) and the target, or a class layer's classes and a token's class), `achieved_gflops` (that at the median
rate) and `share_of_matmul`, that against the output layer's own matrix products measured by this process in the
dtype the line's products run in (bfloat16 for bf16-mixed's softmax, float32 otherwise), on the same device.
- matmul: the three output-layer products of a training step (forward y = z O^T, backward dy O and
  dy^T z) at a training step's tokens, float32 and bfloat16, as `matmul_gflops` and `matmul_gflops_range`;
- baseline (eq. (1) only): a straightforward PyTorch implementation of the same model (map-style Dataset of
  windows, shuffled DataLoader, nn.Embedding + nn.Linear, CrossEntropyLoss, plain SGD, float32): the reference;
- plain (eq. (1) only): the floor of each training line below, its step as the simplest PyTorch loop that computes
  the same thing (models/plain_loop.py: the same shapes, proposal, estimator and update rule on the same batches; no
  Lightning, no optimiser object), for the lines `bench.what` names with it (all three when it names none):
  `plain exact <precision>` for each precision the `train` lines resolve to, `plain sampled` (not for the energy
  network) and `plain classes` (float32, as eq. (1)'s class layer computes whatever the precision). Each of those
  training lines then runs a round of its floor after each of its own rounds and gives `x_plain`, the median of its
  rounds' rates against the floor's rounds' (`x_plain_range`: the lowest and highest of those ratios), and the
  floor's median in those rounds (`plain_tokens_per_s`): the gap is Lightning's loop, the optimiser's and the step's
  own Python and operators. Paired round by round, the two rates share the machine's state of the same seconds:
  timed minutes apart, each had moved by a third on a VM;
- train: the family's LightningModule in a real Trainer, the softmax over V trained exactly, for each precision in
  `bench.precisions`; the `auto` line says what `trainer.precision=auto` resolved to here (`resolved`) and the
  probe's rates it chose by;
- sampled: the same with the sampled output layer (the command's sampling keys when it trains sampled, else
  optim=sampled's, over the family's own recipe; the command's `model.output=energy` gives the energy network's
  line), float32, and its speed-up over each `train` line (`x_32-true`, ...);
- profile: `PROFILED_STEPS` steps of that sampled training under torch.profiler, after the warm-up: the wall time
  of a step (`ms_per_step`, profiled, so a little slower than the sampled line's) and the `TOP_OPS` operators
  taking most of it (`self_ms_per_step`: each operator's own time, not its callees'), which docs/performance.md
  groups into products, gather and scatter, proposal, update and decay;
- classes: the same training with a word-class output layer (`model.output=classes`, the command's
  `model.class_method` and `model.classes`), for each precision, with `rows_per_token` (classes plus the mean class
  size of a training token, against |V|) and its speed-up over the `train` line of the same precision;
- eval: the exact float32 perplexity of the whole validation split, as every run computes it (Trainer.validate);
- ngram: fit on train and score train, valid and test, for each row in `bench.ngram_rows` (`fit_seconds` and
  `score_seconds`: the median pass's parts; a class row's first pass may include its clustering, before the cache);
- mixture (eq. (1) only): the MLP's probability of every valid and test token (`probs` lines), then EM of the
  learned and context-conditioned mixtures with the interpolated trigram on valid and scoring valid and test;
- parallel (eq. (1) only, not by default): the paper's §3.2, its output units in blocks over M processes of one
  thread each, for each M of `bench.processes` up to the machine's cores: tokens/s, its speed-up over M = 1
  (`x_M1`) and the share of a step's time in the collectives (`communication_share`; models/parallel_speed.py);
  for each M > 1 an `allreduce` line: one Allreduce's median time at several sizes, and the latency and bandwidth
  fitted to them. Then the paper's §3.1, `asynchronous W=` and `asynchronous_locked W=` lines: W processes that
  share the weights, each on its own batches, lock-free or each update locked: the tokens/s of them all, the
  speed-up over lock-free W = 1 (`x_W1`) and, locked, the share of the time waiting for the lock
  (`lock_wait_share`; models/asynchronous_speed.py). Every line of a trained family gives `output_share`, the
  output layer's share of its FLOPs.
A family's lines are its `bench_lines`; the others of `bench.what` are skipped with a note on stderr.
Run it on a quiet machine: numbers move with load, which is why each line is measured in the same run.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import hydra
import lightning as L
import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from nplm_repro.baselines.mixture import Mixed, fit_mixed
from nplm_repro.baselines.ngram import DeletedInterpolation, perplexity_of, split_windows
from nplm_repro.cli import cli
from nplm_repro.clock import Clock
from nplm_repro.data.corpus import Corpus
from nplm_repro.data.load import load_corpus
from nplm_repro.errors import NplmError
from nplm_repro.exits import errors_exit
from nplm_repro.memory import keep_freed_memory
from nplm_repro.models.asynchronous import LOCK_FREE, LOCKED
from nplm_repro.models.asynchronous_speed import shared_rate
from nplm_repro.models.language_module import LanguageModule
from nplm_repro.models.outputs import TRAININGS, output_of, training_of
from nplm_repro.models.parallel_speed import allreduce_times, blocked_rate
from nplm_repro.models.precision import PRECISIONS, job_precision
from nplm_repro.models.speed import (
    PlainFloor,
    baseline,
    ceiling,
    device_of,
    matmul_rates,
    profile_steps,
    rows_per_token,
    train_steps,
    validate,
)
from nplm_repro.models.training import build_module, token_probs
from nplm_repro.tracking.config_checks import check_config, check_sizes
from nplm_repro.tracking.keys import SAMPLING_KEYS, family

log = logging.getLogger(__name__)


def _rounded(value: Any) -> Any:
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return round(value, 3) if isinstance(value, float) else value


def emit(what: str, **numbers: Any) -> None:
    """One JSON line on stdout (logs go to stderr), floats rounded for reading."""
    print(json.dumps({"what": what, **{k: _rounded(v) for k, v in numbers.items()}}), flush=True)


T = TypeVar("T")


def timed_passes(cfg: DictConfig, work: Callable[[], tuple[T, int]]) -> tuple[T, dict[str, Any]]:
    """A whole job (`work`: its result and the tokens it processed) run as often as the bench's rounds need; the
    last result and the timing (no warm-up: a pass is long enough to be its own)."""
    clock = Clock(0, cfg.bench.min_seconds, cfg.bench.repeats)
    while True:
        result, tokens = work()
        if clock.tick(tokens):
            return result, clock.report("passes")


def _ngram_pass(
    model_cfg: DictConfig, corpus: Corpus, parts: list[tuple[float, float]]
) -> tuple[dict[str, float], int]:
    """Fit on train, score the three splits; the seconds of each part appended to `parts`."""
    start = time.perf_counter()
    model = instantiate(model_cfg, _convert_="all").fit(corpus)
    fitted = time.perf_counter()
    ppl = {f"{split}_ppl": model.perplexity(corpus, split) for split in ("train", "valid", "test")}
    parts.append((fitted - start, time.perf_counter() - fitted))
    return ppl, corpus.size("train")


def bench_ngrams(cfg: DictConfig, corpus: Corpus) -> None:
    """Each row fitted on train and scored on the three splits, a pass at a time; its rate is train tokens per
    second of a whole pass."""
    for row in cfg.bench.ngram_rows:
        model_cfg = hydra.compose("config", overrides=[f"experiment={row}"]).model
        parts: list[tuple[float, float]] = []
        ppl, timing = timed_passes(cfg, functools.partial(_ngram_pass, model_cfg, corpus, parts))
        fit, score = sorted(parts, key=sum)[len(parts) // 2]
        emit(f"ngram {row}", **timing, fit_seconds=fit, score_seconds=score, **ppl)


def _mixture_pass(
    corpus: Corpus, mode: str, trigram: DeletedInterpolation, rows: dict[str, np.ndarray], mlp: dict[str, np.ndarray]
) -> tuple[tuple[Mixed, dict[str, float]], int]:
    """EM on valid, then valid and test scored with the mixture (as a mixed row's run mixes)."""
    mixture = fit_mixed(corpus, ["MLP"], mode, mlp["valid"][:, None], with_trigram=True, trigram=trigram)
    ppl = {f"{s}_ppl": perplexity_of(mixture.probs(mlp[s][:, None], rows[s])) for s in ("valid", "test")}
    return (mixture, ppl), len(mlp["valid"]) + len(mlp["test"])


def bench_mixture(cfg: DictConfig, corpus: Corpus, mlp: dict[str, np.ndarray]) -> None:
    """Each mixture with the interpolated trigram, given the MLP's probability of every valid and test token (and
    their trigram windows, cut once as a mixed row's run cuts them)."""
    trigram = DeletedInterpolation().fit(corpus)
    rows = {split: split_windows(corpus, split, trigram.order) for split in mlp}
    for mode in ("learned", "context"):
        (mixture, ppl), timing = timed_passes(cfg, functools.partial(_mixture_pass, corpus, mode, trigram, rows, mlp))
        emit(f"mixture {mode}", **timing, **ppl, **mixture.describe())


def _probs_pass(cfg: DictConfig, module: LanguageModule, corpus: Corpus, split: str) -> tuple[np.ndarray, int]:
    probs = token_probs(cfg, module, corpus, split)
    return probs, len(probs)


MEASURES = (
    "matmul",
    "baseline",
    "plain",
    "train",
    "sampled",
    "profile",
    "classes",
    "eval",
    "mixture",
    "ngram",
    "parallel",
)
LISTS = ("what", "precisions", "ngram_rows", "processes")  # the bench keys that are lists


def check_bench(b: DictConfig) -> None:
    """The bench keys, named in one line when wrong (the rest of the config is check_config's). A list key given one
    name (`bench.what=matmul`, which Hydra reads as a string) is that name's list: a string would be read letter by
    letter."""
    for key in LISTS:
        if isinstance(b[key], str):
            b[key] = [b[key]]
    if not b.what:
        raise NplmError(f"bench.what is empty: nothing to measure (name some of {', '.join(MEASURES)})")
    unknown = set(b.what) - set(MEASURES)
    if unknown:
        raise NplmError(f"bench.what: unknown {sorted(unknown)} (known: {', '.join(MEASURES)})")
    for key, low in (("warmup", 0), ("repeats", 1)):
        if not isinstance(b[key], int) or b[key] < low:
            raise NplmError(f"bench.{key}={b[key]} is invalid: expected an integer >= {low}")
    if not isinstance(b.min_seconds, int | float) or b.min_seconds <= 0:
        raise NplmError(f"bench.min_seconds={b.min_seconds} is invalid: expected a number of seconds > 0")
    if set(b.precisions) - {"auto", *PRECISIONS}:
        raise NplmError(f"bench.precisions={list(b.precisions)} is invalid: expected auto, 32-true and/or bf16-mixed")


def bench(cfg: DictConfig) -> None:
    """Every measurement `bench.what` names, in the order of MEASURES, one line each (the module's doc)."""
    check_config(cfg)
    check_bench(cfg.bench)
    what, corpus = set(cfg.bench.what), load_corpus(cfg.data)
    check_sizes(cfg, corpus.sizes())  # the values against the corpus read, as nplm-train checks them
    what_trains = family(
        cfg.model
    )  # auto: bf16-mixed only for a family shown neutral to it (models/precision.py NEUTRAL)
    exactly = TRAININGS["exact"]  # the train lines' training (below)
    cfg.trainer.precision = job_precision(cfg.trainer.precision, cfg.trainer.accelerator, exactly, what_trains)[0]
    log.info("measuring %s", OmegaConf.to_container(cfg.bench, resolve=True))
    L.seed_everything(cfg.seed, verbose=False)
    if what == {"ngram"}:  # no trained family to build
        bench_ngrams(cfg, corpus)
        return
    # the train lines are the softmax over V trained exactly, whatever output layer the command names
    exact = OmegaConf.merge(cfg, {"optim": {"output": "exact"}, "model": {"output": "standard"}})
    probe = build_module(exact, corpus)  # the family's shapes: FLOPs a token, the output layer's width
    if skipped := what - set(probe.bench_lines) - {"ngram"}:  # the n-gram lines need no family
        log.info("bench.what: no %s line for the %s (nplm-bench's doc)", ", ".join(sorted(skipped)), probe.label)
        what -= skipped
    tokens = next(iter(probe.reads.batches(corpus, "train", cfg.optim.batch_size, True, cfg.seed)))[1].numel()
    unused = {"_target_", "mix", "output", "classes", "class_method"}
    shape = {"family": probe.family, **{k: v for k, v in cfg.model.items() if k not in unused}}
    shape |= {"vocab_size": corpus.vocab_size, "tokens_per_step": tokens}
    # the output layer's share of a token's multiply-adds (the paper's 99.7% for its AP network)
    shape["output_share"] = 1 - probe.flops_per_token(0) / probe.flops_per_token(corpus.vocab_size)
    vocab = corpus.vocab_size
    train_flops = 3 * probe.flops_per_token(vocab)
    rates = matmul_rates(cfg, vocab, tokens, probe.output_width)  # the lines' ceilings
    if "matmul" in what:
        for dtype, rate in rates.items():
            emit(f"matmul {dtype}", **rate, batch=tokens, device=device_of(cfg).type, **shape)
    if "baseline" in what:
        result = baseline(cfg, corpus)
        emit("train baseline float32", **result, **ceiling(train_flops, result, rates["float32"]), **shape)
    keep_freed_memory()  # after the baseline, which runs as a straightforward script would
    concrete = {p: job_precision(p, cfg.trainer.accelerator, exactly, what_trains) for p in cfg.bench.precisions}
    # sampled: the command's own sampling keys, or optim=sampled's, over the family's recipe; float32
    drawn = cfg.optim if training_of(cfg.optim).sampled else hydra.compose("config", ["optim=sampled"]).optim
    model = cfg.model if output_of(cfg.model).trains_sampled else exact.model  # energy trains sampled; classes not
    sampled = OmegaConf.merge(cfg, {"optim": {k: drawn[k] for k in SAMPLING_KEYS}, "model": model})
    classes = OmegaConf.merge(exact, {"model": {"output": "classes"}})

    def flops(layer: str, trained: LanguageModule) -> float:
        """A line's FLOPs a token at the output rows it computes: |V|, the k drawn words and the target (at most:
        the draws' repeats are computed once, so never more rows than |V| and the target), or the classes and a
        token's class (of the line's module's classes)."""
        sampled_rows = min(drawn.samples, vocab) + 1  # k = 500 over |V| = 384 had share_of_matmul read 2.9
        rows = {"exact": vocab, "sampled": sampled_rows}.get(layer) or rows_per_token(trained, corpus)
        return 3 * probe.flops_per_token(rows)

    floors: dict[str, PlainFloor] = {}  # the plain loops, by the line they are the floor of
    if "plain" in what:  # the floors of the training lines named with it, or of all of them
        named = what & {"train", "sampled", "classes"} or {"train", "sampled", "classes"}
        layers = [(f"exact {p}", exact, p) for p in dict.fromkeys(c for c, _ in concrete.values()) if "train" in named]
        if "sampled" in named and output_of(model).plain_loop:  # the energy network's step has none
            layers.append(("sampled", sampled, "32-true"))
        if "classes" in named:  # eq. (1)'s class layer computes in float32 whatever the precision
            layers.append(("classes", classes, "32-true"))
        for name, layer_cfg, precision in layers:
            floors[name] = floor = PlainFloor(layer_cfg, corpus, precision)
            result, matmul = floor.rate(), rates["bfloat16" if precision.startswith("bf16") else "float32"]
            emit(f"plain {name}", **result, **ceiling(flops(name.split()[0], floor.module), result, matmul), **shape)

    module, speeds = None, {}
    for precision in cfg.bench.precisions if what & {"train", "eval", "mixture", "classes"} else []:
        resolved, tags = concrete[precision]  # as nplm-train would
        result, module = train_steps(exact, corpus, resolved, floors.get(f"exact {resolved}"))
        speeds[precision] = result["tokens_per_s"]
        if "train" in what:
            chosen = {"resolved": resolved, **{k.removeprefix("precision."): v for k, v in tags.items()}}
            matmul = rates["bfloat16" if resolved.startswith("bf16") else "float32"]
            emit(
                f"train {precision}",
                **result,
                **ceiling(train_flops, result, matmul),
                **(chosen if precision == "auto" else {}),
                **shape,
            )
    if "sampled" in what:
        result, trained = train_steps(sampled, corpus, "32-true", floors.get("sampled"))
        speedups = {f"x_{p}": result["tokens_per_s"] / speed for p, speed in speeds.items()}
        emit(
            "train sampled",
            **result,
            **ceiling(flops("sampled", trained), result, rates["float32"]),
            samples=drawn.samples,
            proposal=drawn.proposal,
            estimator=drawn.estimator,
            output=model.output,
            **speedups,
            **shape,
        )
    if "profile" in what:
        emit("profile sampled", **profile_steps(sampled, corpus), output=model.output, **shape)
    if "classes" in what:
        for precision in cfg.bench.precisions:
            resolved = concrete[precision][0]
            result, trained = train_steps(classes, corpus, resolved, floors.get("classes"))
            emit(
                f"train classes {precision}",
                **result,
                **ceiling(flops("classes", trained), result, rates["float32"]),  # its small products: float32
                resolved=resolved,
                classes=len(trained.classes.size),
                class_method=classes.model.class_method,
                rows_per_token=rows_per_token(trained, corpus),
                **{f"x_exact_{precision}": result["tokens_per_s"] / speeds[precision]},
                **shape,
            )
    if module is not None and "eval" in what:
        tokens = corpus.size("valid")
        ppl, timing = timed_passes(cfg, lambda: (validate(cfg, module, corpus), tokens))
        emit(
            "eval valid float32",
            **timing,
            **ceiling(probe.flops_per_token(vocab), timing, rates["float32"]),
            tokens=tokens,
            batch=cfg.data.eval_batch_size,
            ppl=float(ppl),
            **shape,
        )
    if module is not None and "mixture" in what:
        mlp, quiet = {}, OmegaConf.merge(cfg, {"trainer": {"enable_progress_bar": False}})  # stdout is for JSON
        for split in ("valid", "test"):
            mlp[split], timing = timed_passes(cfg, functools.partial(_probs_pass, quiet, module, corpus, split))
            emit(f"probs {split} float32", **timing, **shape)
        bench_mixture(cfg, corpus, mlp)
    if "ngram" in what:
        bench_ngrams(cfg, corpus)
    if "parallel" in what:
        bench_parallel(OmegaConf.merge(exact, {"trainer": {"precision": "32-true"}}), corpus, shape)


def bench_parallel(cfg: DictConfig, corpus: Corpus, shape: dict[str, Any]) -> None:
    """The parameter-parallel step, then the asynchronous one lock-free and locked, on each number of processes of
    `bench.processes` the cores allow."""
    cores, alone = len(os.sched_getaffinity(0)), None
    for processes in cfg.bench.processes:
        if processes > cores:
            log.info("bench.processes: no line for %d processes on %d cores", processes, cores)
            continue
        result = blocked_rate(cfg, corpus, processes)
        alone = result["tokens_per_s"] if processes == 1 else alone
        speedup = {"x_M1": result["tokens_per_s"] / alone} if alone else {}
        emit(f"parallel M={processes}", **result, **speedup, processes=processes, threads=1, **shape)
        if processes > 1:
            emit(f"allreduce M={processes}", **allreduce_times(processes), processes=processes)
    alone = None  # lock-free on one process
    for strategy, locked in ((LOCK_FREE, False), (LOCKED, True)):
        for workers in [w for w in cfg.bench.processes if w <= cores]:
            result = shared_rate(cfg, corpus, workers, locked)
            alone = alone or result["tokens_per_s"]
            emit(f"{strategy} W={workers}", **result, x_W1=result["tokens_per_s"] / alone, workers=workers, **shape)


@hydra.main(config_path="pkg://nplm_repro.conf", config_name="bench", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    with errors_exit():
        bench(cfg)


main = cli(_main)

if __name__ == "__main__":
    main()
