"""Training eq. (1) with Lightning, and its probability of every token of a split, for the run ledger and the bench."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from nplm_repro.data.corpus import Corpus
from nplm_repro.data.splits import SPLITS
from nplm_repro.data.windows import loader
from nplm_repro.models.lightning_module import NPLMModule, TokenProbs

# Early stopping acts on the validations that happened: Lightning's default would also check at the end of a
# training epoch cut short by max_steps (no validation, so no metric: an error). For whole epochs the decisions
# are the same, so this is no part of a run's config (nor of its key).
ACTS_ON = {"early_stopping": {"check_on_train_epoch_end": False}}


def train_neural(cfg: DictConfig, corpus: Corpus, logger: Logger, resume_from: Path | None = None) -> dict[str, float]:
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


def token_probs(cfg: DictConfig, module: NPLMModule, corpus: Corpus, split: str) -> np.ndarray:
    """P(w_t | context) of every token of a split, float64, in order (Trainer.predict in this process)."""
    writer = TokenProbs(corpus.size(split))
    one_device = {**cfg.trainer, "devices": 1, "strategy": "auto"}
    trainer = L.Trainer(**one_device, logger=False, enable_checkpointing=False, callbacks=[writer])
    trainer.predict(module, loader(corpus, split, cfg.model.n, cfg.data.eval_batch_size), return_predictions=False)
    return writer.probs.numpy()
