"""A verdict is a controlled comparison: two arms that differ in a key their claim does not name are "confounded", in the
report (each key with both values) and, where the composed jobs already show it, in the sweep before any job."""

import json
from pathlib import Path

import pandas as pd
import pytest
from helpers import composed, evidence_of
from hydra import compose, initialize_config_module

from nplm_repro.errors import NplmError
from nplm_repro.reporting.claims import HOLDS, check_claims
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
    though the sampled arm alone has optim.samples, proposal and estimator (they come with optim.output)."""
    exact = EXACT | {"trainer.precision": "32-true", "trainer.limit_val_batches": "None"}
    sampled = SAMPLED | {"trainer.limit_val_batches": "1.0"}
    table = lstm_rows(exact, sampled)
    (claim,) = check_claims([CLAIM], table, evidence_of(table))
    assert claim.verdict == HOLDS, claim.evidence


def test_a_key_the_claim_declares_may_differ() -> None:
    table = lstm_rows(EXACT, SAMPLED)
    assert check_claims([CLAIM], table, evidence_of(table))[0].verdict == CONFOUNDED
    declared = CLAIM | {"varies": ["trainer.precision"]}
    assert check_claims([declared], table, evidence_of(table))[0].verdict == HOLDS


def test_beside_a_counted_or_mixed_row_only_the_data_is_compared() -> None:
    """A mixture or an n-gram has no training of its own: its trainer keys are no difference, its data is."""
    trained = {"trainer.precision": "32-true", "data.split.train": "800000"}
    mixed = {"trainer.precision": "auto", "data.split.train": "800000"}
    assert differences(trained, mixed, allowed("LSTM", "LSTM + MLP9"), both_trained=False) == []
    other = mixed | {"data.split.train": "6000"}
    assert differences(trained, other, allowed("LSTM", "LSTM + MLP9"), both_trained=False) == [
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
    assert differences(auto, explicit, allowed("MLP9", "MLP9")) == []
    bf16 = job_config(composed("experiment=mlp9", "trainer.precision=bf16-mixed"))
    assert differences(auto, bf16, allowed("MLP9", "MLP9")) == [("trainer.precision", "32-true", "bf16-mixed")]

