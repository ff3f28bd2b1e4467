"""A model family added from outside the package (tests/families/toy_unigram.py, docs/extending.md): composed by
Hydra from its own config group, checked, run into a real MLflow store with kept scores, scored again, reported."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pytest
from helpers import TINY_BROWN, composed, data_slice

from nplm_repro.errors import NplmError
from nplm_repro.reporting.tables import build
from nplm_repro.tracking import ledger
from nplm_repro.tracking.config_checks import check_config
from nplm_repro.storage.kept import kept_scores
from nplm_repro.serving.scoring import RunScorer

FAMILIES = Path(__file__).resolve().parent / "families"


@pytest.fixture
def unigram(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The overrides that choose the toy family: its config group on Hydra's search path, its module importable."""
    monkeypatch.syspath_prepend(str(FAMILIES))
    monkeypatch.chdir(tmp_path)
    return [
        f"hydra.searchpath=[file://{FAMILIES}]",
        "model=unigram",
        f"data.path={TINY_BROWN}",
        *data_slice(6_000, 2_000, 2_000),
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        f"callbacks.model_checkpoint.dirpath={tmp_path}",  # Hydra sets it when it runs the job
        "row=unigram",
    ]


def test_a_family_from_outside_the_package_runs_keeps_scores_and_is_a_report_row(unigram: list[str]) -> None:
    cfg = composed(*unigram)
    run_id, metrics = ledger.run(cfg)
    uri = cfg.tracking.uri
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert {k: run.data.tags[k] for k in ("family", "family_kind", "family_label")} == {
        "family": "unigram",
        "family_kind": "counted",
        "family_label": "unigram",
    }
    # its kept scores are the add-one unigram's own probabilities
    scorer = RunScorer(uri, run_id)
    start, end = scorer.corpus.bounds["train"]
    counts = np.bincount(scorer.corpus.ids[start:end].numpy(), minlength=scorer.corpus.vocab_size) + 1.0
    test = scorer.corpus.ids[slice(*scorer.corpus.bounds["test"])].numpy()
    expected = np.log(counts / counts.sum())[test]
    np.testing.assert_allclose(kept_scores(mlflow.MlflowClient(uri), run_id).splits["test"].logprob, expected)
    assert metrics["test_ppl"] == pytest.approx(np.exp(-expected.mean()))
    # scored again as nplm-score rebuilds it, through the family's own code
    np.testing.assert_allclose(scorer.logprob(scorer.split("test")), expected)
    report = build(uri, "brown", "adhoc")
    row = report.table.set_index("label").loc["unigram"]
    assert row["status"] == "finished" and row["test_ppl"] == pytest.approx(metrics["test_ppl"])


def test_a_familys_own_rules_and_checks_refuse_bad_values(unigram: list[str]) -> None:
    with pytest.raises(NplmError, match=r"model.add=0 is invalid: expected a number > 0"):
        check_config(composed(*unigram, "model.add=0"))
    with pytest.raises(NplmError, match="a unigram reads no context"):
        check_config(composed(*unigram, "+model.n=3"))
