"""`nplm-train`: fit one model on a corpus and record the run in MLflow. Composes the parts, nothing clever.

nplm-train +experiment=mlp5                # a Table 1 MLP row (eq. 1, trained by Lightning)
nplm-train +experiment=kn4                 # a Table 1 n-gram row (counted, no training loop)
nplm-train model.h=100 trainer.max_epochs=3
nplm-train -cd sweeps -cn brown_table1     # a study: every row, in parallel, under one MLflow parent run
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pickle
import time
import traceback
from pathlib import Path

import hydra
import lightning as L
import mlflow
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from omegaconf import DictConfig, OmegaConf

from nplm_repro.config import check_config, cli, errors_exit, is_neural, one_line
from nplm_repro.corpus import END_OF_TEXT, SPLITS, Corpus, load_corpus
from nplm_repro.errors import NplmError, interrupted, sigterm_interrupts
from nplm_repro.memory import keep_freed_memory
from nplm_repro.mixture import TrigramMixture
from nplm_repro.module import NPLMModule, TokenProbs
from nplm_repro.ngram import DeletedInterpolation, NgramModel, perplexity_of
from nplm_repro.precision import resolve
from nplm_repro.sweep import config_lock, ends_sweeps, launcher_threads, mlp_lock
from nplm_repro.tracking import (
    RunLogger,
    check_store,
    config_key,
    end_orphans,
    find_finished,
    find_resumable,
    model_key,
    open_run,
)
from nplm_repro.windows import WindowBatches, windows

log = logging.getLogger(__name__)


def loader(corpus: Corpus, split: str, n: int, batch_size: int, shuffle: bool = False, seed: int = 0) -> WindowBatches:
    """Batches of a split: shuffled ones are for training, and are split between DDP's processes."""
    start, end = corpus.bounds[split]
    rows = windows(corpus.ids, start, end, n, pad_id=corpus.vocab.index(END_OF_TEXT))
    return WindowBatches(rows, batch_size, shuffle=shuffle, seed=seed, shard=shuffle)


# Early stopping acts on the validations that happened: Lightning's default would also check at the end of a
# training epoch cut short by max_steps (no validation, so no metric: an error). For whole epochs the decisions
# are the same, so this is no part of a run's config (nor of its key).
ACTS_ON = {"early_stopping": {"check_on_train_epoch_end": False}}


def train_neural(
    cfg: DictConfig, corpus: Corpus, logger: RunLogger, resume_from: Path | None = None
) -> dict[str, float]:
    """Train eq. (1) (or continue from checkpoint `resume_from`), keep the best-validation checkpoint, score every
    split with it."""
    n, eval_batch = cfg.model.n, cfg.data.eval_batch_size
    architecture = {k: v for k, v in cfg.model.items() if k != "mix"}
    module = instantiate(architecture, vocab_size=corpus.vocab_size, optim=cfg.optim, _convert_="all")
    bars = cfg.trainer.get("enable_progress_bar", True)  # a progress bar callback with the bar off is an error
    callbacks = [
        instantiate(c, **ACTS_ON.get(name, {})) for name, c in cfg.callbacks.items() if bars or name != "progress_bar"
    ]
    if cfg.trainer.get("max_time") is None:  # with max_time, Lightning adds its own Timer
        callbacks.append(Timer())  # the fit's wall time, carried across resumes in the checkpoint
    trainer = L.Trainer(**cfg.trainer, logger=logger, callbacks=callbacks)
    trainer.fit(
        module,
        train_dataloaders=loader(corpus, "train", n, cfg.optim.batch_size, shuffle=True, seed=cfg.seed),
        val_dataloaders=loader(corpus, "valid", n, eval_batch),
        ckpt_path=resume_from,
    )
    # the report's costs, read before `test` restores the best checkpoint (and with it the Timer's past time):
    # epochs trained and seconds in fit (training and validation), across resumes
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    cost = {"epochs": float(trainer.current_epoch), "fit_seconds": timer.time_elapsed("train")}
    checkpoint = trainer.checkpoint_callback
    best = checkpoint.best_model_path if isinstance(checkpoint, ModelCheckpoint) else ""
    trainer.test(module, [loader(corpus, s, n, eval_batch) for s in SPLITS], ckpt_path=best or None)
    if best:
        logger.experiment.log_artifact(logger.run_id, best, "checkpoints")
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.endswith(("_ppl", "_tokens"))}
    logger.log_metrics(cost)
    return metrics | cost


def fit_ngram(cfg: DictConfig, corpus: Corpus, logger: RunLogger) -> dict[str, float]:
    """Count on train (weights by EM on valid where the model has them), score every split."""
    model: NgramModel = instantiate(cfg.model, _convert_="all")
    start = time.perf_counter()
    model.fit(corpus)
    metrics = {"fit_seconds": time.perf_counter() - start}
    for split in SPLITS:
        metrics[f"{split}_ppl"] = model.perplexity(corpus, split)
        metrics[f"{split}_tokens"] = float(corpus.size(split))
    metrics["score_seconds"] = time.perf_counter() - start - metrics["fit_seconds"]
    logger.log_hyperparams({f"fit.{k}".replace("+", "plus"): v for k, v in model.describe().items()})
    logger.log_metrics(metrics)
    return metrics


def token_probs(cfg: DictConfig, module: NPLMModule, corpus: Corpus, split: str) -> np.ndarray:
    """P(w_t | context) of every token of a split, float64, in order (Trainer.predict in this process)."""
    writer = TokenProbs(corpus.size(split))
    one_device = {**cfg.trainer, "devices": 1, "strategy": "auto"}
    trainer = L.Trainer(**one_device, logger=False, enable_checkpointing=False, callbacks=[writer])
    trainer.predict(module, loader(corpus, split, cfg.model.n, cfg.data.eval_batch_size), return_predictions=False)
    return writer.probs.numpy()


def mix_with_trigram(cfg: DictConfig, corpus: Corpus, logger: RunLogger, base: str) -> dict[str, float]:
    """Mix the MLP of finished run `base` with the interpolated trigram on valid and test (no retraining)."""
    fix = "restore it, or train that MLP again (its row with rerun=true) so that the mixture finds the new run"
    try:
        path = mlflow.artifacts.download_artifacts(
            run_id=base, artifact_path="checkpoints/best.ckpt", tracking_uri=cfg.tracking.uri
        )
    except mlflow.exceptions.MlflowException:
        raise NplmError(f"the MLP this row mixes (run {base}) has lost its checkpoints/best.ckpt: {fix}") from None
    try:
        module = NPLMModule.load_from_checkpoint(path, map_location="cpu")
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise NplmError(
            f"the checkpoint of the MLP this row mixes (run {base}) is unreadable ({str(error).split('. ')[0]}): {fix}"
        ) from None
    mlp = {split: token_probs(cfg, module, corpus, split) for split in ("valid", "test")}
    mixture = TrigramMixture(cfg.model.mix, DeletedInterpolation().fit(corpus)).fit(corpus, mlp["valid"])
    metrics: dict[str, float] = {}
    for split, probs in mlp.items():
        metrics[f"{split}_ppl"] = perplexity_of(mixture.probs(corpus, split, probs))
        metrics[f"mlp_{split}_ppl"] = perplexity_of(probs)
        metrics[f"{split}_tokens"] = float(len(probs))
    logger.log_hyperparams({f"mix.{k}": v for k, v in mixture.describe().items()})
    logger.log_metrics(metrics)
    return metrics


def base_run(cfg: DictConfig, corpus: Corpus, tags: dict[str, str]) -> str:
    """The finished run of the same MLP without mixture (same model_key); trained first if there is none.

    Under the MLP's lock: if its own row's job is training it right now, this waits for that run.
    """
    key = model_key(cfg, corpus)
    with mlp_lock(key):
        found = find_finished(cfg.tracking.uri, cfg.tracking.experiment, model_key=key)
        if found:
            log.info("mixing the MLP of run %s (model_key %s)", found, key)
            return found
        log.info("no finished run of this MLP (model_key %s) yet: training it first, as a run of its own", key)
        unmixed = cfg.copy()
        unmixed.model.mix, unmixed.row = "none", None
        unmixed_key = config_key(unmixed, corpus)
        with config_lock(unmixed_key):
            return record(unmixed, corpus, unmixed_key, tags)[0]


def run(cfg: DictConfig) -> tuple[str, dict[str, float]]:
    """One row: the model `cfg.model` names, on the corpus `cfg.data` names; returns its run id and metrics.

    A job whose config and data already have a FINISHED run (tag config_key) returns that run, unless
    `rerun=true`. The config's lock is held from the search to the end of the run (see `record`).
    """
    check_config(cfg)
    check_store(cfg.tracking.uri, experiment=cfg.tracking.experiment)
    threads = cfg.threads or launcher_threads()
    if threads:
        torch.set_num_threads(threads)
    log.info("%s: torch threads %d", cfg.get("row") or "run", torch.get_num_threads())
    corpus = load_corpus(cfg.data)
    # auto becomes what this machine runs faster before the config is keyed: the key says what computed
    precision_tags: dict[str, str] = {}
    if is_neural(cfg) and cfg.optim.output == "sampled":
        cfg.trainer.precision = "32-true"  # what sampled training computes in (check_config allows only auto)
    else:
        cfg.trainer.precision, precision_tags = resolve(cfg.trainer.precision, cfg.trainer.accelerator)
    key = config_key(cfg, corpus)
    trains_mlp = is_neural(cfg) and cfg.model.mix == "none"
    with mlp_lock(model_key(cfg, corpus)) if trains_mlp else contextlib.nullcontext(), config_lock(key):
        found = None if cfg.rerun else find_finished(cfg.tracking.uri, cfg.tracking.experiment, config_key=key)
        if found:
            return reuse(cfg, found)
        return record(cfg, corpus, key, precision_tags)


def reuse(cfg: DictConfig, found: str) -> tuple[str, dict[str, float]]:
    """Skip a job that has already run; a run trained for a mixed row (no row tag) takes this job's row."""
    client = mlflow.MlflowClient(cfg.tracking.uri)
    run_ = client.get_run(found)
    log.info(
        "skipped: run %s already has this config and data (config_key %s); rerun=true runs it again",
        found,
        run_.data.tags["config_key"],
    )
    if cfg.get("row") and "row" not in run_.data.tags:
        client.set_tag(found, "row", cfg.row)
    return found, dict(run_.data.metrics)


def record(cfg: DictConfig, corpus: Corpus, key: str, tags: dict[str, str]) -> tuple[str, dict[str, float]]:
    """Fit or train the model and record it as one MLflow run (tagged with its config_key and `tags`).

    The caller holds the config's lock, so a run of this config still RUNNING has lost its process (`kill -9`,
    out of memory). An MLP whose last run of this config was killed (KILLED, or such a RUNNING one) continues
    from that run's last checkpoint, in that run, unless `rerun=true`; other RUNNING runs of the config are
    marked KILLED, or the report would show them running forever. A failed run gets the tag `error` and
    error.txt.
    """
    L.seed_everything(cfg.seed, workers=True)
    resume = None
    tags = dict(tags)
    if not is_neural(cfg):
        fit = fit_ngram
    elif cfg.model.mix == "none":
        fit, tags["model_key"] = train_neural, model_key(cfg, corpus)
        if cfg.callbacks.get("model_checkpoint"):
            resume = None if cfg.rerun else find_resumable(cfg.tracking.uri, cfg.tracking.experiment, key)
            checkpoints = resume[1].parent if resume else Path(cfg.callbacks.model_checkpoint.dirpath).resolve()
            cfg.callbacks.model_checkpoint.dirpath = tags["checkpoint_dir"] = str(checkpoints)
            if resume:
                log.info("resuming run %s from %s", *resume)
                fit = functools.partial(train_neural, resume_from=resume[1])
    else:
        base = base_run(cfg, corpus, tags)
        fit, tags["base_run_id"] = functools.partial(mix_with_trigram, base=base), base
    end_orphans(cfg.tracking.uri, cfg.tracking.experiment, key, keep=resume[0] if resume else None)
    logger = open_run(cfg, corpus, resume=resume[0] if resume else None, config_key=key, **tags)
    try:
        metrics = fit(cfg, corpus, logger)
        logger.experiment.log_text(logger.run_id, OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        logger.experiment.log_text(logger.run_id, corpus.summary() + "\n", "data.txt")
        logger.close()
    except BaseException as error:
        if not interrupted(error):
            logger.experiment.set_tag(logger.run_id, "error", one_line(error))
            logger.experiment.log_text(logger.run_id, traceback.format_exc(), "error.txt")
        logger.finalize("failed")
        raise
    log.info("%s: %s", cfg.get("row") or "run", ", ".join(f"{k} {v:,.2f}" for k, v in sorted(metrics.items())))
    return logger.run_id, metrics


@hydra.main(config_path=str(Path(__file__).resolve().parents[1] / "conf"), config_name="config", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    keep_freed_memory()
    sigterm_interrupts()  # in joblib's and submitit's workers too, which run only this function
    with contextlib.nullcontext() if HydraConfig.get().mode == RunMode.MULTIRUN else errors_exit():
        run(cfg)


main = cli(ends_sweeps(_main))

if __name__ == "__main__":
    main()
