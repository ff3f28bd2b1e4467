"""The fast path (bf16 training, allocator setting, benchmark) changes speed, not results."""

import inspect
import itertools
import json
import platform
import time
from pathlib import Path

import mlflow
import pytest
import torch
from helpers import SLICE, data_slice, run_script
from hydra import compose, initialize_config_module
from torch.nn import functional as F

from nplm_repro.clock import Clock
from nplm_repro.data.corpus import Corpus
from nplm_repro.data.load import load_corpus
from nplm_repro.data.windows import loader
from nplm_repro.memory import keep_freed_memory
from nplm_repro.models.bf16_loss import bf16_cross_entropy
from nplm_repro.models.nplm import NPLM
from nplm_repro.models.precision import resolve
from nplm_repro.models.speed import PROFILED_STEPS, TOP_OPS, PlainFloor, train_steps

SHAPES = [(100, False), (50, True), (0, True)]


@pytest.mark.parametrize("h,direct", SHAPES)
def test_output_terms_sum_to_eq1(h: int, direct: bool) -> None:
    torch.manual_seed(0)
    model = NPLM(vocab_size=50, n=4, m=3, h=h, direct=direct).double()
    context = torch.randint(0, 50, (6, 3))
    y = model.b + sum(inputs @ weight.T for inputs, weight in model.output_terms(context))
    torch.testing.assert_close(y, model(context), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("h,direct", SHAPES)
def test_bf16_loss_and_gradients_match_float32_cross_entropy(h: int, direct: bool) -> None:
    torch.manual_seed(0)
    model = NPLM(vocab_size=3000, n=5, m=30, h=h, direct=direct)
    context, target = torch.randint(0, 3000, (256, 4)), torch.randint(0, 3000, (256,))
    exact = F.cross_entropy(model(context), target)
    exact.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    fast = bf16_cross_entropy(model.output_terms(context), model.b, target)
    fast.backward()
    assert fast.item() == pytest.approx(exact.item(), rel=1e-3)
    for name, p in model.named_parameters():  # bf16 rounding: about 0.2% of the gradient's norm
        assert (p.grad - grads[name]).norm() < 0.01 * grads[name].norm(), name
        assert p.grad.dtype == torch.float32 and p.grad.is_contiguous(), name  # kept as is, never copied again


def one_epoch_valid_ppl(brown_path: Path, tmp_path: Path, key: str, values: list[str], *extra: str) -> dict[str, float]:
    """Validation perplexity of one epoch of MLP9 on 40k Brown tokens, same seed, for each value of `key`."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    for value in values:
        result = run_script(
            "nplm-train",
            f"data.path={brown_path}",
            *data_slice(40_000, 10_000, 1_000),
            "experiment=mlp9",
            "trainer.max_epochs=1",
            f"{key}={value}",
            *extra,
            f"tracking.uri={uri}",
            f"hydra.run.dir={tmp_path}/{value}",
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
    return {r.data.params[key]: r.data.metrics["valid_ppl"] for r in runs}


@pytest.mark.slow  # two trainings of one epoch: ~25 s
@pytest.mark.skipif(
    resolve("auto", "cpu")[0] != "bf16-mixed",
    reason="bfloat16 is slower than float32 on this CPU (precision=auto never trains in it here)",
)
def test_bf16_training_reaches_the_float32_perplexity(brown_path: Path, tmp_path: Path) -> None:
    """Same seed, same batches, one epoch of 40k Brown tokens on the CPU: bf16 reaches the float32 perplexity."""
    ppl = one_epoch_valid_ppl(brown_path, tmp_path, "trainer.precision", ["32-true", "bf16-mixed"])
    assert_bf16_reaches_float32(ppl)


def assert_bf16_reaches_float32(ppl: dict[str, float]) -> None:
    """bf16 no more than 2% worse than float32 after the slice's epoch, and no more than 5% better.

    The 1% target is for full Brown (README, Performance). On this slice the rounding of each device's bfloat16
    kernels moves the result, mostly down: valid perplexity bf16 against float32, 170.1 / 173.5 (-1.9%) on an AMD
    EPYC with AVX-512 BF16, 167.1 / 173.3 (-3.6%) on the CPU of an H200 machine, 173.5 / 173.3 (+0.1%) on the
    H200. Better by more than 5% would mean bf16 trains something else."""
    assert ppl["bf16-mixed"] <= ppl["32-true"] * 1.02
    assert ppl["bf16-mixed"] >= ppl["32-true"] * 0.95
    assert ppl["32-true"] < 2000  # it learned something: |V| is 17,907


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_keep_freed_memory_is_accepted_by_glibc() -> None:
    assert keep_freed_memory() is True


class FakeTime:
    """time.perf_counter as a test sets it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_clock_times_rounds_of_at_least_min_seconds_after_the_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two slow warm-up steps, then rounds of 1, 0.5 and 2 s a step: each round takes steps until it has lasted
    2.5 s, the median round's rate is reported with the slowest and the fastest, and the device is waited for
    after the warm-up and at the end of each round only."""
    fake, syncs = FakeTime(), []
    monkeypatch.setattr(time, "perf_counter", fake)
    clock = Clock(warmup=2, min_seconds=2.5, repeats=3, sync=lambda: syncs.append(fake.now))
    steps = [10.0, 10.0] + [1.0] * 3 + [0.5] * 5 + [2.0] * 2
    for i, seconds in enumerate(steps, 1):
        fake.now += seconds
        assert clock.tick(100) == (i == len(steps))
    assert clock.report("steps") == {
        "tokens_per_s": 100.0,
        "tokens_per_s_range": [50.0, 200.0],
        "seconds": 9.5,
        "repeats": 3,
        "steps": 10,
    }
    assert syncs == [20.0, 23.0, 25.5, 29.5]


def test_clock_leaves_out_the_time_before_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """What comes between epochs (validation, the next shuffle) is not the step's time."""
    fake = FakeTime()
    monkeypatch.setattr(time, "perf_counter", fake)
    clock = Clock(warmup=0, min_seconds=3, repeats=1)
    for gap in (0.0, 60.0, 0.0):
        fake.now += gap
        clock.resume()
        fake.now += 1.0
        clock.tick(10)
    assert clock.report("passes") == {
        "tokens_per_s": 10.0,
        "tokens_per_s_range": [10.0, 10.0],
        "seconds": 3.0,
        "repeats": 1,
        "passes": 3,
    }


@pytest.mark.slow  # over 10 s
def test_bench_prints_one_json_object_per_measurement(brown_path: Path, tmp_path: Path) -> None:
    result = run_script(
        "nplm-bench",
        f"data.path={brown_path}",
        *SLICE,
        "experiment=mlp9",
        "bench.warmup=2",
        "bench.min_seconds=0.01",
        "bench.repeats=3",
        "bench.ngram_rows=[del_int,kn3]",
        f"hydra.run.dir={tmp_path}/out",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    rate = {line["what"].split()[1]: line["matmul_gflops"] for line in lines[:2]}
    matmul = {
        line["what"]: rate["bfloat16" if line.get("resolved", "").startswith("bf16") else "float32"]
        for line in lines[2:]
    }
    # their products: bfloat16; a class layer's small ones: float32
    matmul |= {"train bf16-mixed": rate["bfloat16"], "plain exact bf16-mixed": rate["bfloat16"]}
    matmul |= {line["what"]: rate["float32"] for line in lines if line["what"].startswith("train classes")}
    assert [line["what"] for line in lines] == [
        "matmul float32",
        "matmul bfloat16",
        "train baseline float32",
        "plain exact 32-true",  # auto resolves to one of these two
        "plain exact bf16-mixed",
        "plain sampled",
        "plain classes",
        "train 32-true",
        "train bf16-mixed",
        "train auto",
        "train sampled",
        "train classes 32-true",
        "train classes bf16-mixed",
        "train classes auto",
        "eval valid float32",
        "probs valid float32",
        "probs test float32",
        "mixture learned",
        "mixture context",
        "ngram del_int",
        "ngram kn3",
    ]
    for line in lines:  # every line: the median of 3 rounds of at least 0.01 s, with the slowest and fastest
        rate = "matmul_gflops" if line["what"].startswith("matmul") else "tokens_per_s"
        low, high = line[f"{rate}_range"]
        assert 0 < low <= line[rate] <= high, line
        assert line["repeats"] == 3 and line["seconds"] >= 3 * 0.01 and line.get("steps", line.get("passes")) >= 3
        if line["what"].startswith(("train", "plain", "eval")):  # how far from the limit: FLOPs, their rate, its share
            assert line["achieved_gflops"] == pytest.approx(
                line["tokens_per_s"] * line["flops_per_token"] / 1e9, rel=1e-3, abs=1e-3
            )
            assert (
                0
                < line["share_of_matmul"]
                == pytest.approx(line["achieved_gflops"] / matmul[line["what"]], rel=1e-3, abs=1e-3)
            )
    named = {line["what"]: line for line in lines}
    auto, sampled = named["train auto"], named["train sampled"]
    assert auto["resolved"] in ("32-true", "bf16-mixed") and auto["auto"].startswith(auto["resolved"])
    assert (sampled["samples"], sampled["proposal"], sampled["x_32-true"] > 0) == (500, "bigram", True)
    floors = {
        f"train {p}": f"plain exact {named[f'train {p}'].get('resolved', p)}" for p in ("32-true", "bf16-mixed", "auto")
    }
    floors |= {"train sampled": "plain sampled"} | {
        f"train classes {p}": "plain classes" for p in ("32-true", "bf16-mixed", "auto")
    }
    for line in floors:  # each training line against its floor, the plain loop of the same arithmetic, round by round
        low, high = named[line]["x_plain_range"]
        assert 0 < low <= named[line]["x_plain"] <= high and named[line]["plain_tokens_per_s"] > 0, named[line]
    assert set(floors.values()) <= set(named)  # and each floor has its own line
    for precision in ("32-true", "bf16-mixed", "auto"):  # each class line against the exact line of its precision
        classes, exact = named[f"train classes {precision}"], named[f"train {precision}"]
        assert classes[f"x_exact_{precision}"] == pytest.approx(
            classes["tokens_per_s"] / exact["tokens_per_s"], abs=0.01
        )
        assert classes["class_method"] == "exchange" and classes["classes"] <= round(classes["vocab_size"] ** 0.5)
        assert classes["classes"] < classes["rows_per_token"] < classes["vocab_size"]


def tiny_bench(tiny_path: Path, tmp_path: Path, *overrides: str) -> list[dict]:
    """nplm-bench on MLP9 (unless the overrides name another experiment) and 2,000 training tokens of the tiny corpus,
    2 rounds of 0.01 s a line: its JSON lines."""
    result = run_script(
        "nplm-bench",
        f"data.path={tiny_path}",
        *data_slice(2_000, 1_000, 1_000),
        "experiment=mlp9",
        "bench.precisions=32-true",  # one name: the list of it
        "bench.min_seconds=0.01",
        "bench.repeats=2",
        *overrides,
        f"hydra.run.dir={tmp_path}/out",
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.slow  # two benches' start-up and training: about 10 s; the default bench test has the class lines
def test_bench_measures_the_energy_network_sampled_and_a_class_layer_with_its_method(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    overrides = ("model.output=energy", "model.class_method=frequency", "bench.what=[sampled,classes]")
    lines = tiny_bench(tiny_brown_path, tmp_path, *overrides, "bench.warmup=2")
    assert [(line["what"], line.get("output"), line.get("class_method")) for line in lines] == [
        ("train sampled", "energy", None),
        ("train classes 32-true", None, "frequency"),
    ]


@pytest.mark.slow  # two small sequence models' benches: about 30 s
@pytest.mark.parametrize("family", ["lstm", "transformer"])
def test_bench_gives_every_family_the_lines_of_eq1_with_their_ceilings(
    family: str, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """`nplm-bench experiment=lstm` (or transformer): the same train, sampled and class lines as eq. (1)'s, each with
    its FLOPs a token from the family's shapes; eq. (1)'s own lines (the plain baseline) are skipped with a note."""
    small = ["model.width=16", "optim.batch_size=4"] + (
        ["model.context=8", "model.heads=2"] * (family == "transformer")
    )
    what = "bench.what=[matmul,baseline,train,sampled,classes]"
    lines = tiny_bench(tiny_brown_path, tmp_path, f"experiment={family}", *small, what, "bench.warmup=2")
    assert [line["what"] for line in lines] == [
        "matmul float32",
        "matmul bfloat16",
        "train 32-true",
        "train sampled",
        "train classes 32-true",
    ]
    exact, sampled, classes = lines[2:]
    assert {line["family"] for line in lines} == {family}
    assert exact["flops_per_token"] > classes["flops_per_token"] > 0 and sampled["flops_per_token"] > 0
    assert all(line["share_of_matmul"] > 0 for line in lines[2:])
    assert classes["classes"] < classes["rows_per_token"] < classes["vocab_size"]
    # 500 draws over |V| < 500 compute at most |V| rows and the target: it was counted 501 (share_of_matmul 2.9)
    assert classes["vocab_size"] < sampled["samples"] and sampled["flops_per_token"] <= 1.01 * exact["flops_per_token"]


@pytest.mark.slow  # about 15 s of timed rounds
def test_bench_trains_across_epochs_until_its_rounds_are_done(tiny_brown_path: Path, tmp_path: Path) -> None:
    """An epoch of 2,000 tokens is 8 steps: the warm-up alone runs into the third epoch, and the fit still ends when
    the clock's last round does (sampled training runs an epoch of Brown in seconds, a GPU faster still); so does the
    profile's, whose 200 steps run through 25 epochs. Its operators' own times add up to at most a step's."""
    lines = tiny_bench(tiny_brown_path, tmp_path, "bench.what=[train,sampled,profile]", "bench.warmup=20")
    assert [(line["what"], line.get("repeats")) for line in lines] == [
        ("train 32-true", 2),
        ("train sampled", 2),
        ("profile sampled", None),
    ]
    profile = lines[2]
    assert profile["steps"] == PROFILED_STEPS and len(profile["self_ms_per_step"]) == TOP_OPS
    assert "aten::addmm" in profile["self_ms_per_step"]  # the sampled output layer's products
    assert 0 < sum(profile["self_ms_per_step"].values()) + profile["others_ms_per_step"] <= profile["ms_per_step"]


def test_a_training_line_runs_a_round_of_its_floor_after_each_of_its_own(
    tiny_brown_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x_plain compares rounds timed in the same seconds: the floor runs one round at the end of each of the
    training line's rounds, from inside the fit (a training step's end), and the line's ratio is the median of the
    paired rounds'."""
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path))
    with initialize_config_module(config_module="nplm_repro.conf", version_base="1.3"):
        overrides = [f"data.path={tiny_brown_path}", *data_slice(2_000, 1_000, 1_000), "experiment=mlp9"]
        timing = ["bench.min_seconds=0.01", "bench.repeats=3", "bench.warmup=2", "optim=sampled"]
        cfg = compose("bench", overrides=[*overrides, *timing])
    corpus = load_corpus(cfg.data)
    floor, rounds = PlainFloor(cfg, corpus, "32-true"), []

    def run_round(clock: Clock) -> None:
        inside = any(frame.function == "on_train_batch_end" for frame in inspect.stack())
        before = len(clock.rounds)
        PlainFloor.run_round(floor, clock)
        rounds.append((inside, before, len(clock.rounds)))

    floor.run_round = run_round
    result, _ = train_steps(cfg, corpus, "32-true", floor)
    assert rounds == [(True, 0, 1), (True, 1, 2), (True, 2, 3)]
    low, high = result["x_plain_range"]
    assert 0 < low <= result["x_plain"] <= high and result["plain_tokens_per_s"] > 0


@pytest.mark.parametrize(  # each starts nplm-bench (about 6 s): one in the default suite, the others slow
    "override",
    [
        "bench.what=[]",
        *(
            pytest.param(o, marks=pytest.mark.slow)
            for o in ("bench.what=[speed]", "bench.min_seconds=0", "bench.repeats=0", "bench.precisions=[16-mixed]")
        ),
    ],
)
def test_bench_bad_value_is_one_line_and_exit_2(override: str, tmp_path: Path) -> None:
    result = run_script("nplm-bench", override, f"hydra.run.dir={tmp_path}/out", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nplm-bench: error: bench.")
    assert result.stdout == ""


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_gpu_training_steps_never_wait_for_the_device(brown: Corpus) -> None:
    """Windows on the GPU, batches gathered there, bf16 loss, fused SGD: no step synchronises with the host."""
    batches = loader(brown, "train", 5, 256, shuffle=True, seed=1).to("cuda")
    model = NPLM(brown.vocab_size, n=5, m=30, h=100, direct=False).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.28, weight_decay=1e-4, fused=True)
    steps = iter(batches)
    first = next(steps)  # the epoch's permutation is drawn on the CPU and copied to the device once, here
    torch.cuda.set_sync_debug_mode("error")
    try:
        for context, target in itertools.islice(itertools.chain([first], steps), 20):
            assert context.is_cuda and target.is_cuda
            bf16_cross_entropy(model.output_terms(context), model.b, target).backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(p).all() for p in model.parameters())


@cuda
def test_nplm_train_on_gpu_scores_as_on_cpu(brown_path: Path, tmp_path: Path) -> None:
    """The same command in float32 on the GPU (accelerator auto picks it) and on the CPU: the same perplexity
    within 1% (measured on an H200: 173.32 against 173.33). In bf16 each device rounds in its own kernels, so
    bf16 is compared with float32 on the same device (the next test), not across devices."""
    ppl = one_epoch_valid_ppl(brown_path, tmp_path, "trainer.accelerator", ["auto", "cpu"], "trainer.precision=32-true")
    assert ppl["auto"] == pytest.approx(ppl["cpu"], rel=0.01)


@cuda
def test_bf16_training_on_gpu_reaches_the_float32_perplexity(brown_path: Path, tmp_path: Path) -> None:
    ppl = one_epoch_valid_ppl(
        brown_path, tmp_path, "trainer.precision", ["32-true", "bf16-mixed"], "trainer.accelerator=gpu"
    )
    assert_bf16_reaches_float32(ppl)
