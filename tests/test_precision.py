"""trainer.precision=auto: a concrete precision, chosen by the probe's rates, cached, and never a failure."""

import json
from pathlib import Path

import pytest
import torch

from nplm_repro.models.precision import job_precision, resolve, training_step_gflops


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path))
    return tmp_path / "precision"


def test_explicit_precisions_pass_through_unprobed(cache: Path) -> None:
    assert resolve("32-true") == ("32-true", {}) and resolve("bf16-mixed") == ("bf16-mixed", {})
    assert not cache.exists()


def test_a_job_computes_in_the_resolved_precision_sampled_in_float32_a_count_in_none(cache: Path) -> None:
    """What the ledger keys and tags a job with: sampled training in 32-true whatever the config says, unprobed; an
    exact MLP in what auto resolves to, with the probe's tags; a counted n-gram the same precision (its config key
    has always held it) but no tags, as it computes in none."""
    assert job_precision("auto", "cpu", "sampled") == ("32-true", {}) and not cache.exists()
    chosen, tags = job_precision("auto", "cpu", "exact")
    assert chosen in ("32-true", "bf16-mixed") and tags["precision.auto"].startswith(chosen)
    assert job_precision("auto", "cpu", None) == (chosen, {})
    assert job_precision("bf16-mixed", "cpu", "exact") == ("bf16-mixed", {}) == job_precision("bf16-mixed", "cpu", None)


def test_auto_picks_the_faster_measured_dtype_and_caches_it(cache: Path) -> None:
    chosen, tags = resolve("auto", "cpu")
    bf16, fp32 = float(tags["precision.bfloat16_gflops"]), float(tags["precision.float32_gflops"])
    assert chosen == ("bf16-mixed" if bf16 > fp32 else "32-true")
    assert tags["precision.auto"].startswith(chosen)
    (cached,) = cache.glob("*.json")
    saved = json.loads(cached.read_text())
    assert saved["gflops"]["float32"] == pytest.approx(fp32, abs=0.06) and saved["torch"]
    # the next run reads the cache instead of measuring: flip the rates there and the choice follows them
    saved["gflops"] = {"float32": bf16, "bfloat16": fp32} if bf16 != fp32 else {"float32": 1.0, "bfloat16": 2.0}
    cached.write_text(json.dumps(saved))
    flipped, _ = resolve("auto", "cpu")
    assert flipped != chosen or bf16 == fp32


@pytest.mark.parametrize("damage", ["corrupt", "not a directory"])
def test_a_broken_cache_never_fails_a_run(damage: str, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if damage == "corrupt":
        cache.mkdir(parents=True)
        resolve("auto", "cpu")
        (cached,) = cache.glob("*.json")
        cached.write_text("{half a file")
    else:
        blocker = cache.parent / "file"
        blocker.write_text("")
        monkeypatch.setenv("NPLM_CACHE", str(blocker))
    chosen, tags = resolve("auto", "cpu")
    assert chosen in ("32-true", "bf16-mixed") and "precision.float32_gflops" in tags


def test_an_unprobed_accelerator_trains_in_float32(cache: Path) -> None:
    chosen, tags = resolve("auto", "mps")
    assert chosen == "32-true" and "not probed" in tags["precision.auto"]


def test_the_cuda_probe_times_whole_training_steps_under_autocast() -> None:
    """The step probe `auto` runs on CUDA, here on the CPU: a bfloat16 step trains the float32 weights under
    autocast, as bf16-mixed does, and each dtype gets its own rate."""
    torch.manual_seed(0)
    shape = {"batch": 32, "width": 16, "vocab": 64, "repeats": 2, "device": torch.device("cpu")}
    rates = [training_step_gflops(**shape, dtype=dtype) for dtype in (torch.float32, torch.bfloat16)]
    assert all(rate > 0 for rate in rates)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_on_cuda_measures_training_steps(cache: Path) -> None:
    chosen, tags = resolve("auto", "cuda")
    assert chosen in ("32-true", "bf16-mixed") and "training steps" in tags["precision.auto"]
    assert float(tags["precision.bfloat16_gflops"]) > 0 and float(tags["precision.float32_gflops"]) > 0
