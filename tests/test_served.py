"""Every trained run is an MLflow Model (serving/served.py): loaded by URI in a fresh Python process that imports
nothing of ours, it answers the exact softmax of the run's weights; bad requests are errors a server answers 400."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from helpers import SLICE, composed
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from nplm_repro.reporting.render import write
from nplm_repro.reporting.tables import build
from nplm_repro.tracking import ledger
from nplm_repro.serving.features import MIN_COUNT, PROBES
from nplm_repro.sweeping.registry import CHAMPION, register_best
from nplm_repro.serving.scoring import RunScorer
from nplm_repro.serving.served import model_of

CONTEXT = "The Fulton County Grand Jury said Friday that"


@pytest.fixture(scope="module")
def mlp(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """One short MLP5 run (n=5) on 28k tokens of Brown in a real store: its folder, store and run id."""
    workdir = tmp_path_factory.mktemp("served")
    uri = f"sqlite:///{workdir}/mlflow.db"
    overrides = [f"data.path={brown_path}", *SLICE, "trainer.max_epochs=1", "trainer.limit_train_batches=5"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        run_id, _ = ledger.run(
            composed(
                "experiment=mlp5", *overrides, f"tracking.uri={uri}", f"callbacks.model_checkpoint.dirpath={workdir}/c"
            )
        )
    return workdir, uri, run_id


def exact(uri: str, run_id: str, words: list[str]) -> torch.Tensor:
    """ln P(next word | the last 4 words) from the run's weights, as nplm-score loads them."""
    scorer = RunScorer(uri, run_id)
    index = {w: i for i, w in enumerate(scorer.corpus.vocab)}
    unk = index["<unk>"]
    context = torch.tensor([[index.get(w, unk) for w in words[-4:]][::-1]])
    with torch.no_grad():
        return scorer.model()(context)[0].double()


@pytest.mark.slow  # about 8-16 s: outside the default suite's 5 minutes
def test_a_fresh_process_loads_the_runs_model_by_uri_and_gets_the_exact_softmax(mlp: tuple[Path, str, str]) -> None:
    workdir, uri, run_id = mlp
    assert model_of(MlflowClient(uri), run_id) is not None
    code = (
        "import json, sys, mlflow, pandas as pd\n"
        f"model = mlflow.pyfunc.load_model('runs:/{run_id}/model')\n"
        f"out = model.predict(pd.DataFrame({{'context': [{CONTEXT!r}], 'next_word': ['the']}}), params={{'k': 5}})\n"
        "print(json.dumps({'words': out['words'][0], 'probs': [float(p) for p in out['probs'][0]],"
        " 'logprob': float(out['logprob'][0]), 'code': sys.modules['nplm_repro'].__file__}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"MLFLOW_TRACKING_URI": uri}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert "/code/nplm_repro/" in answer["code"]  # the Model's own copy of the code, not this checkout's
    logp = exact(uri, run_id, CONTEXT.split())
    top = logp.topk(5)
    vocab = RunScorer(uri, run_id).corpus.vocab
    assert answer["words"] == [vocab[i] for i in top.indices.tolist()]
    np.testing.assert_allclose(answer["probs"], top.values.exp().numpy(), rtol=1e-5)
    assert answer["logprob"] == pytest.approx(float(logp[vocab.index("the")]), abs=1e-5)


def test_bad_requests_are_invalid_parameter_errors(mlp: tuple[Path, str, str]) -> None:
    _, uri, run_id = mlp
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    cases = {
        "": "has 0 tokens: this model reads at least 4",
        "the jury": "has 2 tokens",
    }
    for context, words in cases.items():
        with pytest.raises(MlflowException, match=words) as raised:
            model.predict(pd.DataFrame({"context": [context]}))
        assert raised.value.error_code == "INVALID_PARAMETER_VALUE"
    with pytest.raises(MlflowException, match="must be a string"):
        model.unwrap_python_model().predict(None, pd.DataFrame({"context": [5]}))
    with pytest.raises(MlflowException, match="k=0"):
        model.predict(pd.DataFrame({"context": [CONTEXT]}), params={"k": 0})
    longer = model.predict(pd.DataFrame({"context": ["It was " + CONTEXT]}), params={"k": 3})
    assert longer["words"][0] == model.predict(pd.DataFrame({"context": [CONTEXT]}), params={"k": 3})["words"][0]
    assert longer["logprob"][0] is None  # no next_word asked: null in JSON


def test_every_mlp_run_lays_out_its_word_features_and_the_report_shows_them(
    mlp: tuple[Path, str, str], tmp_path: Path
) -> None:
    """features/: neighbours of the probe words in the vocabulary, the paper's two sentences under the MLP and the
    trigram, the map; the report of the study shows those of its best MLP, and its map among the figures."""
    _, uri, run_id = mlp
    client = MlflowClient(uri)
    assert {a.path for a in client.list_artifacts(run_id, "features")} == {
        f"features/{name}" for name in ("neighbours.md", "sentences.md", "map.png", "map.json")
    }
    report = build(uri, "brown", "brown_table1")  # an MLP5 run without a study: Table 1's row
    assert report.learned is not None and report.learned.run_id == run_id
    corpus = RunScorer(uri, run_id).corpus
    vocab, (start, end) = corpus.vocab, corpus.bounds["train"]
    seen = torch.bincount(corpus.ids[start:end], minlength=len(vocab))  # a probe is listed once trained 50 times
    listed = [w for w in PROBES if w in vocab and seen[vocab.index(w)] >= MIN_COUNT]
    assert listed and [line.split(":")[0] for line in report.learned.neighbours] == listed
    first, perplexities = report.learned.sentences[:2]
    assert first.startswith("The cat is walking in the bedroom: P(word | before) MLP / Del. Int.: The ")
    assert "cat (<unk>)" in first or "cat" in vocab
    assert re.fullmatch(r"The cat is walking in the bedroom: perplexity MLP [\d.]+, Del. Int. [\d.]+", perplexities)
    written = {p.name for p in write(report, tmp_path)}
    assert "brown_table1_features_map.png" in written
    assert "## What the best trained row's word features learned" in (tmp_path / "brown_table1.md").read_text()


def test_the_best_mlp_of_a_study_is_registered_once(mlp: tuple[Path, str, str]) -> None:
    """nplm-report --register's step: the study's best MLP becomes version 1 of nplm-<experiment>-<study>, tagged,
    with the alias `champion`, by which MLflow loads it; registering again adds no version while the best is the
    same Model."""
    _, uri, run_id = mlp
    client = MlflowClient(uri)
    client.set_tag(run_id, "study", "probe")
    assert register_best(uri, "brown", "probe") == "nplm-brown-probe/1"
    assert register_best(uri, "brown", "probe") == "nplm-brown-probe/1"
    (version,) = client.search_model_versions("name = 'nplm-brown-probe'")
    assert version.run_id == run_id and version.source == f"models:/{model_of(client, run_id)}"
    assert version.tags["row"] == "MLP5" and float(version.tags["valid_ppl"]) == pytest.approx(
        client.get_run(run_id).data.metrics["valid_ppl"], rel=1e-3
    )
    assert client.get_model_version_by_alias("nplm-brown-probe", CHAMPION).version == version.version
    mlflow.set_tracking_uri(uri)
    champion = mlflow.pyfunc.load_model(f"models:/nplm-brown-probe@{CHAMPION}")  # the run's weights
    words = champion.predict(pd.DataFrame({"context": [CONTEXT]}), params={"k": 3})["words"][0]
    vocab = RunScorer(uri, run_id).corpus.vocab
    assert words == [vocab[i] for i in exact(uri, run_id, CONTEXT.split()).topk(3).indices.tolist()]
    assert register_best(uri, "brown", "no_such_study") is None
    client.delete_tag(run_id, "study")
