"""The LSTM and the Transformer as rows: real short runs on a slice of Brown in a real store, their Model loaded
in a fresh process, their test perplexity scored again by nplm-score's code, text continued by nplm-ask's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import mlflow
import numpy as np
import pytest
import torch
from helpers import SLICE, composed, data_slice, run_script
from lightning.pytorch.callbacks import Callback, Timer

from nplm_repro.errors import NplmError
from nplm_repro.models.schedules import budget_rate, to_time_budget
from nplm_repro.models.use import continue_ids
from nplm_repro.perplexity import perplexity_of
from nplm_repro.serving.scoring import RunScorer
from nplm_repro.tracking import ledger
from nplm_repro.tracking.config_checks import check_config

SMALL = {
    "lstm": [  # every regulariser on: scoring must not depend on any of them
        *["model.width=24", "model.layers=2", "optim.batch_size=8", "model.locked=true", "model.output=standard"],
        *["model.word_dropout=0.1", "model.weight_drop=0.3", "model.dropout_hidden=0.2"],
    ],
    "transformer": [
        *["model.width=24", "model.layers=1", "model.heads=2", "model.context=32", "optim.batch_size=8"],
        "model.output=standard",  # the rows' class layer trains exactly: this run is sampled
    ],
}
CONTEXT = "The jury said that it"


@pytest.fixture(scope="module")
def rows(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """One short run of each family (sampled output layer, 5 steps, then validation), each in a real store of its
    own: by family, its store and run id."""
    made = {}
    for family in sorted(SMALL):
        workdir = tmp_path_factory.mktemp(family)
        uri = f"sqlite:///{workdir}/mlflow.db"
        overrides = [f"data.path={brown_path}", *SLICE, "trainer.max_epochs=1", "trainer.limit_train_batches=5"]
        overrides += ["optim=sampled", "optim.samples=50"]
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(workdir)
            cfg = composed(
                f"experiment={family}",
                *overrides,
                *SMALL[family],
                f"tracking.uri={uri}",
                f"callbacks.model_checkpoint.dirpath={workdir}/c",
            )
            run_id, _ = ledger.run(cfg)
        made[family] = (uri, run_id)
    return made


@pytest.fixture(params=sorted(SMALL))
def row(request: pytest.FixtureRequest, rows: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """The short run of one family: its store and run id."""
    return rows[request.param]


@pytest.mark.slow  # over 10 s
def test_each_validation_logs_the_fits_seconds_at_its_own_step(row: tuple[str, str]) -> None:
    """The compute figure pairs each validation perplexity with the fit's seconds logged at the same step."""
    uri, run_id = row
    client = mlflow.MlflowClient(uri)
    valid, seconds = (
        [m.step for m in client.get_metric_history(run_id, k)] for k in ("valid_ppl_epoch", "fit_seconds_epoch")
    )
    assert valid == seconds and len(valid) == 1


@pytest.mark.slow  # two trainings and a fresh Python process: about 30 s
def test_its_test_perplexity_is_scored_again_to_a_millionth(row: tuple[str, str]) -> None:
    uri, run_id = row
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["family_kind"] == "trained"
    assert set(run.data.metrics) >= {"valid_ppl", "test_ppl"} and "train_ppl" not in run.data.metrics
    scorer = RunScorer(uri, run_id)
    again = perplexity_of(np.exp(scorer.logprob(scorer.split("test")).astype(np.float64)))
    assert again == pytest.approx(run.data.metrics["test_ppl"], rel=1e-6)


def test_a_long_text_is_scored_in_one_part(row: tuple[str, str], tmp_path: Path) -> None:
    """A token's score reads every token before it (the LSTM's state) or a window placed by where the text starts
    (the Transformer's sliding windows), so `nplm-score --text` takes the text whole, in one part, however long."""
    uri, run_id = row
    scorer = RunScorer(uri, run_id)
    text = tmp_path / "long.txt"
    text.write_text("The jury said that it was held.\n\n" * 20)
    assert scorer.reach() is None and [t.size for t in scorer.text(text, part=7)] == [20 * 9 + 1]


@pytest.mark.slow  # a fresh Python process: about 10 s
def test_a_fresh_process_loads_each_familys_model_and_gets_the_exact_softmax(
    rows: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    """Each family's MLflow Model, loaded in one fresh Python process as a user loads it, answers for CONTEXT what
    the run rebuilt in this process computes: ln P(the) and the 3 most probable next words."""
    code = (
        "import json, sys, mlflow, pandas as pd\n"
        "for uri, run_id in json.loads(sys.argv[1]):\n"
        "    mlflow.set_tracking_uri(uri)\n"
        "    model = mlflow.pyfunc.load_model(f'runs:/{run_id}/model')\n"
        f"    asked = pd.DataFrame({{'context': [{CONTEXT!r}], 'next_word': ['the']}})\n"
        "    out = model.predict(asked, params={'k': 3})\n"
        "    print(json.dumps({'words': list(out['words'][0]), 'logprob': float(out['logprob'][0])}))\n"
    )
    runs = [rows[family] for family in sorted(rows)]
    found = subprocess.run(
        [sys.executable, "-c", code, json.dumps(runs)], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    answers = [json.loads(line) for line in found.stdout.strip().splitlines()[-len(runs) :]]
    assert len(answers) == len(runs) == 2
    for (uri, run_id), answer in zip(runs, answers, strict=True):
        scorer = RunScorer(uri, run_id)
        with torch.no_grad():
            logp = scorer.model().next_logprobs([scorer.words(CONTEXT)])[0].double()
        assert answer["logprob"] == pytest.approx(float(logp[scorer.corpus.vocab.index("the")]), rel=1e-5)
        assert answer["words"] == [scorer.corpus.vocab[i] for i in logp.topk(3).indices]


@pytest.mark.slow
def test_it_continues_a_prompt_the_same_way_for_the_same_seed(row: tuple[str, str]) -> None:
    uri, run_id = row
    scorer = RunScorer(uri, run_id)
    prompt, pad = scorer.words(CONTEXT), scorer.corpus.vocab.index("<eot>")
    drawn = [continue_ids(scorer.model(), prompt, 5, 1.0, seed, pad) for seed in (1, 1, 2)]
    assert drawn[0] == drawn[1] and len(drawn[0]) == 5


@pytest.mark.slow  # one short training in a fresh process: about 15 s
def test_model_lstm_alone_trains_with_its_own_optimiser_group(brown_path: Path, tmp_path: Path) -> None:
    """`nplm-train model=lstm optim=adamw` (and `model=lstm` alone, whose default optimiser is adamw) runs: AdamW
    to convergence, the rate dropped on a plateau."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tiny = ["model.width=16", "model.layers=1", "trainer.max_epochs=1", "trainer.limit_train_batches=3", *SLICE]
    result = run_script(
        "nplm-train",
        "model=lstm",
        "optim=adamw",
        *tiny,
        f"data.path={brown_path}",
        f"tracking.uri={uri}",
        "trainer.enable_progress_bar=false",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    mlflow.set_tracking_uri(uri)
    (run,) = [r for _, r in mlflow.search_runs(experiment_names=["brown"]).iterrows()]
    assert run["status"] == "FINISHED" and run["params.optim.recipe"] == "adamw"
    assert run["params.optim.plateau_factor"] == "0.25" and run["tags.family"] == "lstm"
    assert 0 < run["metrics.fit_seconds_epoch"] <= run["metrics.fit_seconds"]  # the compute figure's clock


class Rates(Callback):
    """The learning rate of every training step, as the optimiser used it (a callback of the run's config)."""

    seen: ClassVar[list[float]] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        Rates.seen.append(trainer.optimizers[0].param_groups[0]["lr"])


class EndRate(Callback):
    """The learning rate the optimiser holds once the fit has ended (after its last step's schedule)."""

    at_end: ClassVar[float | None] = None

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        EndRate.at_end = trainer.optimizers[0].param_groups[0]["lr"]


NO_CEILING = ["experiment=lstm", "trainer.max_epochs=-1", "model.width=16", "model.layers=1"]


def test_an_lstm_without_a_ceiling_warms_up_over_its_first_epoch(tiny_brown_path: Path, tmp_path: Path) -> None:
    """`trainer.max_epochs=-1` ("-1 for no limit") failed in AdamW's warm-up, int(inf) steps: OverflowError and a
    FAILED run. Now the rate rises over the first epoch's 3 steps, then holds until a plateau; early stopping ends the
    run (an improvement of 1e9 is never met: after epoch 2)."""
    overrides = [*NO_CEILING, f"data.path={tiny_brown_path}", "data.split.train=5000", "data.split.valid=1000"]
    overrides += ["data.split.test=1000", "trainer.limit_train_batches=3", "callbacks.early_stopping.patience=0"]
    overrides += ["+callbacks.early_stopping.min_delta=1e9", f"tracking.uri=sqlite:///{tmp_path}/m.db"]
    overrides += ["+callbacks.rates={_target_:test_sequence_runs.Rates}"]
    Rates.seen.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        cfg = composed(*overrides, f"callbacks.model_checkpoint.dirpath={tmp_path}/c")
        run_id, _ = ledger.run(cfg)
    assert mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db").get_run(run_id).info.status == "FINISHED"
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    assert len(client.get_metric_history(run_id, "valid_ppl_epoch")) == 2
    assert Rates.seen == pytest.approx([cfg.optim.lr * s / 3 for s in (1, 2, 3)] + [cfg.optim.lr] * 3)


def test_a_cosine_without_a_ceiling_is_refused_in_one_line() -> None:
    """optim.plateau_factor=null's cosine falls to its floor at the last epoch, which a run without one has not."""
    with pytest.raises(NplmError, match=r"^trainer.max_epochs=-1 has no last epoch for optim.plateau_factor=null"):
        check_config(composed(*NO_CEILING, "optim.plateau_factor=null"))
    check_config(composed(*NO_CEILING))  # plateaus and early stopping need no ceiling


def test_the_budgets_rate_rises_then_falls_to_a_tenth_when_the_budget_is_spent() -> None:
    """optim.anneal_to_time's factor, by the fraction of trainer.max_time spent: the rise over `warmup` of it, then
    the cosine, half way down at half the rest, a tenth at the budget and after it."""
    assert (budget_rate(0.0, 0.1), budget_rate(0.05, 0.1), budget_rate(0.1, 0.1)) == pytest.approx((0.0, 0.5, 1.0))
    assert budget_rate(0.55, 0.1) == pytest.approx(0.55)  # (1 + 0.1) / 2
    assert budget_rate(1.0, 0.1) == pytest.approx(0.1) and budget_rate(1.3, 0.1) == pytest.approx(0.1)
    assert budget_rate(0.0, 0.0) == 1.0  # no rise: the peak at once
    assert budget_rate(1.0, 0.1, 0.0) == 0.0 and budget_rate(0.55, 0.1, 0.0) == pytest.approx(0.5)  # cosine_floor=0


def test_a_cosine_floor_outside_zero_to_one_is_refused_in_one_line() -> None:
    """`optim.cosine_floor`: where adamw's cosine ends, a fraction of optim.lr; absent, a tenth, as every stored run."""
    check_config(composed("experiment=lstm", "optim.plateau_factor=null", "+optim.cosine_floor=0"))
    with pytest.raises(NplmError, match=r"optim.cosine_floor"):
        check_config(composed("experiment=lstm", "optim.plateau_factor=null", "+optim.cosine_floor=1.5"))


def test_a_resumed_run_goes_on_down_the_cosine_from_its_checkpointed_seconds() -> None:
    """The factor reads the Timer's fit seconds, which a checkpoint keeps: a run resumed 60 s into a 100 s budget (its
    Timer restored as Lightning restores it from the checkpoint) trains on at 60% of the way, not from its peak."""
    timer = Timer(duration="00:00:01:40")
    timer.load_state_dict({"time_elapsed": {"train": 60.0}})
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    to_time_budget(optimizer, timer, 0.0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * budget_rate(0.6, 0.0))


@pytest.mark.slow  # over 10 s
@pytest.mark.parametrize("anneal", [True, False], ids=["anneal_to_time", "cosine_to_max_epochs"])
def test_a_time_budget_ends_annealed_only_when_the_schedule_ends_at_it(
    anneal: bool, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """A real LSTM run stopped by trainer.max_time (3 s, of a ceiling it never reaches). With optim.anneal_to_time the
    rate falls along the fit's seconds to a tenth of optim.lr by the end; without it adamw's cosine runs to
    trainer.max_epochs, and the run stops with its rate at its peak. Either way the run records what stopped it."""
    overrides = ["experiment=lstm", "model.width=16", "model.layers=1", "model.output=standard", "optim.warmup=0"]
    overrides += ["optim.plateau_factor=null"]
    overrides += [f"data.path={tiny_brown_path}", *data_slice(5000, 1000, 1000), "trainer.max_epochs=100000"]
    overrides += ["+trainer.max_time='00:00:00:03'", "callbacks.early_stopping.patience=100000"]
    overrides += ["+callbacks.rates={_target_:test_sequence_runs.Rates}", f"tracking.uri=sqlite:///{tmp_path}/m.db"]
    overrides += ["+callbacks.end_rate={_target_:test_sequence_runs.EndRate}", "trainer.enable_progress_bar=false"]
    overrides += ["+optim.anneal_to_time=true"] if anneal else []
    Rates.seen.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        cfg = composed(*overrides, f"callbacks.model_checkpoint.dirpath={tmp_path}/c")
        run_id, _ = ledger.run(cfg)
    metrics = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db").get_run(run_id).data.metrics
    assert "max_time_epoch" in metrics and metrics["fit_seconds"] >= 3
    peak, last = cfg.optim.lr, EndRate.at_end
    assert Rates.seen[0] == pytest.approx(peak) and last is not None
    assert last == pytest.approx(0.1 * peak, rel=1e-3) if anneal else last > 0.99 * peak
