"""`nplm-train` end to end on a small real slice of Brown, into a real MLflow store; exact perplexity."""

import math
import os
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from helpers import SLICE, composed, run_script, sweep_output
from mlflow.tracking import MlflowClient

from nplm_repro.data.brown import prepare_brown
from nplm_repro.data.corpus import END_OF_TEXT, Corpus
from nplm_repro.data.splits import SPLITS
from nplm_repro.data.windows import loader
from nplm_repro.serving.scoring import RunScorer
from nplm_repro.serving.served import model_of
from nplm_repro.storage.kept import kept_scores
from nplm_repro.storage.store import EXPERIMENT_KIND
from nplm_repro.tracking.records import flat_params

SMALL = [*SLICE, "model.m=8", "trainer.max_epochs=2", "seed=7"]
DIRPATH = "callbacks.model_checkpoint.dirpath=checkpoints"  # outside a Hydra job, which would set it


def mlp3_args(brown_path: Path, uri: str) -> list[str]:
    common = [f"tracking.uri={uri}", "tracking.system_metrics=true", "note=a slice"]
    return [f"data.path={brown_path}", *SMALL, "experiment=mlp3", *common]


def assert_recorded_as_mlflow_users_expect(run: mlflow.entities.Run, uri: str, data: Path, fingerprint: str) -> None:
    """The corpus as the run's dataset, MLflow's own commit tag, the experiment's kind, the diff of a dirty tree."""
    (dataset,) = run.inputs.dataset_inputs
    assert (dataset.dataset.name, dataset.dataset.digest) == ("brown", fingerprint)
    assert dataset.dataset.source == f'{{"uri": "{data.resolve()}"}}' and dataset.dataset.source_type == "local"
    assert [(t.key, t.value) for t in dataset.tags] == [("mlflow.data.context", "training")]
    commit = run.data.tags["git_commit"]
    assert run.data.tags["mlflow.source.git.commit"] == commit.removesuffix("+dirty") and len(commit) >= 40
    client = MlflowClient(uri)
    assert EXPERIMENT_KIND.items() <= client.get_experiment(run.info.experiment_id).tags.items()
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert ("git_diff.patch" in artifacts) == commit.endswith("+dirty")  # this tree's state; test_records dirties one


@pytest.fixture(scope="module")
def trained(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One real run: 2 epochs of a small MLP3-like model on 20k tokens of Brown, with MLflow's system metrics
    sampled once an hour: the run, shorter than one interval, must still record the window it ended in."""
    workdir = tmp_path_factory.mktemp("train")
    uri = f"sqlite:///{workdir}/mlflow.db"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"] = "3600"
    result = run_script("nplm-train", *mlp3_args(brown_path, uri), cwd=workdir, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    (workdir / "output.txt").write_text(result.stdout + result.stderr)
    return workdir, uri


@pytest.mark.slow  # over 10 s
def test_a_run_ends_with_one_summary_of_what_it_measured_and_no_noise(trained: tuple[Path, str]) -> None:
    """Split, tokens and perplexity once each (Lightning's table repeated them under DataLoader 0, 1 and 2), and
    none of the warnings a user cannot act on."""
    workdir, uri = trained
    output = (workdir / "output.txt").read_text()
    (run,) = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("brown").experiment_id])
    assert f"MLP3, run {run.info.run_id}: perplexity of every token, exact softmax" in output
    for split, tokens in (("train", "20,000"), ("valid", "4,000"), ("test", "4,000")):
        (line,) = [line.split() for line in output.splitlines() if line.strip().startswith(f"{split} ")]
        assert line[1] == tokens and float(line[2].replace(",", "")) == pytest.approx(
            run.data.metrics[f"{split}_ppl"], abs=0.01
        )
    for noise in (
        "Test metric",
        "LeafSpec",
        "💡 Tip",
        "python_model",
        "not supported by the model summary",
    ):
        assert noise not in output


def test_run_lands_in_mlflow_with_params_metrics_tags(trained: tuple[Path, str], brown_path: Path) -> None:
    _, uri = trained
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["brown"], filter_string="tags.row = 'MLP3'")
    assert len(runs) == 1
    run = runs.iloc[0]
    assert run["status"] == "FINISHED"
    assert (run["params.model.n"], run["params.model.h"], run["params.model.m"]) == ("5", "0", "8")
    assert run["params.model.direct"] == "True" and run["params.seed"] == "7"
    assert run["params.data.split.train"] == "20000" and run["params.optim.recipe"] == "fast"
    corpus = prepare_brown(str(brown_path), train=20000, valid=4000, test=4000)
    assert run["tags.data_fingerprint"] == corpus.fingerprint
    assert run["tags.vocab_size"] == str(corpus.vocab_size)
    assert (run["tags.train_tokens"], run["tags.valid_tokens"], run["tags.test_tokens"]) == ("20000", "4000", "4000")
    assert run["tags.row"] == "MLP3" and run["tags.git_commit"] and run["tags.note"] == "a slice"
    assert run["tags.mlflow.runName"] == "MLP3 seed=7"
    for split in SPLITS:
        assert 1 < run[f"metrics.{split}_ppl"] < corpus.vocab_size
    assert run["metrics.train_tokens_per_s"] > 0
    assert 0 <= run["metrics.system/cpu_utilization_percentage"] <= 100  # tracking.system_metrics=true
    assert run["metrics.system/system_memory_usage_megabytes"] > 0
    # the report's costs: 2 epochs, and the seconds in fit, within the run's own span
    assert run["metrics.epochs"] == 2
    assert 0 < run["metrics.fit_seconds"] < (run["end_time"] - run["start_time"]).total_seconds()
    # trainer.precision=auto (the default) is logged as what it resolved to, and why: an MLP is not shown to train as
    # well in bf16-mixed yet (models/precision.py NEUTRAL), so 32-true on every CPU, unprobed
    assert run["params.trainer.precision"] == "32-true"
    assert run["tags.precision.auto"].startswith("32-true: bf16-mixed is not shown to leave mlp's perplexity")
    client = MlflowClient(uri)
    history = client.get_metric_history(run["run_id"], "valid_ppl_epoch")
    assert [m.step for m in history] and len(history) == 2
    assert len(client.get_metric_history(run["run_id"], "train_loss_epoch")) == 2
    # the reported valid_ppl is that of the best epoch's checkpoint
    assert run["metrics.valid_ppl"] == pytest.approx(min(m.value for m in history), rel=1e-5)
    artifacts = {a.path for a in client.list_artifacts(run["run_id"])}
    assert {"config.yaml", "data.txt"} <= artifacts and "checkpoints" not in artifacts  # the weights: in the Model
    assert model_of(client, run["run_id"]) is not None
    # each key of the config once, by our name: none of Lightning's own copies (n, m, optim/lr) beside them
    logged = client.get_run(run["run_id"])
    assert set(logged.data.params) == set(flat_params(composed(*mlp3_args(brown_path, uri), DIRPATH)))
    assert_recorded_as_mlflow_users_expect(logged, uri, brown_path, corpus.fingerprint)


def test_reported_perplexity_equals_brute_force(trained: tuple[Path, str], brown_path: Path) -> None:
    """Re-score the run's Model (its best checkpoint) token by token in float64: the same number as its test_ppl."""
    _, uri = trained
    mlflow.set_tracking_uri(uri)
    run = mlflow.search_runs(experiment_names=["brown"], filter_string="tags.row = 'MLP3'").iloc[0]
    module = mlflow.pyfunc.load_model(f"runs:/{run['run_id']}/model").unwrap_python_model().module  # its Model
    corpus = prepare_brown(str(brown_path), train=20000, valid=4000, test=4000)
    start, end = corpus.bounds["test"]
    eot = corpus.vocab.index(END_OF_TEXT)
    nll = 0.0
    with torch.no_grad():
        for t in range(start, end):
            context = [corpus.ids[t - k].item() if t - k >= 0 else eot for k in range(1, 5)]
            logits = module.model(torch.tensor([context]))[0].double()
            nll -= (logits[corpus.ids[t]] - torch.logsumexp(logits, 0)).item()
    assert run["metrics.test_ppl"] == pytest.approx(math.exp(nll / (end - start)), rel=1e-6)


def test_test_loop_scores_every_token(tiny_brown_path: Path) -> None:
    corpus: Corpus = prepare_brown(str(tiny_brown_path), train=3000, valid=500, test=700)
    batches = loader(corpus, "test", n=3, batch_size=128)
    assert sum(len(target) for _, target in batches) == 700


def ngram_args(experiment: str, brown_path: Path, uri: str) -> list[str]:
    """`nplm-train`'s overrides for an n-gram row on the usual slice of Brown, into the store at `uri`."""
    return [f"data.path={brown_path}", *SLICE, f"experiment={experiment}", f"tracking.uri={uri}"]


@pytest.fixture(scope="module")
def trigram(trained: tuple[Path, str], brown_path: Path) -> list[str]:
    """Del. Int. on the same slice, seed 7, into the store of `trained`'s MLP3 (the run MLP4 mixes with it): the
    overrides it ran with."""
    workdir, uri = trained
    args = [*ngram_args("del_int", brown_path, uri), "seed=7"]
    result = run_script("nplm-train", *args, cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    return args


def assert_an_ngram_row(uri: str, args: list[str], row: str, n: str, brown_path: Path) -> None:
    """The store's one run of `row`, made by `nplm-train` with `args`: finished and scored on the slice, with only
    the params a count depends on."""
    mlflow.set_tracking_uri(uri)
    (run,) = [run for _, run in mlflow.search_runs(experiment_names=["brown"]).iterrows() if run["tags.row"] == row]
    assert run["status"] == "FINISHED" and run["tags.row"] == row and run["params.model.n"] == n
    corpus = prepare_brown(str(brown_path), train=20000, valid=4000, test=4000)
    assert run["tags.data_fingerprint"] == corpus.fingerprint
    for split in SPLITS:
        assert 1 < run[f"metrics.{split}_ppl"] < corpus.vocab_size
        assert run[f"metrics.{split}_tokens"] == corpus.size(split)
    assert run["params.fit.train_tokens"] == "20000"
    # what a count depends on, once each: no optimiser, trainer or callbacks, which it never reads
    logged = MlflowClient(uri).get_run(run["run_id"])
    ours = {k for k in logged.data.params if not k.startswith("fit.")}
    assert ours == set(flat_params(composed(*args, DIRPATH))) and not any(
        k.startswith(("optim", "trainer")) for k in ours
    )
    assert not any(k.startswith("precision.") for k in logged.data.tags)  # a count has no precision
    assert_recorded_as_mlflow_users_expect(logged, uri, brown_path, corpus.fingerprint)


def test_an_interpolated_trigram_row_runs_through_the_same_entry_point(
    trained: tuple[Path, str], trigram: list[str], brown_path: Path
) -> None:
    """Del. Int. (n=3), run by `nplm-train experiment=del_int` as every row is."""
    assert_an_ngram_row(trained[1], trigram, "Del. Int.", "3", brown_path)


@pytest.mark.slow
def test_a_back_off_row_runs_through_the_same_entry_point(brown_path: Path, tmp_path: Path) -> None:
    """Kneser-Ney back-off (n=4), run by `nplm-train experiment=kn4` into a store of its own."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = ngram_args("kn4", brown_path, uri)
    result = run_script("nplm-train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_an_ngram_row(uri, args, "Kneser-Ney back-off", "4", brown_path)


@pytest.mark.slow
def test_mixed_rows_mix_the_mlps_run_and_the_trigrams(
    trained: tuple[Path, str], trigram: list[str], brown_path: Path
) -> None:
    """MLP4 = the runs of MLP3 and Del. Int. mixed: no retraining; fixed 0.5, and EM-learned weights do no worse."""
    workdir, uri = trained
    data = [f"data.path={brown_path}", *SLICE, "seed=7", f"tracking.uri={uri}"]
    for mode in ("fixed", "learned", "context"):
        result = run_script("nplm-train", *data, "experiment=mlp4", f"model.mode={mode}", cwd=workdir)
        assert result.returncode == 0, result.stderr[-3000:]
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["brown"])
    base, trigram = (runs[runs["tags.row"] == row].iloc[0] for row in ("MLP3", "Del. Int."))
    assert len(runs[runs["tags.row"] == "MLP3"]) == 1  # one MLP, trained once
    mixed = runs[runs["tags.row"] == "MLP4"].set_index("params.model.mode")
    assert sorted(mixed.index) == ["context", "fixed", "learned"]
    for mode in mixed.index:
        assert mixed.loc[mode, "tags.base_run_id"] == f"{base['run_id']},{trigram['run_id']}"
        assert mixed.loc[mode, "metrics.component_1_valid_ppl"] == pytest.approx(base["metrics.valid_ppl"], rel=1e-9)
        assert mixed.loc[mode, "metrics.component_2_test_ppl"] == pytest.approx(trigram["metrics.test_ppl"], rel=1e-6)
    assert mixed.loc["fixed", "params.mix.lambda.MLP3"] == "0.5"
    valid = mixed["metrics.valid_ppl"]
    # per-bin weights can only do better at the optimum; EM stops at a relative tolerance of 1e-6
    assert valid["context"] <= valid["learned"] * (1 + 1e-4)
    assert valid["learned"] <= valid["fixed"] < base["metrics.valid_ppl"]


@pytest.mark.slow
def test_an_mlp_trained_in_another_study_is_adopted_not_trained_again(
    trained: tuple[Path, str], brown_path: Path, tmp_path: Path
) -> None:
    """A study whose cell is an MLP another study trained (same model_key) records it as its own run, untrained:
    the same metrics and per-epoch history, the same kept scores, the trained run's CPU; rerun=true trains it."""
    workdir, _ = trained
    shutil.copy(workdir / "mlflow.db", tmp_path / "mlflow.db")  # this test's runs stay out of the module's store
    copy = f"sqlite:///{tmp_path}/mlflow.db"
    one_job = ["hydra/launcher=basic", "report=null"]  # its one job in the sweep's process: no joblib workers to start
    args = ["-m", "study=brown_direct", *mlp3_args(brown_path, copy), "model.direct=true", *one_job]
    result = run_script("nplm-train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "adopted: run" in sweep_output(result, tmp_path)
    client = MlflowClient(copy)
    runs = client.search_runs([client.get_experiment_by_name("brown").experiment_id], "attributes.status = 'FINISHED'")
    # the fixture's MLP3, not the MLP4 mixtures another test of this module may have added to its store
    (first,) = [r for r in runs if "study" not in r.data.tags and r.data.tags["row"] == "MLP3"]
    (adopted,) = [r for r in runs if r.data.tags.get("study") == "brown_direct" and "row" in r.data.tags]  # no parent
    assert adopted.data.tags["adopted_from"] == first.info.run_id and adopted.info.run_id != first.info.run_id
    results = [{k: v for k, v in r.data.metrics.items() if not k.startswith("system/")} for r in (first, adopted)]
    assert results[0] == results[1] and "test_ppl" in results[0]
    assert adopted.data.tags["cpu_model"] == first.data.tags["cpu_model"]
    assert adopted.data.tags["model_key"] == first.data.tags["model_key"]
    curves = [[m.value for m in client.get_metric_history(r.info.run_id, "valid_ppl_epoch")] for r in (first, adopted)]
    assert curves[0] == curves[1] and len(curves[0]) == 2
    scores = [kept_scores(client, r.info.run_id) for r in (first, adopted)]
    assert all(np.array_equal(scores[0].splits[s].logprob, scores[1].splits[s].logprob) for s in ("valid", "test"))
    assert not [a for a in client.list_artifacts(adopted.info.run_id) if a.path == "checkpoints"]  # weights not copied
    weights = [RunScorer(copy, r.info.run_id).model().model.C for r in (first, adopted)]  # nplm-score, nplm-ask
    assert torch.equal(*weights)
    third = ["-m", "study=brown_features", *mlp3_args(brown_path, copy), "model.features=learned", *one_job]
    assert run_script("nplm-train", *third, cwd=tmp_path).returncode == 0
    (again,) = client.search_runs([first.info.experiment_id], "tags.study = 'brown_features' and tags.row = 'MLP3'")
    assert again.data.tags["adopted_from"] == first.info.run_id  # the run that trained it, not the adopted one
    result = run_script("nplm-train", *args, "rerun=true", cwd=tmp_path)
    assert result.returncode == 0 and "adopted: run" not in sweep_output(result, tmp_path), result.stderr[-3000:]


@pytest.mark.parametrize(
    "steps,validations",
    [(40, 0), pytest.param(80, 1, marks=pytest.mark.slow), pytest.param(120, 1, marks=pytest.mark.slow)],
)
def test_a_run_cut_by_max_steps_finishes_and_is_scored_on_every_token(
    steps: int, validations: int, brown_path: Path, tmp_path: Path
) -> None:
    """An epoch here is 80 steps (20,000 windows, 250 a batch). A run cut before, at and after its end ends
    FINISHED and scored exactly; early stopping and the best checkpoint act only on validations that ran
    (before: "Early stopping conditioned on metric valid_ppl_epoch which is not available", exit 1)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    limits = [f"trainer.max_steps={steps}", "trainer.max_epochs=5", "optim.batch_size=250"]
    args = [f"data.path={brown_path}", *SLICE, "model.m=8", *limits, f"tracking.uri={uri}"]
    result = run_script("nplm-train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "valid_ppl_epoch")) == validations
    sizes = {"train": 20000, "valid": 4000, "test": 4000}
    for split in SPLITS:
        assert run.data.metrics[f"{split}_tokens"] == sizes[split]
        assert 1 < run.data.metrics[f"{split}_ppl"] < int(run.data.tags["vocab_size"])
    assert (model_of(client, run.info.run_id) is not None) == bool(validations)  # no best checkpoint: no Model
