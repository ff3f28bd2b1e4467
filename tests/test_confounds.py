"""A verdict is a controlled comparison: two arms that differ in a key their claim does not name are "confounded", in the
report (each key with both values) and, where the composed jobs already show it, in the sweep before any job."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import composed, evidence_of
from hydra import compose, initialize_config_module

from nplm_repro.errors import NplmError
from nplm_repro.reporting.claims import HOLDS, check_claims
from nplm_repro.reporting.formats import pct
from nplm_repro.tracking.confounds import CONFOUNDED, allowed, differences
from nplm_repro.sweeping.sweep import check_declaration
from nplm_repro.tracking.study_rows import job_config

EXACT = {"model.output": "standard", "optim.output": "exact", "trainer.precision": "bf16-mixed"}
SAMPLED = {
    "model.output": "standard",
    "optim.output": "sampled",
    "optim.samples": "500",
    "optim.proposal": "bigram",
    "optim.estimator": "importance",
    "trainer.precision": "32-true",
}


def lstm_rows(exact: dict[str, str], sampled: dict[str, str]) -> pd.DataFrame:
    """Two LSTM rows told apart by optim.output, with the configurations given, the sampled one 5% better."""
    rows = [
        {"label": "LSTM optim.output=exact", "config": json.dumps(exact), "test_ppl": 200.0},
        {"label": "LSTM optim.output=sampled", "config": json.dumps(sampled), "test_ppl": 190.0},
    ]
    table = pd.DataFrame(rows).assign(family="lstm", kind="trained", status="finished", valid_ppl=210.0)
    return table.assign(paper_valid_ppl=float("nan"), paper_test_ppl=float("nan"))


CLAIM = {
    "claim": "Sampled training beats the exact softmax",
    "better": [["LSTM optim.output=exact", "LSTM optim.output=sampled"]],
    "varies": ["optim.output"],
}


def test_two_arms_that_also_differ_in_precision_and_validation_are_confounded_naming_both_keys() -> None:
    """brown_lstm_sampled's first pair: the sampled arm in float32 on a quarter of validation, the exact arm in
    bfloat16 on all of it. Its claim names the output layer only: no holds, but each other key with both values."""
    exact = EXACT | {"trainer.limit_val_batches": "None"}
    sampled = SAMPLED | {"trainer.limit_val_batches": "0.25"}
    table = lstm_rows(exact, sampled)
    (claim,) = check_claims([CLAIM], table, evidence_of(table))
    assert claim.verdict == CONFOUNDED
    assert (
        "confounded: they also differ in trainer.limit_val_batches (None / 0.25), trainer.precision (bf16-mixed / "
        "32-true)" in claim.evidence[0]
    )
    assert claim.measured == ()  # nothing to draw as if it were a verdict


def test_the_same_arms_run_alike_get_their_verdict_and_the_sampled_layers_knobs_come_with_it() -> None:
    """Equal precision and the whole validation split in both (None and 1.0 are the same split): the claim holds,
    though the sampled arm alone has optim.samples, proposal and estimator (they come with optim.output), and the
    line says which declared key differed."""
    exact = EXACT | {"trainer.precision": "32-true", "trainer.limit_val_batches": "None"}
    sampled = SAMPLED | {"trainer.limit_val_batches": "1.0"}
    table = lstm_rows(exact, sampled)
    (claim,) = check_claims([CLAIM], table, evidence_of(table))
    assert claim.verdict == HOLDS, claim.evidence
    assert (
        "; it varies optim.estimator ((unset) / importance), optim.output (exact / sampled), optim.proposal ((unset) / "
        "bigram), optim.samples ((unset) / 500), 95% interval" in claim.evidence[0]
    )


def test_a_key_the_claim_declares_may_differ() -> None:
    table = lstm_rows(EXACT, SAMPLED)
    assert check_claims([CLAIM], table, evidence_of(table))[0].verdict == CONFOUNDED
    declared = CLAIM | {"varies": ["optim.output", "trainer.precision"]}
    assert check_claims([declared], table, evidence_of(table))[0].verdict == HOLDS


def test_beside_a_counted_row_only_the_data_and_the_code_are_compared() -> None:
    """An n-gram has no training of its own: the trainer keys of the row beside it are no difference, its data is."""
    trained = {"trainer.precision": "32-true", "data.split.train": "800000"}
    mixed = {"trainer.precision": "auto", "data.split.train": "800000"}
    assert differences(trained, mixed, allowed(), both_trained=False) == []
    other = mixed | {"data.split.train": "6000"}
    assert differences(trained, other, allowed(), both_trained=False) == [
        ("data.split.train", "800000", "6000")
    ]


STUDY = """\
# @package _global_
study: {name}
reporting:
  claims:
  - claim: "Sampled training costs the LSTM nothing"
    margin: 0.02
    equivalent: [[LSTM optim.output=exact, LSTM optim.output=sampled]]
    varies: [optim.output]
hydra:
  mode: MULTIRUN
  sweeper:
    params:
      experiment: lstm_exact,lstm_sampled
"""


@pytest.mark.parametrize("same_validation", [False, True])
def test_a_sweep_refuses_a_confounded_claim_before_any_job(tmp_path: Path, same_validation: bool) -> None:
    """The old brown_lstm_sampled (optim=sampled watches a quarter of validation, the exact arm all of it) is one line
    naming the key and both values, from the composed jobs; the same study validating alike passes."""
    (tmp_path / "study").mkdir()
    text = STUDY.format(name="confounded_lstm")
    if same_validation:
        text = text.replace("reporting:", "trainer:\n  limit_val_batches: null\nreporting:")
    (tmp_path / "study" / "confounded_lstm.yaml").write_text(text)
    overrides = [f"hydra.searchpath=[file://{tmp_path}]", "study=confounded_lstm", "trainer.precision=32-true"]
    with initialize_config_module(config_module="nplm_repro.conf", version_base="1.3"):
        config = compose("config", overrides=overrides, return_hydra_config=True)
        if same_validation:
            check_declaration(config)
            return
        with pytest.raises(NplmError) as refused:
            check_declaration(config)
    assert str(refused.value) == (
        "study=confounded_lstm: claim 'Sampled training costs the LSTM nothing', LSTM optim.output=exact against LSTM "
        "optim.output=sampled: confounded: they also differ in trainer.limit_val_batches (None / 0.25); run them "
        "alike, or name the keys in the claim's `varies`"
    )


def test_a_sweep_compares_the_precision_a_job_will_compute_in_not_the_word_auto() -> None:
    """A row at the default `auto` against one at explicit 32-true was refused as "confounded (auto / 32-true)",
    though an MLP trains in float32 under both, with one run key; the report of the same runs gave a verdict."""
    auto, explicit = (job_config(composed("experiment=mlp9", f"trainer.precision={p}")) for p in ("auto", "32-true"))
    assert auto["trainer.precision"] == explicit["trainer.precision"] == "32-true"
    assert differences(auto, explicit, allowed()) == []
    bf16 = job_config(composed("experiment=mlp9", "trainer.precision=bf16-mixed"))
    assert differences(auto, bf16, allowed()) == [("trainer.precision", "32-true", "bf16-mixed")]



# Run by run: a row's runs, one per seed, each with what it recorded (tracking/runs.py tidy's columns)
MLP = {"model._target_": "mlp", "model.n": "5", "model.h": "50", "model.output": "standard", "optim.output": "exact"}
RAN = {"trainer.precision": "32-true", "trainer.max_epochs": "20", "optim.lr": "0.005", "optim.batch_size": "256"}
WHERE = {"code": "abc123", "cpu_model": "AMD EPYC 9R14", "torch": "2.13.0+cpu", "threads": 1.0}


def arms(
    rows: dict[str, tuple[dict[str, str], list[dict]]], kind: str = "trained"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A report's table and its runs: each row (label -> its configuration and its runs' own values, one dict a
    seed, seeds 1, 2, ... unless one says `seed`), the second row 5% better on test."""
    table, runs = [], []
    for i, (label, (config, seeds)) in enumerate(rows.items()):
        ids = []
        for s, own in enumerate(seeds, 1):
            run = {"run_id": f"{i}-{s}", "seed": str(s), "kind": kind, "mixes": "", **WHERE} | own
            run["config"] = json.dumps(config | run.pop("config", {}))
            runs.append(run)
            ids.append(run["run_id"])
        table.append({"label": label, "config": json.dumps(config), "run_ids": " ".join(ids), "test_ppl": 200 - 10 * i})
    frame = pd.DataFrame(table).assign(family="mlp", kind=kind, status="finished", valid_ppl=210.0)
    return frame.assign(paper_valid_ppl=float("nan"), paper_test_ppl=float("nan")), pd.DataFrame(runs)


def verdict(claim: dict, table: pd.DataFrame, runs: pd.DataFrame) -> tuple[str, str]:
    (checked,) = check_claims([claim], table, evidence_of(table), runs=runs)
    return checked.verdict, checked.evidence[0]


BATCH = {
    "claim": "Batches of 1024 cost MLP1 less than 1% against 256",
    "margin": 0.5,
    "equivalent": [["MLP1 optim.batch_size=256", "MLP1 optim.batch_size=1024"]],
    "varies": ["optim.batch_size"],
}


@pytest.mark.parametrize(
    ("more", "named"),
    [
        ({"optim.lr": "0.00125"}, "optim.lr (0.005 / 0.00125)"),
        (
            {"trainer.max_epochs": "40", "trainer.precision": "bf16-mixed"},
            "trainer.max_epochs (20 / 40), trainer.precision (32-true / bf16-mixed)",
        ),
    ],
)
def test_a_label_never_absorbs_a_difference(more: dict[str, str], named: str) -> None:
    """brown_batch's 1024 arm also at another rate, or another ceiling and precision: the table's labels carry those
    keys (they tell its configurations apart), and a label once let them differ; only `varies` does now."""
    small = MLP | RAN
    large = small | {"optim.batch_size": "1024"} | more
    labels = [" ".join(["MLP1", *(f"{k}={c[k]}" for k in sorted({"optim.batch_size", *more}))]) for c in (small, large)]
    table, runs = arms({labels[0]: (small, [{}, {}]), labels[1]: (large, [{}, {}])})
    found, line = verdict(BATCH, table, runs)
    assert found == CONFOUNDED and line.endswith(f"confounded: they also differ in {named}"), line


def test_a_key_that_sorts_before_the_claims_words_still_finds_its_rows() -> None:
    """Two runs of one pair differing in the patience made labels that start with it; the claim's row, `MLP1
    optim.batch_size=1024`, was then no label's start and the claim "not measured": it is found, and confounded."""
    small = MLP | RAN | {"callbacks.early_stopping.patience": "3"}
    large = small | {"optim.batch_size": "1024", "callbacks.early_stopping.patience": "5"}
    rows = {
        "MLP1 callbacks.early_stopping.patience=3 optim.batch_size=256": (small, [{}]),
        "MLP1 callbacks.early_stopping.patience=5 optim.batch_size=1024": (large, [{}]),
    }
    found, line = verdict(BATCH, *arms(rows))
    assert found == CONFOUNDED and line.endswith("differ in callbacks.early_stopping.patience (3 / 5)"), line


def test_one_validation_batch_is_not_the_whole_split() -> None:
    """Lightning reads `limit_val_batches=1` (an int) as one batch, `1.0` and null as all of them."""
    whole, one = MLP | RAN | {"trainer.limit_val_batches": "None"}, MLP | RAN | {"trainer.limit_val_batches": "1"}
    exact = {"claim": "h=100 beats h=50", "better": [["MLP h=50", "MLP h=100"]]}
    found, line = verdict(exact, *arms({"MLP h=50": (whole, [{}]), "MLP h=100": (one | {"model.h": "100"}, [{}])}))
    assert found == CONFOUNDED and line.endswith("trainer.limit_val_batches (None / 1)"), line
    fraction = one | {"model.h": "100", "trainer.limit_val_batches": "1.0"}
    assert verdict(exact, *arms({"MLP h=50": (whole, [{}]), "MLP h=100": (fraction, [{}])}))[0] == HOLDS


@pytest.mark.parametrize(
    ("second", "named"),
    [
        ([{"code": "def456"}, {"code": "def456"}], "run.code (abc123 / def456)"),
        ([{"cpu_model": "Intel Xeon"}, {}], "run.cpu_model (AMD EPYC 9R14 / Intel Xeon)"),
        ([{"torch": "2.5.1+cpu"}, {}], "run.torch (2.13.0+cpu / 2.5.1+cpu)"),
        ([{"threads": 2.0}, {"threads": 2.0}], "run.threads (1 / 2)"),
        ([{}], "seeds (1,2 / 1)"),
    ],
)
def test_the_code_the_cpu_torch_threads_and_seeds_are_compared(second: list[dict], named: str) -> None:
    """Every run's own record, matched by seed: arms of one configuration that ran other code, on another CPU, torch
    or thread count, or on other seeds, compare more than the model."""
    claim = {"claim": "h=100 beats h=50", "better": [["MLP h=50", "MLP h=100"]]}
    rows = {"MLP h=50": (MLP | RAN, [{}, {}]), "MLP h=100": (MLP | RAN | {"model.h": "100"}, second)}
    found, line = verdict(claim, *arms(rows))
    assert found == CONFOUNDED and line.endswith(f"confounded: they also differ in {named}"), line
    alike = {"MLP h=50": rows["MLP h=50"], "MLP h=100": (rows["MLP h=100"][0], [{}, {}])}
    assert verdict(claim, *arms(alike))[0] == HOLDS


def test_a_class_output_layer_computes_in_float32_under_bf16_mixed() -> None:
    """Both arms record `trainer.precision=bf16-mixed`, but the class layer's products run in float32: the
    precision that ran differs, and the output layer is not all the pair varies."""
    exact = MLP | RAN | {"trainer.precision": "bf16-mixed"}
    classes = exact | {"model.output": "classes", "model.classes": "100"}
    claim = {"claim": "classes cost nothing", "margin": 0.5, "equivalent": [["MLP exact", "MLP classes"]]}
    found, line = verdict(claim, *arms({"MLP exact": (exact, [{}]), "MLP classes": (classes, [{}])}))
    assert found == CONFOUNDED
    assert line.endswith("trainer.precision (bf16-mixed / bf16-mixed (output layer 32-true))"), line
    float32 = {"MLP exact": (exact | RAN, [{}]), "MLP classes": (classes | RAN, [{}])}
    assert verdict(claim, *arms(float32))[0] == HOLDS


def test_two_mixtures_are_compared_through_the_runs_they_mix() -> None:
    """Two weightings of one MLP's mixture with the trigram: beside each other only their data was compared, so
    mixtures of MLPs trained differently passed. Their components' runs are compared now."""
    trigram = {"run_id": "t", "seed": "1", "kind": "counted", "mixes": "", **WHERE}
    trigram["config"] = json.dumps({"data.x": "1"})
    mlps = [
        {"run_id": f"m{i}", "seed": "1", "kind": "trained", "mixes": "", **WHERE, "config": json.dumps(MLP | RAN | c)}
        for i, c in enumerate(({}, {"trainer.max_epochs": "40"}))
    ]
    mixed = [
        {"run_id": f"x{i}", "seed": "1", "kind": "mixed", "mixes": f"m{i},t", **WHERE}
        | {"config": json.dumps(MLP | RAN | {"model.mix": mode})}
        for i, mode in enumerate(("learned", "context"))
    ]
    labels = ["MLP mix=learned", "MLP mix=context"]
    table = pd.DataFrame(
        {"label": labels, "config": [m["config"] for m in mixed], "run_ids": ["x0", "x1"], "test_ppl": [200.0, 190.0]}
    ).assign(family="mlp", kind="mixed", status="finished", valid_ppl=210.0)
    table = table.assign(paper_valid_ppl=np.nan, paper_test_ppl=np.nan)
    runs = pd.DataFrame([trigram, *mlps, *mixed])
    claim = {"claim": "per-context weights help", "better": [labels]}
    found, line = verdict(claim, table, runs)
    assert found == CONFOUNDED and line.endswith("they also differ in trainer.max_epochs (20 / 40)"), line
    runs.loc[runs["run_id"] == "m1", "config"] = mlps[0]["config"]
    assert verdict(claim, table, runs)[0] == HOLDS
    second = {**mlps[0], "run_id": "m2", "config": json.dumps(MLP | RAN | {"model.h": "100", "optim.lr": "0.1"})}
    runs = pd.concat([runs, pd.DataFrame([second])], ignore_index=True)
    runs.loc[runs["run_id"] == "x1", "mixes"] = "m1,m2"  # what it mixes beyond its first run, its name says
    assert verdict(claim, table, runs)[0] == HOLDS
    runs.loc[runs["run_id"] == "m2", "code"] = "def456"  # but not the code that run came from
    found, line = verdict(claim, table, runs)
    assert found == CONFOUNDED and "mixed with.1.run.code (abc123 / def456)" in line, line


def test_a_glob_in_varies_prints_the_keys_that_did_differ() -> None:
    """`varies: [optim.*]` admits every optimiser key: the line names those that differed, with both values."""
    claim = {"claim": "h=100 beats h=50", "better": [["MLP h=50", "MLP h=100"]], "varies": ["optim.*"]}
    tuned = MLP | RAN | {"model.h": "100", "optim.lr": "0.00125"}
    found, line = verdict(claim, *arms({"MLP h=50": (MLP | RAN, [{}]), "MLP h=100": (tuned, [{}])}))
    assert found == HOLDS and "test 200.0 against 190.0, +5.3%; it varies optim.lr (0.005 / 0.00125), 95%" in line


def test_an_effect_under_a_twentieth_of_a_percent_is_printed_as_under_a_tenth() -> None:
    """MLP9 in bf16-mixed against 32-true moved test perplexity by +0.0% [-0.0%, +0.0%]: read as a measured zero.
    Under 0.05% either way, a difference is `< 0.1%`."""
    assert [pct(v) for v in (0.0, 0.0004, -0.00049, 0.0005, -0.0123, float("nan"))] == [
        "< 0.1%",
        "< 0.1%",
        "< 0.1%",
        "+0.1%",
        "-1.2%",
        "",
    ]
