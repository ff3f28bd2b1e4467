"""trainer.precision=auto: a concrete precision, chosen by the probe's rates, cached, and never a failure."""

import json
import logging
from pathlib import Path

import mlflow
import pytest
import torch
from helpers import TINY_BROWN, composed, data_slice
from omegaconf import DictConfig

from nplm_repro.data.load import load_corpus
from nplm_repro.models import precision
from nplm_repro.models.outputs import TRAININGS
from nplm_repro.models.precision import MARGIN, job_precision, resolve, training_step_gflops
from nplm_repro.tracking import ledger
from nplm_repro.tracking.keys import config_key

EXACT, SAMPLED = TRAININGS["exact"], TRAININGS["sampled"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path))
    return tmp_path / "precision"


def test_explicit_precisions_pass_through_unprobed(cache: Path) -> None:
    assert resolve("32-true") == ("32-true", {}) and resolve("bf16-mixed") == ("bf16-mixed", {})
    assert not cache.exists()


def test_a_job_computes_in_the_resolved_precision_sampled_in_float32_a_count_in_none(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the ledger keys and tags a job with: sampled training in 32-true whatever the config says, unprobed; an
    exact model of a family shown neutral to bfloat16 in what auto resolves to, with the probe's tags; a counted
    n-gram 32-true on every CPU, untagged, as it computes in none."""
    monkeypatch.setattr(precision, "NEUTRAL", {"mlp": "holds"})
    assert job_precision("auto", "cpu", SAMPLED, "mlp") == ("32-true", {}) and not cache.exists()
    chosen, tags = job_precision("auto", "cpu", EXACT, "mlp")
    assert chosen in ("32-true", "bf16-mixed") and tags["precision.auto"].startswith(chosen)
    assert job_precision("auto", "cpu", None, "kneser_ney") == ("32-true", {})
    assert job_precision("bf16-mixed", "cpu", EXACT, "lstm") == ("bf16-mixed", {})
    assert job_precision("bf16-mixed", "cpu", None, "kneser_ney") == ("bf16-mixed", {})


@pytest.mark.parametrize("family", ["lstm", "transformer", "mlp"])
def test_auto_trains_a_family_not_shown_neutral_to_bfloat16_in_float32_unprobed(cache: Path, family: str) -> None:
    """No family's precision claim holds yet (reports/brown_precision.md): auto gives 32-true without probing, on any
    CPU, and its tag says why; an explicit bf16-mixed is still the user's to ask for."""
    assert family not in precision.NEUTRAL
    chosen, tags = job_precision("auto", "cpu", EXACT, family)
    assert chosen == "32-true" and not cache.exists()
    assert tags["precision.auto"] == (
        f"32-true: bf16-mixed is not shown to leave {family}'s perplexity unchanged (reports/brown_precision.md)"
    )
    assert precision.choices("auto", EXACT, family) == ("32-true",)


def test_auto_picks_the_faster_measured_dtype_and_caches_it(cache: Path) -> None:
    chosen, tags = resolve("auto", "cpu")
    bf16, fp32 = float(tags["precision.bfloat16_gflops"]), float(tags["precision.float32_gflops"])
    assert chosen == ("bf16-mixed" if bf16 > MARGIN * fp32 else "32-true")
    assert tags["precision.auto"].startswith(chosen)
    (cached,) = cache.glob("*.json")
    saved = json.loads(cached.read_text())
    assert saved["gflops"]["float32"] == pytest.approx(fp32, abs=0.06) and saved["torch"]
    # the next run reads the cache instead of measuring: change the rates there and the choice follows them
    other = "32-true" if chosen == "bf16-mixed" else "bf16-mixed"
    saved["gflops"] = {"float32": 100.0, "bfloat16": 400.0 if other == "bf16-mixed" else 50.0}
    cached.write_text(json.dumps(saved))
    assert resolve("auto", "cpu")[0] == other


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


def cached_rates(cache: Path, float32: float, bfloat16: float) -> None:
    """This machine's probe result, as `device_rates` caches it: the next `auto` reads these rates."""
    resolve("auto", "cpu")  # measures and caches once: the file the next runs read
    (cached,) = cache.glob("*.json")
    saved = json.loads(cached.read_text())
    cached.write_text(json.dumps(saved | {"gflops": {"float32": float32, "bfloat16": bfloat16}}))


@pytest.mark.parametrize(
    "float32,bfloat16,chosen", [(25.4, 25.6, "32-true"), (100, 140, "32-true"), (100, 400, "bf16-mixed")]
)
def test_bfloat16_needs_a_clear_lead_so_load_cannot_flip_the_choice(
    float32: float, bfloat16: float, chosen: str, cache: Path
) -> None:
    """The probe measured 25.6 against 25.4 GFLOP/s under load on a Xeon whose bfloat16 does 555: a near-tie is noise."""
    cached_rates(cache, float32, bfloat16)
    assert resolve("auto", "cpu")[0] == chosen


def mlp_job(workdir: Path, *overrides: str) -> DictConfig:
    """A small exact MLP with trainer.precision=auto on the tiny corpus, 2 epochs, into the store in `workdir`."""
    return composed(
        f"data.path={TINY_BROWN}",
        *data_slice(7_000, 1_500, 1_500),
        "experiment=mlp5",
        "model.m=8",
        "model.h=8",
        "trainer.max_epochs=2",
        "trainer.precision=auto",
        f"tracking.uri=sqlite:///{workdir}/m.db",
        f"callbacks.model_checkpoint.dirpath={workdir}/checkpoints",
        *overrides,
    )


def all_runs(workdir: Path) -> list[mlflow.entities.Run]:
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/m.db")
    return client.search_runs([client.get_experiment_by_name("brown").experiment_id])


@pytest.mark.slow  # over 10 s
def test_a_job_keeps_the_precision_its_run_resolved_when_the_probe_would_choose_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of a family auto may train in bfloat16 resolved auto to bf16-mixed; the same command later, with a fresh
    cache whose probe says float32, skips that finished run, resumes it when a kill left it, and marks KILLED a run of
    the other precision left RUNNING, instead of training anew under another config key."""
    monkeypatch.setattr(precision, "NEUTRAL", {"mlp": "holds"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path / "first"))
    cached_rates(tmp_path / "first" / "precision", float32=100, bfloat16=400)
    first, _ = ledger.run(mlp_job(tmp_path))
    (run,) = all_runs(tmp_path)
    assert run.data.params["trainer.precision"] == "bf16-mixed" and run.data.tags["precision.auto"].startswith("bf16")

    monkeypatch.setenv("NPLM_CACHE", str(tmp_path / "second"))  # a fresh cache: this probe says float32
    cached_rates(tmp_path / "second" / "precision", float32=400, bfloat16=100)
    assert ledger.run(mlp_job(tmp_path))[0] == first and len(all_runs(tmp_path)) == 1  # skipped

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    client.set_terminated(first, "KILLED")  # as a kill after its last checkpoint leaves it
    assert ledger.run(mlp_job(tmp_path))[0] == first  # resumed in bf16-mixed, not trained anew in 32-true
    (resumed,) = all_runs(tmp_path)
    assert resumed.info.status == "FINISHED" and resumed.data.params["trainer.precision"] == "bf16-mixed"

    # a run of this job under the other precision, left RUNNING by a kill before its first checkpoint
    orphan = client.create_run(run.info.experiment_id, tags={"config_key": "x"}).info.run_id
    other = mlp_job(tmp_path, "trainer.precision=32-true")
    client.set_tag(orphan, "config_key", config_key(other, load_corpus(other.data).fingerprint))
    assert ledger.run(mlp_job(tmp_path))[0] == first
    assert client.get_run(orphan).info.status == "KILLED" and client.get_run(orphan).data.tags["killed_because"]


@pytest.mark.slow  # over 10 s
def test_one_command_makes_the_same_model_on_a_cpu_with_bfloat16_units_and_on_one_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`auto` on an MLP (no precision claim holds for it yet): the probe of a CPU with bfloat16 units (4x float32) and
    of one without (half of it) give the same precision, the same config key and the same model."""
    found = []
    for cpu, bfloat16 in (("units", 400), ("emulated", 50)):
        (tmp_path / cpu).mkdir()
        monkeypatch.chdir(tmp_path / cpu)
        monkeypatch.setenv("NPLM_CACHE", str(tmp_path / cpu / "cache"))
        cached_rates(tmp_path / cpu / "cache" / "precision", float32=100, bfloat16=bfloat16)
        ledger.run(mlp_job(tmp_path / cpu))
        (run,) = all_runs(tmp_path / cpu)
        found.append((run.data.params["trainer.precision"], run.data.tags["config_key"], run.data.metrics["test_ppl"]))
    assert found[0] == found[1] and found[0][0] == "32-true", found


def test_bf16_mixed_on_a_cpu_without_bfloat16_units_warns_once_naming_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It trained about 60 times slower than float32 on an AVX2-only EPYC, and said nothing. The check is oneDNN's
    (this machine's answer is replaced by each of its two)."""
    cpu = json.loads(precision.cpu_model())["model name"]
    for has_units, warnings in ((True, 0), (False, 1)):
        monkeypatch.setattr(precision, "cpu_has_bf16", lambda has_units=has_units: has_units)
        precision.warn_slow_bf16.cache_clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=precision.__name__):
            for _ in range(2):
                assert precision.resolve("bf16-mixed", "cpu") == ("bf16-mixed", {})
        said = [r.getMessage() for r in caplog.records if "bfloat16 units" in r.getMessage()]
        assert len(said) == warnings, said
    assert said[0].startswith(f"trainer.precision=bf16-mixed on {cpu}, which has no bfloat16 units")
    assert said[0].endswith("(trainer.precision=auto trains in float32 on every CPU)")  # not "measures and chooses"
