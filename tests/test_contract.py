"""Every model family answers the one contract of nplm_repro/family.py, as scikit-learn's `check_estimator` holds
every estimator to its interface: each `conf/model/*.yaml`, and the toy family of tests/families/ written outside the
package. For each: its rules refuse a bad value; a short run on the tiny corpus, into a real MLflow store, keeps its
scores; `nplm-score`'s rebuilding of the run (`RunScorer`) gives them again; where it gives a distribution, it sums
to one over the vocabulary; and the report has its row."""

from __future__ import annotations

import math
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from helpers import CONF, ROOT, TINY_BROWN, composed, data_slice
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from nplm_repro.baselines.ngram import NgramModel
from nplm_repro.data.corpus import END_OF_TEXT, Corpus
from nplm_repro.data.splits import SPLITS
from nplm_repro.errors import NplmError
from nplm_repro.family import KINDS, Family, Need
from nplm_repro.reporting.tables import build
from nplm_repro.scores import KEPT_SPLITS
from nplm_repro.tracking import ledger
from nplm_repro.tracking.config_checks import check_config
from nplm_repro.storage.kept import kept_scores
from nplm_repro.serving.scoring import RunScorer

FAMILIES = Path(__file__).resolve().parent / "families"
TOY = "unigram"  # tests/families/model/unigram.yaml
EXTENDING = "extending"  # docs/extending.md's example, as written there (`extending`)
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml")) + [TOY, EXTENDING]
TINY = [f"data.path={TINY_BROWN}", *data_slice(6_000, 1_500, 1_500)]
# What makes a trained family's run short: one epoch of a few batches, small layers where the family has them
SHORT = {
    "mlp": ["model.h=8", "model.m=8"],
    "lstm": ["model.width=16", "model.layers=1"],
    "transformer": ["model.width=16", "model.layers=1"],
    "class_based": ["model.c=20"],  # at most the tiny training split's distinct words
    "mixture": ["model.components=['Del. Int.','Kneser-Ney back-off']"],  # its rows: counted, so seconds
}
QUICK = ["trainer.max_epochs=1", "trainer.limit_train_batches=4"]
TRAINED = ("mlp", "lstm", "transformer")  # their runs train: slow tests (tests/test_sequence_runs.py trains them too)
EXPERIMENTS = {"Del. Int.": "del_int", "Kneser-Ney back-off": "kn3"}  # the experiment of each row a family needs


def extending(into: Path) -> Path:
    """docs/extending.md's counted family, its code block as written, with a config group of its own."""
    text = (ROOT / "docs" / "extending.md").read_text()
    code = text.split("## A counted family", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (into / "model").mkdir(parents=True)
    (into / "extending_example.py").write_text(code)
    (into / "model" / f"{EXTENDING}.yaml").write_text("_target_: extending_example.Unigram\nadd: 1.0\n")
    return into


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a real MLflow store; the families from outside the package importable, their config groups found
    on Hydra's search path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(FAMILIES))
    monkeypatch.syspath_prepend(str(extending(tmp_path / "docs_family")))
    return tmp_path


def job(folder: Path, model: str, *overrides: str) -> DictConfig:
    """A job of `model` on the tiny corpus, composed as nplm-train composes it."""
    outside = {TOY: FAMILIES, EXTENDING: folder / "docs_family"}
    found = [f"hydra.searchpath=[file://{outside[model]}]"] if model in outside else []
    short = [*SHORT.get(model, []), *(QUICK if model in TRAINED else [])]
    return composed(
        *found,
        f"model={model}",
        *TINY,
        *short,
        f"tracking.uri=sqlite:///{folder}/mlflow.db",
        f"callbacks.model_checkpoint.dirpath={folder}/c",
        "trainer.enable_progress_bar=false",
        *overrides,
    )


def row_of(folder: Path, model: str) -> DictConfig:
    """A row of `model`, after the runs its family needs (`needs`: a mixture's components), each one's experiment run
    with the seed the need names."""
    cfg = job(folder, model, f"row={model}")
    where = [f"tracking.uri=sqlite:///{folder}/mlflow.db", f"callbacks.model_checkpoint.dirpath={folder}/c"]
    for need in get_class(cfg.model._target_).needs(cfg):
        ledger.run(composed(*TINY, f"experiment={EXPERIMENTS[need.row]}", f"seed={need.seed}", *where))
    return cfg


@pytest.mark.parametrize("model", MODELS)
def test_a_family_declares_the_contract(store: Path, model: str) -> None:
    cfg = job(store, model, "row=x")
    family = get_class(cfg.model._target_)
    assert issubclass(family, Family), f"{family.__name__} does not subclass nplm_repro.family.Family"
    assert family.family and family.label, "a family names itself (family) and says its label"
    assert family.kind(cfg) in KINDS
    assert all(isinstance(need, Need) for need in family.needs(cfg)), "needs names runs by `Need`s"
    tags = family.tags(cfg)
    assert set(tags) == {"family", "family_kind", "family_label", "family_colour"}
    for duty in ("fit_run", "score_run"):  # its own, or its kind's (a LanguageModule's, an NgramModel's)
        assert getattr(family, duty).__func__ is not getattr(Family, duty).__func__, f"{family.__name__}.{duty}"


@pytest.mark.parametrize("model", MODELS)
def test_a_familys_rules_refuse_a_bad_value(store: Path, model: str) -> None:
    cfg = job(store, model, "row=x")
    family = get_class(cfg.model._target_)
    keys = [k for k in family.rules(cfg) if k.startswith("model.")]
    assert keys, f"{family.__name__} checks none of its own keys"
    check_config(cfg)  # its defaults pass
    for key in keys:
        bad = cfg.copy()
        OmegaConf.update(bad, key, "not a value", force_add=True)
        with pytest.raises(NplmError, match=f"^{key}="):
            check_config(bad)


@pytest.mark.parametrize("model", [pytest.param(m, marks=pytest.mark.slow) if m in TRAINED else m for m in MODELS])
def test_a_short_run_keeps_scores_that_nplm_score_gives_again(store: Path, model: str) -> None:
    cfg = row_of(store, model)
    run_id, metrics = ledger.run(cfg)
    uri = cfg.tracking.uri
    client = mlflow.MlflowClient(uri)
    assert client.get_run(run_id).info.status == "FINISHED"
    kept = kept_scores(client, run_id)
    assert kept is not None, "the run keeps no scores"
    scorer = RunScorer(uri, run_id)
    for split in KEPT_SPLITS:
        assert kept.splits[split].tokens == scorer.corpus.size(split)
        assert kept.splits[split].perplexity() == pytest.approx(metrics[f"{split}_ppl"], rel=1e-6)
        again = scorer.logprob(scorer.split(split))
        np.testing.assert_allclose(again, kept.splits[split].logprob, rtol=1e-5, atol=1e-6)
    table = build(uri, "brown", "adhoc").table
    shown = table[(table["status"] == "finished") & np.isclose(table["test_ppl"], metrics["test_ppl"], rtol=1e-9)]
    assert len(shown) == 1, "the report has no row of the run"
    gives_a_distribution(scorer)


def gives_a_distribution(scorer: RunScorer) -> None:
    """P(. | a context) sums to one over the vocabulary: a trained model's next word, a counted model's windows with
    every word last; a mixture's weights (its components are distributions) sum to one in every context bin."""
    corpus, kind = scorer.corpus, scorer.kind
    if kind == "trained":
        model = scorer.model()
        context = corpus.ids[: model.context_needed].tolist()
        total = torch.logsumexp(model.next_logprobs([context])[0].double(), 0).item()
        assert total == pytest.approx(0.0, abs=1e-4)
    elif kind == "counted":
        model = instantiate(scorer.cfg.model, _convert_="all").fit(corpus)
        start = corpus.bounds["test"][0]
        context = corpus.ids[start : start + model.order - 1].numpy()
        rows = np.column_stack([np.tile(context, (corpus.vocab_size, 1)), np.arange(corpus.vocab_size)])
        assert model.window_probs(rows.astype(np.int64)).sum() == pytest.approx(1.0, abs=1e-6)
        scores_every_token_in_its_stream(model, corpus)
    else:
        weights = [float(v) for k, v in scorer.run.data.params.items() if k.startswith("mix.lambda.")]
        assert weights and sum(weights) == pytest.approx(1.0, abs=1e-3)


def scores_every_token_in_its_stream(model: NgramModel, corpus: Corpus) -> None:
    """A counted model gives every token of each split a probability in (0, 1], the first with the stream's tokens
    before it (`<eot>` before the corpus's start), and its perplexity is theirs."""
    n, ids = model.order, corpus.ids.numpy()
    pad = corpus.vocab.index(END_OF_TEXT)
    for split in SPLITS:
        probs = model.token_probs(corpus, split)
        assert probs.dtype == np.float64 and probs.shape == (corpus.size(split),)
        assert ((probs > 0) & (probs <= 1)).all()
        assert model.perplexity(corpus, split) == pytest.approx(math.exp(-np.log(probs).mean()), rel=1e-12)
        start = corpus.bounds[split][0]
        context = [ids[t] if t >= 0 else pad for t in range(start - n + 1, start)]
        assert probs[0] == model.window_probs(np.array([[*context, ids[start]]]))[0]
