"""sweeps/brown_recipe.yaml: its jobs as Hydra composes them, the recipes' knobs composed in the optimiser, and the
run keys of optim=paper and optim=fast left as they were."""

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import CONF, composed
from mlflow.entities import Param
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf
from test_sweeps import jobs_of

from nplm_repro.data.brown import prepare_brown
from nplm_repro.data.windows import loader
from nplm_repro.errors import NplmError
from nplm_repro.migrations import former_config
from nplm_repro.models.lightning_module import NPLMModule
from nplm_repro.models.schedules import schedules
from nplm_repro.reporting.recipe import Recipe, step_of
from nplm_repro.studies import declaration
from nplm_repro.tracking.components import same_recipe
from nplm_repro.tracking.config_checks import check_config
from nplm_repro.tracking.keys import config_key, model_key
from nplm_repro.tracking.records import flat_params

FP = "0123456789abcdef"
FIXED = ("data.path=brown.zip", "callbacks.model_checkpoint.dirpath=checkpoints")  # what the sweep resolves
STEPS = Recipe.declared(declaration("brown_recipe")["recipe"]).steps  # the steps the study file declares
STEP_JOBS = ("mlp5_paper", "mlp5_batch256", "mlp5_rate5x", "mlp5_drop", "mlp5_fast")  # in STEPS' order


def job(name: str, *overrides: str) -> DictConfig:
    """A job of the study as its sweep composes it."""
    return composed("study=brown_recipe", f"experiment=brown_recipe/{name}", *FIXED, *overrides)


def step(cfg: DictConfig) -> str | None:
    """The report's step of a job, read from the params it would log (as MLflow keeps them: strings); a mixture's,
    from the params of the MLP it mixes, trained with its recipe (tracking/components.py `same_recipe`)."""
    if "components" in cfg.model:
        mlp = composed("experiment=mlp5", *FIXED)
        OmegaConf.set_struct(mlp, False)
        mlp.optim, cfg = cfg.optim, mlp
    params = {k: str(v) for k, v in flat_params(cfg).items() if k.startswith("optim.")}
    found = step_of(json.dumps(params), STEPS)
    return found.name if found else None


def test_the_study_runs_the_paper_recipe_rows_and_the_steps_mixtures_last() -> None:
    jobs = [j[0].removeprefix("experiment=brown_recipe/") for j in jobs_of("brown_recipe")]
    assert jobs == ["mlp5_paper", "mlp9_paper", *STEP_JOBS[1:], "experiment=del_int", "mlp6_paper", "mlp10_paper"]
    files = [p.stem for p in (CONF / "experiment" / "brown_recipe").glob("*.yaml")]
    assert sorted(j for j in jobs if "=" not in j) == sorted(files)


def test_each_step_job_is_its_step_one_knob_after_the_other() -> None:
    """Every job composes (real Hydra, the study file), passes the config checks, is the step the report names it
    by, with the exact softmax, and early stopping, not the epoch limit, ends it."""
    for name, expected in zip(STEP_JOBS, STEPS, strict=True):
        cfg = job(name)
        check_config(cfg)
        assert (cfg.row, cfg.model.get("mix", "none"), cfg.optim.output) == ("MLP5", "none", "exact")
        assert (cfg.trainer.max_epochs, cfg.callbacks.early_stopping.patience, cfg.study) == (200, 2, "brown_recipe")
        assert step(cfg) == expected.name
    for name, row in (("mlp9_paper", "MLP9"), ("mlp6_paper", "MLP6"), ("mlp10_paper", "MLP10")):
        cfg = job(name)
        check_config(cfg)
        assert cfg.row == row and step(cfg) == "paper"
    assert OmegaConf.to_container(job("mlp5_fast").optim) == OmegaConf.to_container(
        composed("study=brown_recipe", "experiment=mlp5", "optim=fast", "data.path=brown.zip").optim
    )


@pytest.mark.parametrize("mixed,trained", [("mlp6_paper", "mlp5_paper"), ("mlp10_paper", "mlp9_paper")])
def test_a_mixed_row_mixes_the_paper_recipe_mlp_not_a_fast_one(mixed: str, trained: str, tmp_path: Path) -> None:
    """Its row's runs in the study are of every step: the component is the run trained with the mixture's recipe,
    and its stored run (an MLP with model.mix, from before) holds that MLP's model."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("brown")
    runs = {}
    for name in (trained, "mlp5_fast", "mlp5_batch256"):
        cfg = job(name)
        run = client.create_run(experiment, tags={"config_key": config_key(cfg, FP)})
        client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in flat_params(cfg).items()])
        runs[name] = client.get_run(run.info.run_id)
    chosen = same_recipe(list(runs.values()), job(mixed))
    assert [r.info.run_id for r in chosen] == [runs[trained].info.run_id]
    former = former_config(job(trained), "fixed", "brown_recipe")
    assert model_key(former, FP) == model_key(job(trained), FP)


def test_the_recipes_keep_their_keys_and_gain_no_key() -> None:
    """The knobs composed without a new key in optim=paper or optim=fast: their runs' keys are as stored."""
    paper = composed("experiment=mlp5", "optim=paper", "trainer.precision=32-true", "data.path=brown.zip")
    fast = composed("experiment=mlp5", "trainer.precision=32-true", "data.path=brown.zip")
    assert "plateau_factor" not in paper.optim and "decay_rate" not in fast.optim
    assert (config_key(fast, FP), model_key(fast, FP)) == ("95160054aee03774", "8d570b9cfa835952")  # test_keys
    assert (config_key(paper, FP), model_key(paper, FP)) == (
        "97898f9644925ccf",
        "7189f6c036a9fbce",
    )  # HEAD before the knobs


@pytest.mark.parametrize("factor", [1.0, 0.0, -0.2])
def test_a_plateau_factor_torch_refuses_is_refused_before_any_work(factor: float) -> None:
    with pytest.raises(NplmError, match="^optim.plateau_factor="):
        check_config(composed("experiment=mlp5", f"optim.plateau_factor={factor}"))


def sgd(lr: float = 1.0) -> torch.optim.SGD:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def lr_after(optimizer: torch.optim.SGD, found: list[dict], steps: int, epochs: list[float] = ()) -> float:
    """Run `steps` optimiser steps, then one plateau check per validation value in `epochs`, then `steps` more."""
    per_step = [c["scheduler"] for c in found if c.get("interval") == "step"]
    plateau = [c["scheduler"] for c in found if "monitor" in c]
    for value in [None, *epochs]:
        if value is not None:
            for scheduler in plateau:
                scheduler.step(value)
        for _ in range(steps):
            optimizer.step()
            for scheduler in per_step:
                scheduler.step()
    return optimizer.param_groups[0]["lr"]


def test_each_recipe_alone_keeps_its_scheduler() -> None:
    lr = torch.optim.lr_scheduler
    paper, fast = schedules(sgd(), 1e-3, None, 64), schedules(sgd(), None, 0.2, 256)
    assert [type(c["scheduler"]) for c in paper] == [lr.LambdaLR] and paper[0]["interval"] == "step"
    assert [type(c["scheduler"]) for c in fast] == [lr.ReduceLROnPlateau]
    assert fast[0]["monitor"] == "valid_ppl_epoch"
    assert schedules(sgd(), None, None, 256) == []  # plateau_factor=null: a constant rate


def test_decay_and_drop_compose_to_the_decayed_rate_times_the_drops() -> None:
    """eps_0 / (1 + r t) at every step, times 0.2 once validation stops improving; the decay alone as before."""
    r, batch = 1e-3, 64
    alone = sgd()
    assert lr_after(alone, schedules(alone, r, None, batch), 5) == pytest.approx(1 / (1 + r * batch * 5))
    both = sgd()
    found = schedules(both, r, 0.2, batch)
    assert lr_after(both, found, 5) == pytest.approx(1 / (1 + r * batch * 5), rel=1e-12)
    both = sgd()
    found = schedules(both, r, 0.2, batch)
    # 3 epochs of 5 steps: the first validation sets the best, the second improves, the third does not: one drop
    assert lr_after(both, found, 5, [300.0, 290.0, 295.0]) == pytest.approx(0.2 / (1 + r * batch * 20), rel=1e-12)


def test_lightning_steps_both_schedules_of_a_composed_recipe(tiny_brown_path: Path) -> None:
    """A real Trainer, one epoch of 3 batches: Lightning takes both schedulers, the decay stepped per batch."""
    corpus = prepare_brown(str(tiny_brown_path), train=3000, valid=500, test=700)
    optim = OmegaConf.to_container(job("mlp5_drop", "optim.decay_rate=1e-3").optim)
    module = NPLMModule(corpus.vocab_size, n=3, m=8, h=8, direct=True, optim=optim)
    trainer = L.Trainer(
        max_epochs=1, limit_train_batches=3, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    train = loader(corpus, "train", n=3, batch_size=optim["batch_size"], shuffle=True)
    trainer.fit(module, train, loader(corpus, "valid", n=3, batch_size=512))
    kinds = [type(c.scheduler).__name__ for c in trainer.lr_scheduler_configs]
    assert kinds == ["MultiplicativeLR", "ReduceLROnPlateau"]
    rate = trainer.optimizers[0].param_groups[0]["lr"]
    assert rate == pytest.approx(5e-3 * 256 / (1 + 1e-3 * 256 * 3), rel=1e-9)  # the first validation sets the best
