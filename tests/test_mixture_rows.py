"""model=mixture, a mixture of rows by their kept scores: each component names exactly one row, its runs are part of
the mixture's identity, mixtures mix mixtures, and no row mixes itself. Real n-gram runs on the tiny corpus in a real
store, composed by Hydra as nplm-train composes them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pytest
from helpers import TINY_BROWN, composed, data_slice
from omegaconf import DictConfig, open_dict

from nplm_repro.baselines.mixture import StoredMixedRow
from nplm_repro.baselines.ngram import DeletedInterpolation
from nplm_repro.data.load import load_corpus
from nplm_repro.errors import NplmError
from nplm_repro.reporting.tables import build, display
from nplm_repro.studies import checked
from nplm_repro.tracking import ledger
from nplm_repro.tracking.config_checks import check_config
from nplm_repro.serving.scoring import RunScorer, Tokens
from nplm_repro.sweeping.sweep import check_components

TINY = [f"data.path={TINY_BROWN}", *data_slice(7_000, 1_500, 1_500)]


def job(uri: str, *overrides: str) -> DictConfig:
    folder = uri.removeprefix("sqlite:///").removesuffix("/m.db")
    return composed(*TINY, f"tracking.uri={uri}", f"callbacks.model_checkpoint.dirpath={folder}/c", *overrides)


def mixture(uri: str, row: str, *components: str) -> DictConfig:
    named = ",".join(f"'{c}'" for c in components)
    return job(uri, "model=mixture", f"row='{row}'", f"model.components=[{named}]", "model.mode=learned")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path / "cache"))
    return f"sqlite:///{tmp_path}/m.db"


def test_a_row_name_two_configurations_share_is_refused_naming_both(store: str) -> None:
    """kn3 and kn5 are both 'Kneser-Ney back-off': the mixture took whichever ran last, with no error."""
    for row in ("kn3", "kn5", "del_int"):
        ledger.run(job(store, f"experiment={row}"))
    with pytest.raises(NplmError) as refused:
        ledger.run(mixture(store, "KN + trigram", "Kneser-Ney back-off", "Del. Int."))
    message = str(refused.value)
    assert message.startswith("model.components: row 'Kneser-Ney back-off' is 2 configurations in study (none): ")
    assert "model.n=3" in message and "model.n=5" in message and "\n" not in message
    client = mlflow.MlflowClient(store)
    rows = [r.data.tags.get("row") for r in client.search_runs([client.get_experiment_by_name("brown").experiment_id])]
    assert "KN + trigram" not in rows  # refused before its run was opened


@pytest.mark.slow  # over 10 s
def test_the_runs_a_mixture_mixes_are_part_of_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same mixture config over kn3 in one store and kn5 in another is two configurations, not one."""
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path / "cache"))
    keys = []
    for order in ("kn3", "kn5"):
        workdir = tmp_path / order
        workdir.mkdir()
        monkeypatch.chdir(workdir)
        uri = f"sqlite:///{workdir}/m.db"
        for row in (order, "del_int"):
            ledger.run(job(uri, f"experiment={row}"))
        run_id, _ = ledger.run(mixture(uri, "KN + trigram", "Kneser-Ney back-off", "Del. Int."))
        keys.append(mlflow.MlflowClient(uri).get_run(run_id).data.tags["config_key"])
    assert keys[0] != keys[1]


def test_a_mixture_mixes_a_mixture_of_rows(store: str) -> None:
    """A mixed row's name holds '+', which MLflow refuses in a parameter's name: its weight is logged all the same."""
    for row in ("kn3", "del_int", "class_n3_c150"):
        ledger.run(job(store, f"experiment={row}"))
    ledger.run(mixture(store, "KN + trigram", "Kneser-Ney back-off", "Del. Int."))
    run_id, metrics = ledger.run(mixture(store, "KN + trigram + classes", "KN + trigram", "class-based back-off"))
    params = mlflow.MlflowClient(store).get_run(run_id).data.params
    assert {"mix.lambda.KN plus trigram", "mix.lambda.class-based back-off"} <= set(params)
    assert float(params["mix.lambda.KN plus trigram"]) + float(params["mix.lambda.class-based back-off"]) == (
        pytest.approx(1, abs=2e-4)
    )
    assert metrics["test_ppl"] < min(metrics["component_1_test_ppl"], metrics["component_2_test_ppl"]) * 1.01


def test_a_row_that_mixes_itself_is_refused_before_any_work() -> None:
    cfg = composed(*TINY, "experiment=lstm_mlp9", "model.components=['LSTM + MLP9',MLP9]")
    with pytest.raises(NplmError, match=r"^model.components names row 'LSTM \+ MLP9', the row itself"):
        check_config(cfg)


def test_a_sweep_refuses_a_cycle_of_mixtures_and_a_component_two_configurations_declare() -> None:
    """What a sweep's jobs declare (row -> each job -> the rows it mixes), as compose_jobs collects it."""
    with pytest.raises(NplmError, match=r"cycle, A \+ B -> B \+ A -> A \+ B \(nothing was run\)$"):
        check_components({"A + B": {"experiment=ab": ["B + A", "MLP9"]}, "B + A": {"experiment=ba": ["A + B"]}})
    shared = {"Kneser-Ney back-off": {"experiment=kn3": [], "experiment=kn5": []}, "X": {"experiment=x": []}}
    shared["KN + X"] = {"experiment=mix": ["Kneser-Ney back-off", "X"]}
    with pytest.raises(NplmError, match=r"declare \(experiment=kn3, experiment=kn5\): give each its own row name"):
        check_components(shared)
    check_components({"Kneser-Ney back-off": {"experiment=kn3": [], "experiment=kn5": []}})  # no one mixes it


@pytest.mark.slow  # about 20 s: two small MLPs trained
def test_a_row_mixed_with_another_seed_of_itself_mixes_two_runs_counting_round_the_seeds(store: str) -> None:
    """The control of a mixture claim (experiment=lstm_lstm's shape, on a small MLP): seed 1 mixes the row's runs of
    seeds 1 and 2, seed 2 those of 2 and 1; each weight is logged under its own name, and two runs of one model
    mixed beat each alone."""
    mlp = ("experiment=mlp5", "model.m=8", "model.h=8", "trainer.max_epochs=1", "trainer.precision=32-true")
    runs = {seed: ledger.run(job(store, *mlp, f"seed={seed}"))[0] for seed in (1, 2)}
    control = ("model=mixture", "row='MLP5 + MLP5'", "model.components=[MLP5,MLP5]", "model.mode=learned")
    shifted = (*control, "+model.seed_shift=[0,1]", "+model.seeds=2")
    client = mlflow.MlflowClient(store)
    for seed, other in ((1, 2), (2, 1)):
        run_id, metrics = ledger.run(job(store, *shifted, f"seed={seed}"))
        run = client.get_run(run_id)
        assert run.data.tags["base_run_id"].split(",") == [runs[seed], runs[other]], run.data.tags["base_run_id"]
        assert {"mix.lambda.MLP5", "mix.lambda.MLP5 seed shift 1"} <= set(run.data.params)
        assert metrics["test_ppl"] < min(metrics["component_1_test_ppl"], metrics["component_2_test_ppl"])
    with pytest.raises(NplmError, match=r"^model.components names one run twice \(MLP5, MLP5\)"):
        check_config(job(store, *control))
    with pytest.raises(NplmError, match=r"^model.seed_shift needs model.seeds"):
        check_config(job(store, *control, "+model.seed_shift=[0,1]"))


def test_a_mixture_over_a_killed_row_says_it_was_killed_and_how_to_resume_it(store: str) -> None:
    """It said "run that row first", though the row's run was there, KILLED: stopped by Ctrl-C, resumable."""
    killed, _ = ledger.run(job(store, "experiment=kn3"))
    ledger.run(job(store, "experiment=del_int"))
    mlflow.MlflowClient(store).set_terminated(killed, "KILLED")
    with pytest.raises(NplmError) as refused:
        ledger.run(mixture(store, "KN + trigram", "Kneser-Ney back-off", "Del. Int."))
    assert str(refused.value) == (
        "model.components: no finished run of row 'Kneser-Ney back-off' with seed 1 in study (none) on this data: its "
        f"run {killed} was killed before it ended; the command that ran it resumes it (a trained row from its last "
        "epoch), then this mixture can run"
    )


def test_a_killed_row_reads_killed_in_its_studys_table_not_failed(store: str) -> None:
    """The table said "failed" for a KILLED run, though the report's list of runs said KILLED."""
    killed, _ = ledger.run(job(store, "experiment=kn3", "study=quickstart"))
    ledger.run(job(store, "experiment=del_int", "study=quickstart"))
    mlflow.MlflowClient(store).set_terminated(killed, "KILLED")
    report = build(store, "brown", "quickstart", spec=checked({}, "a test"))
    status = dict(zip(report.table["row"], report.table["status"], strict=True))
    assert status == {"Kneser-Ney back-off": "killed", "Del. Int.": "finished"}
    shown = display(report).set_index(("", "row"))
    assert (shown.loc["Kneser-Ney back-off"] == "killed").any()


def test_an_mlp_row_stored_with_model_mix_is_scored_by_the_mixtures_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stored when a mixed row was an MLP's `model.mix` (no longer run, still scored by nplm-score): rebuilt, it
    is scored by the mixture's module (`StoredMixedRow`), its MLP's run (here uniform) and the interpolated trigram
    fitted again, 0.5 each."""
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path / "cache"))
    cfg = composed(*TINY, "experiment=mlp1")
    with open_dict(cfg):
        cfg.model.mix = "fixed"
    assert RunScorer.family.fget(SimpleNamespace(cfg=cfg)) is StoredMixedRow
    corpus = load_corpus(cfg.data)
    uniform = SimpleNamespace(
        logprob=lambda tokens: np.full(tokens.size, -np.log(corpus.vocab_size), np.float32),
        kept_logprob=lambda split: np.full(corpus.size(split), -np.log(corpus.vocab_size), np.float32),
    )
    made: dict[str, object] = {}
    run = SimpleNamespace(
        run_id="0" * 32, cfg=cfg, corpus=corpus, parts=lambda: [uniform], memo=lambda k, f: made.setdefault(k, f())
    )
    got = StoredMixedRow.score_run(run, Tokens.of_split(corpus, "test"))
    trigram = DeletedInterpolation().fit(corpus).token_probs(corpus, "test")
    np.testing.assert_allclose(np.exp(got), 0.5 / corpus.vocab_size + 0.5 * trigram, rtol=1e-6)
