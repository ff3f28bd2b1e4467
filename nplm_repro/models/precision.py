"""`trainer.precision=auto`: bf16-mixed only for a family shown to train as well in it (NEUTRAL), and only where this
device's bfloat16 products are measured to be faster.

The training time of eq. (1) is the |V|-wide output layer's three products. On a CPU with bfloat16 units
(AVX-512 BF16, AMX) they run several times faster in bfloat16 than in float32; on an AVX2-only CPU torch
emulates bfloat16 and the same products run 4 to 20 times slower (and round worse). So `auto` times the
products in both dtypes (under a second) and takes bf16-mixed only if it is faster. On CUDA the products
are always faster in bfloat16, yet a whole step need not be (an H200 trained MLP9 in bf16-mixed at 0.74x of
32-true: autocast's casts and launches outweigh small products), so there `auto` times whole training steps of
the probe's output layer, under bf16 autocast and without, and takes bf16-mixed only if its step is faster (never
where `torch.cuda.is_bf16_supported` says no). The result is cached per device model and torch version under
`$NPLM_CACHE/precision/`. The probe never fails a run: if it cannot measure, 32-true. bf16-mixed needs a clear lead
(MARGIN), so that load on the machine during the probe cannot flip the choice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

from nplm_repro.cache import cache_root
from nplm_repro.errors import NplmError
from nplm_repro.machine import cpuinfo
from nplm_repro.models.outputs import Training

log = logging.getLogger(__name__)

PRECISIONS = ("32-true", "bf16-mixed")
DTYPES = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16}
PROBE = {"batch": 256, "width": 128, "vocab": 4096}  # a small output layer; the ratio is what matters
# bfloat16 is chosen only where its products are this many times as fast as float32's: where bfloat16 has units it
# measures 3 to 5 times (docs/performance.md), emulated a quarter or less, so a near-tie is load on the machine, never
# a reason to round worse; a run's later resumes read its choice from the run (tracking/ledger.py), never the probe.
MARGIN = 1.5
# The families `auto` may train in bf16-mixed: those whose claim of the precision study, "bf16-mixed training changes
# test perplexity by less than 2%" (sweeps/brown_precision.yaml: each family in both precisions, all else equal, 3
# seeds), holds by its paired interval in reports/brown_precision.md; each with the line that admitted it. Under
# `auto` every other family trains in 32-true whatever this CPU's bfloat16 speed, so one command makes the same
# models on every CPU. Until a family's verdict is in, it is not here.
NEUTRAL: dict[str, str] = {}
STUDY = "reports/brown_precision.md"


def best_seconds(work: Callable[[], object], repeats: int, sync: Callable[[], object] = lambda: None) -> float:
    """The fastest of `repeats` timed calls, after one untimed call (first-call setup is not the rate); `sync` waits
    for a device's queued work (torch.cuda.synchronize), so a call counts what it computed, not what it launched."""
    work()
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        work()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def output_layer_gflops(batch: int, width: int, vocab: int, dtype: torch.dtype, repeats: int) -> float:
    """GFLOP/s of an output layer's three training products in `dtype`: forward y = z O^T, backward dy O and
    dy^T z (z: batch x width, O: vocab x width), each the best of `repeats`."""
    z, O = torch.randn(batch, width, dtype=dtype), torch.randn(vocab, width, dtype=dtype)
    dy = torch.randn(batch, vocab, dtype=dtype)
    products = (z, O.T), (dy, O), (dy.T, z)
    seconds = sum(best_seconds(functools.partial(torch.mm, a, b), repeats) for a, b in products)
    return 3 * 2 * batch * width * vocab / seconds / 1e9


def training_step_gflops(
    batch: int, width: int, vocab: int, dtype: torch.dtype, repeats: int, device: torch.device
) -> float:
    """GFLOP/s of whole training steps of an output layer (softmax cross-entropy of z O^T, backward, SGD update of
    O) on `device`, under autocast to `dtype` when it is not float32, as bf16-mixed trains: the three products'
    FLOPs over the best of `repeats` steps' time, so that casts and launches count against bfloat16."""
    z, O = torch.randn(batch, width, device=device), torch.randn(vocab, width, device=device, requires_grad=True)
    target = torch.randint(vocab, (batch,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = F.cross_entropy(z @ O.T, target)
        loss.backward()
        with torch.no_grad():
            O.sub_(O.grad, alpha=1e-3)
        O.grad = None

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return 3 * 2 * batch * width * vocab / best_seconds(step, repeats, sync) / 1e9


def cuda_model() -> str:
    """What identifies a CUDA device's arithmetic: its name and compute capability."""
    return json.dumps({"cuda": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability())})


def cpu_model() -> str:
    """What identifies this CPU's arithmetic: its model name, family/model/stepping and feature flags (a VM may
    name Zen 1 and Zen 4 both "AMD EPYC"), and torch's kernel level."""
    found = cpuinfo()
    fields = {k: found[k] for k in ("model name", "cpu family", "model", "stepping", "flags") if k in found}
    if not found:
        fields["model name"] = platform.processor() or platform.machine()
    fields["capability"] = torch.backends.cpu.get_cpu_capability()
    return json.dumps(fields, sort_keys=True)


def _cache_file(device: str) -> Path:
    digest = hashlib.sha256(f"{device}|torch {torch.__version__}".encode()).hexdigest()[:16]
    return cache_root() / "precision" / f"{digest}.json"


def measure(device: str = "cpu", repeats: int = 3) -> dict[str, float]:
    """The probe's GFLOP/s in float32 and bfloat16 on `device`: on a CPU its products, with the current torch
    threads; on CUDA whole training steps (`training_step_gflops`)."""
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        if device == "cuda":
            rate = training_step_gflops(**PROBE, dtype=dtype, repeats=repeats, device=torch.device("cuda"))
        else:
            rate = output_layer_gflops(**PROBE, dtype=dtype, repeats=repeats)
        rates[str(dtype).removeprefix("torch.")] = rate
    return rates


def device_rates(device: str = "cpu") -> dict[str, float]:
    """The probe's rates for this device (cpu or cuda) and torch version, from the cache when measured before."""
    model = cuda_model() if device == "cuda" else cpu_model()
    try:
        path = _cache_file(model)
        return json.loads(path.read_text())["gflops"]
    except NplmError as error:  # the cache is no directory: measured all the same, and cached nowhere
        log.warning("precision=auto: %s; the probe's result is not cached", error)
        return measure(device)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rates = measure(device)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{time.time_ns()}.tmp")
        temporary.write_text(json.dumps({"device": json.loads(model), "torch": torch.__version__, "gflops": rates}))
        temporary.replace(path)  # atomic: a concurrent run reads the old file or the new one, never half of one
    except OSError as error:
        log.warning("precision=auto: cannot cache the probe's result at %s (%s)", path, error)
    return rates


def cuda_chosen(accelerator: str) -> bool:
    """Whether a run on `accelerator` (trainer.accelerator) trains on CUDA."""
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def cpu_has_bf16() -> bool:
    """Whether this CPU has bfloat16 units (AVX-512 BF16, AMX) that oneDNN uses: without them bf16-mixed emulates its
    products, about 60 times slower than float32 (an AVX2-only EPYC)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def warn_slow_bf16(cpu: str) -> None:
    """Once a process: bf16-mixed on a CPU without bfloat16 units trains, but many times slower than float32."""
    log.warning(
        "trainer.precision=bf16-mixed on %s, which has no bfloat16 units: its products are emulated, many times "
        "slower than float32 (trainer.precision=auto trains in float32 on every CPU)",
        cpu,
    )


def resolve(precision: str, accelerator: str = "auto") -> tuple[str, dict[str, str]]:
    """The concrete precision for `precision` (auto, 32-true or bf16-mixed) on `accelerator`, and tags saying
    how auto chose it (`precision.auto`, `precision.<dtype>_gflops`); explicit values pass through untouched."""
    if precision == "bf16-mixed" and not cuda_chosen(accelerator) and not cpu_has_bf16():
        warn_slow_bf16(json.loads(cpu_model()).get("model name", "this CPU"))
    if precision != "auto":
        return precision, {}
    try:
        device = "cpu"
        if cuda_chosen(accelerator):
            if not torch.cuda.is_bf16_supported():
                return "32-true", {"precision.auto": f"32-true: cuda {torch.cuda.get_device_name()} has no bfloat16"}
            device = "cuda"
        elif accelerator not in ("cpu", "auto"):
            return "32-true", {"precision.auto": f"32-true: accelerator {accelerator} (bfloat16 not probed)"}
        rates = device_rates(device)
    except Exception as error:  # noqa: BLE001  the probe must never fail a run: float32 is always right
        log.warning("precision=auto: the probe failed (%s); training in 32-true", error)
        return "32-true", {"precision.auto": f"32-true: probe failed ({type(error).__name__})"}
    chosen = "bf16-mixed" if rates["bfloat16"] > MARGIN * rates["float32"] else "32-true"
    tags = {f"precision.{dtype}_gflops": f"{rate:.1f}" for dtype, rate in rates.items()}
    on = f" on cuda {torch.cuda.get_device_name()} (training steps)" if device == "cuda" else ""
    why = f"{chosen}: bfloat16 {rates['bfloat16']:.1f} against float32 {rates['float32']:.1f} GFLOP/s{on}"
    why += f" (bf16-mixed where {MARGIN:g} times as fast)"
    log.info("precision=auto -> %s", why)
    return chosen, tags | {"precision.auto": why}


def choices(precision: str, training: Training | None, family: str | None = None) -> tuple[str, ...]:
    """The precisions a job may compute in before the probe has spoken: both for `auto` on a family it may train in
    bf16-mixed (NEUTRAL: its run may already have resolved it, which the ledger reads from the run) unless its
    `training` computes in a precision of its own, and on a counted model (`training` None: a store may hold its run
    under the precision the probe gave before), else the one `job_precision` gives."""
    forced = training.precision if training is not None else None
    if precision == "auto" and forced is None and (training is None or family in NEUTRAL):
        return PRECISIONS
    return (forced or "32-true",) if forced or precision == "auto" else (precision,)


def job_precision(
    precision: str, accelerator: str, training: Training | None, family: str | None = None
) -> tuple[str, dict[str, str]]:
    """The concrete precision a job computes in, and the tags its run keeps (`resolve`'s), for a job of `family`
    whose model trains as `training` says (optim.output, models/outputs.py `training_of`), or is counted (None, an
    n-gram).

    A training with a precision of its own computes in it whatever the config says (sampled training in float32: it
    allows auto or 32-true, bf16-mixed would be recorded but not used). Under `auto` a trained family not shown neutral
    to bfloat16 (NEUTRAL) trains in 32-true, unprobed, and its tag says why. A counted model computes in no precision:
    under `auto` its key says 32-true on every CPU (a run a store keyed bf16-mixed before is still found: `choices`),
    and it keeps no tags.
    """
    forced = training.precision if training is not None else None
    if forced or (precision == "auto" and training is None):
        return forced or "32-true", {}
    if precision == "auto" and family not in NEUTRAL:
        why = f"32-true: bf16-mixed is not shown to leave {family}'s perplexity unchanged ({STUDY})"
        log.info("precision=auto -> %s", why)
        return "32-true", {"precision.auto": why}
    chosen, tags = resolve(precision, accelerator)
    return chosen, tags if training is not None else {}
