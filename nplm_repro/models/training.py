"""Training a LightningModule family (eq. (1), the LSTM, the Transformer) with Lightning, and its score of every
token of a split (the run's kept scores, nplm-score)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence, Sized
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer, TQDMProgressBar
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from nplm_repro.data.corpus import Corpus
from nplm_repro.data.module import CorpusData
from nplm_repro.data.splits import SPLITS
from nplm_repro.errors import raise_if_signalled
from nplm_repro.progress import report_status
from nplm_repro.scores import KEPT_SPLITS, Scores

log = logging.getLogger(__name__)

# How callbacks act, never what a run computes, so no part of its config (nor of its key):
# - early stopping acts on the validations that happened: Lightning's default would also check at the end of a
#   training epoch cut short by max_steps (no validation, so no metric: an error);
# - Lightning 2.6's save_last writes last.ckpt only when the monitored checkpoint is saved, i.e. with a new best,
#   so a killed run would resume from its best epoch and train the later ones again: `resume_point` writes it.
ACTS_ON = {"early_stopping": {"check_on_train_epoch_end": False}, "model_checkpoint": {"save_last": False}}


def resume_point(best: DictConfig) -> ModelCheckpoint:
    """last.ckpt, written after every epoch beside the best checkpoint: where a killed run resumes."""
    last = ModelCheckpoint.CHECKPOINT_NAME_LAST
    return ModelCheckpoint(dirpath=best.dirpath, filename=last, save_top_k=1, enable_version_counter=False)


class ProgressBar(TQDMProgressBar):
    """Lightning's bar with readable numbers: tokens/s as an integer, perplexity with one decimal."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        items = {k: f"{v:.1f}" if "ppl" in k and isinstance(v, float) else v for k, v in items.items()}
        if trainer.training and hasattr(pl_module, "tokens_per_s"):  # a LanguageModule's training
            items["tok/s"] = f"{pl_module.tokens_per_s():,.0f}"
        return items


class EpochStatus(Callback):
    """The epoch a sweep's job is at, for the sweep's progress display (nplm_repro/progress.py), and the epochs a
    resumed job had trained before: work the display's time left must not count as this launch's pace."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        report_status(epochs_before=trainer.current_epoch, max_epochs=trainer.max_epochs)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        report_status(state="training", epoch=trainer.current_epoch + 1, max_epochs=trainer.max_epochs)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        report_status(state="scoring")


class FitClock(Callback):
    """The seconds in fit (training and validation, across resumes: the Timer's) at each validation, logged as
    `fit_seconds_epoch` beside `valid_ppl_epoch`, through the same `log` and so at the same step (Lightning logs an
    epoch's metrics one step before `global_step`): the report's validation perplexity against CPU time."""

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
        if trainer.sanity_checking or timer is None:
            return
        pl_module.log("fit_seconds_epoch", timer.time_elapsed("train"))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The fit's cost, epochs trained and seconds in fit (training and validation, across resumes), among the
        trainer's callback metrics: what processes spawned for several devices hand back to the job's (`fit_cost`)."""
        timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
        cost = {"epochs": float(trainer.current_epoch), "fit_seconds": timer.time_elapsed("train")}
        trainer.callback_metrics.update({k: torch.tensor(v, dtype=torch.float64) for k, v in cost.items()})


class StopReason(Callback):
    """What ended the fit, logged at its end as the metric `<why>_epoch` (the epochs trained), as a search's trial logs
    `pruned_epoch` or `budget_epoch`: `early_stopping`, `max_time` (the Timer's budget spent: the fit's seconds,
    training and validation), `max_steps` or `max_epochs` (the ceiling), the first that holds; none when something
    else stopped it (a search's pruner or budget, which log their own). The report's `stopped` column and its
    not-converged note read it (tracking/stops.py)."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        why = stop_reason(trainer)
        if why and trainer.logger is not None:
            trainer.logger.log_metrics({f"{why}_epoch": float(trainer.current_epoch)}, step=trainer.global_step)


def stop_reason(trainer: L.Trainer) -> str:
    """Which of the trainer's stopping rules ended its fit ('' for none of them). Early stopping's stopped_epoch is
    the epoch it stopped in, from 0, and it never stops in the first: the first validation always improves on none."""
    stopping = trainer.early_stopping_callback
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    remaining = timer.time_remaining() if timer is not None else None
    if stopping is not None and stopping.stopped_epoch > 0:
        return "early_stopping"
    if remaining is not None and remaining <= 0:
        return "max_time"
    if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
        return "max_steps"
    if trainer.max_epochs not in (None, -1) and trainer.current_epoch >= trainer.max_epochs:
        return "max_epochs"
    return ""


class Signalled(Callback):
    """Stops a fit or a scoring at the next batch after a Ctrl-C or SIGTERM whose KeyboardInterrupt was lost
    (`raise_if_signalled`), as Lightning does for SIGTERM on its own."""

    def on_train_batch_end(self, *_: Any) -> None:
        raise_if_signalled()

    on_validation_batch_end = on_test_batch_end = on_train_batch_end


class KeptScores(Callback):
    """Every token's ln P from `Trainer.test`, one float32 array per kept dataloader, filled as batches come.

    The scores are the very terms the logged perplexities sum (float32 from the exact softmax), so
    exp(-mean(scores)) gives the logged perplexity. Preallocated: kept as a list of small per-batch tensors,
    they would sit between the |V|-wide blocks of the next batches, fragment the heap and fault its pages in anew.
    """

    def __init__(self) -> None:
        self.scores: dict[int, torch.Tensor] = {}
        self._filled: dict[int, int] = {}

    def expect(self, sizes: dict[int, int]) -> None:
        """Keep dataloader i's scores in an array of sizes[i] tokens (the others are scored, not kept)."""
        self.scores = {i: torch.empty(size, dtype=torch.float32) for i, size in sizes.items()}
        self._filled = dict.fromkeys(sizes, 0)

    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if dataloader_idx in self.scores:
            at = self._filled[dataloader_idx]
            self.scores[dataloader_idx][at : at + len(outputs)] = -outputs.float().cpu()
            self._filled[dataloader_idx] = at + len(outputs)

    def kept(self, index: int) -> torch.Tensor:
        if self._filled[index] != len(self.scores[index]):
            raise RuntimeError(f"dataloader {index}: {self._filled[index]} of {len(self.scores[index])} tokens scored")
        return self.scores[index]


def fit_callbacks(cfg: DictConfig) -> list[Callback]:
    """The config's callbacks (no progress bar when bars are off), the resume point if `save_last`, a Timer, the
    epoch for a sweep's progress display, the fit's seconds at each validation, what ended the fit and a lost
    Ctrl-C's stop."""
    bars = cfg.trainer.get("enable_progress_bar", True)  # a progress bar callback with the bar off is an error
    kept = {name: c for name, c in cfg.callbacks.items() if bars or name != "progress_bar"}
    callbacks = [instantiate(c, **ACTS_ON.get(name, {})) for name, c in kept.items()]
    callbacks += [EpochStatus(), FitClock(), StopReason(), Signalled()]
    if cfg.callbacks.model_checkpoint.get("save_last"):
        callbacks.append(resume_point(cfg.callbacks.model_checkpoint))
    if cfg.trainer.get("max_time") is None:  # with max_time, Lightning adds its own Timer
        callbacks.append(Timer())  # the fit's wall time, carried across resumes in the checkpoint
    return callbacks


def build_module(cfg: DictConfig, corpus: Corpus) -> L.LightningModule:
    """The LightningModule `cfg.model` names, for `corpus`'s vocabulary (its class's `build`)."""
    return get_class(cfg.model._target_).build(cfg, corpus)


def best_checkpoint(callbacks: DictConfig) -> Path | None:
    """The best-validation checkpoint a run wrote (`callbacks`: the config's group), or None (no validation ran,
    or no checkpoint callback)."""
    checkpoint = callbacks.get("model_checkpoint")
    if not checkpoint:
        return None
    path = Path(checkpoint.dirpath) / f"{checkpoint.filename}{ModelCheckpoint.FILE_EXTENSION}"
    return path if path.is_file() else None


def at_least_one_batch(trainer: DictConfig, **batches: Sized) -> dict[str, Any]:
    """The trainer's settings, a fraction of a loader's batches (`limit_val_batches=0.25`: optim=sampled watches a
    quarter of validation) that is less than one batch made one batch, where Lightning would refuse it (`0.25 * 2 <
    1`): a small split's run then validates on its first batch. `batches`: each limit's key and the loader it cuts."""
    settings = dict(trainer)
    for key, loader in batches.items():
        limit = settings.get(key)
        if isinstance(limit, float) and 0 < limit < 1 and int(len(loader) * limit) == 0:  # Lightning's rounding
            log.info("trainer.%s=%s of %d batches is less than one: one batch", key, limit, len(loader))
            settings[key] = 1
    return settings


def one_device(trainer: DictConfig) -> dict[str, Any]:
    """The trainer's settings on one device of its accelerator: the exact evaluation, whose scores are kept."""
    return {**trainer, "devices": 1, "num_nodes": 1, "strategy": "auto"}


def train_neural(
    cfg: DictConfig, corpus: Corpus, logger: Logger, resume_from: Path | None = None
) -> tuple[dict[str, float], Scores]:
    """Train eq. (1) (or continue from checkpoint `resume_from`), keep the best-validation checkpoint
    (`best_checkpoint`; the ledger logs it as the run's Model), score every split with it (the weights as they are
    when no validation ran: a run stopped by max_steps before its first); returns the metrics and the kept scores of
    valid and test, from that one evaluation. The batches are the family's reading of the corpus (`reads`), made by
    one CorpusData (data/module.py) for the fit and the test."""
    module = build_module(cfg, corpus)
    scored = [s for s in SPLITS if s in module.evaluated]
    data = CorpusData(corpus, module.reads, cfg.optim.batch_size, cfg.data.eval_batch_size, cfg.seed, scored)
    keep = KeptScores()
    train, valid = data.train_dataloader(), data.val_dataloader()
    settings = at_least_one_batch(cfg.trainer, limit_train_batches=train, limit_val_batches=valid)
    trainer = L.Trainer(**settings, logger=logger, callbacks=[*fit_callbacks(cfg), keep])
    trainer.fit(module, datamodule=data, ckpt_path=resume_from)
    # the report's costs (FitClock's), read before `test` restores the best checkpoint (and with it the Timer's past
    # time): epochs trained and seconds in fit (training and validation), across resumes
    cost = {k: float(trainer.callback_metrics[k]) for k in ("epochs", "fit_seconds")}
    checkpoint = trainer.checkpoint_callback
    best = checkpoint.best_model_path if isinstance(checkpoint, ModelCheckpoint) else ""
    module.score_as(scored)
    keep.expect({scored.index(s): corpus.size(s) for s in KEPT_SPLITS})
    # scored in this process on one device: processes spawned for several devices would keep the scores
    tester = trainer
    if trainer.world_size > 1:
        tester = L.Trainer(
            **one_device(cfg.trainer), logger=logger, enable_checkpointing=False, callbacks=[keep, Signalled()]
        )
    start = time.perf_counter()
    tester.test(module, datamodule=data, ckpt_path=best or None, verbose=False)
    cost["score_seconds"] = time.perf_counter() - start
    metrics = {k: float(v) for k, v in tester.callback_metrics.items() if k.endswith(("_ppl", "_tokens"))}
    logger.log_metrics(cost)
    kept = {s: keep.kept(scored.index(s)).numpy() for s in KEPT_SPLITS}
    return metrics | cost, Scores.of(corpus.text_names(), kept, {s: corpus.text_ids(s) for s in KEPT_SPLITS})


def score_splits(
    cfg: DictConfig, module: L.LightningModule, corpus: Corpus, splits: Sequence[str]
) -> dict[str, np.ndarray]:
    """ln P(w_t | context) of every token of each split (any span of `corpus.bounds`), float32, by the same exact
    evaluation as a run's own (`Trainer.test`), in this process, on one device."""
    keep = KeptScores()
    # no bar: Lightning draws it on stdout, where nplm-score prints its result
    settings = {**one_device(cfg.trainer), "enable_progress_bar": False}
    trainer = L.Trainer(**settings, logger=False, enable_checkpointing=False, callbacks=[keep, Signalled()])
    keep.expect({i: corpus.size(s) for i, s in enumerate(splits)})
    module.score_as(splits)
    batch = cfg.data.eval_batch_size  # nothing is trained: the training batch's size is never read
    trainer.test(module, datamodule=CorpusData(corpus, module.reads, batch, batch, scored=splits), verbose=False)
    return {s: keep.kept(i).numpy() for i, s in enumerate(splits)}


def token_probs(cfg: DictConfig, module: L.LightningModule, corpus: Corpus, split: str) -> np.ndarray:
    """P(w_t | context) of every token of a split, float64, in order (the bench's mixture line)."""
    return np.exp(score_splits(cfg, module, corpus, [split])[split].astype(np.float64))
