"""The run ledger: one job becomes one MLflow run, unless its config already ran (skip) or was killed (resume).

`run` is a job: check, load the corpus, resolve the precision (`models.precision.job_precision`), then under the
config's lock find a FINISHED run of its config_key (skip; a mixture of an MLP and Del. Int. also of the key
its row had before it was a mixture, `former_key`), or of its trained model's model_key in another study (`adopt`
it into this one, untrained), or `record` one: resume the config's newest run from its last checkpoint if a kill
interrupted it, mark orphaned RUNNING runs KILLED, fit or train, log. Every look-up is one `search` of the
experiment's runs.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import traceback
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import mlflow
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class
from mlflow.entities import Run, RunTag
from omegaconf import DictConfig, OmegaConf

from nplm_repro.data.corpus import Corpus
from nplm_repro.data.load import load_corpus
from nplm_repro.data.splits import SPLITS
from nplm_repro.errors import NplmError, interrupted, one_line
from nplm_repro.family import family_of
from nplm_repro.migrations import CHECKPOINT_BEFORE_MODELS
from nplm_repro.models.language_module import DIVERGED
from nplm_repro.models.outputs import Training, training_of
from nplm_repro.models.precision import choices, job_precision
from nplm_repro.models.training import best_checkpoint
from nplm_repro.progress import report_status
from nplm_repro.scores import ARTIFACT, Scores
from nplm_repro.serving.features import log_features
from nplm_repro.serving.scoring import RunScorer, has_weights
from nplm_repro.serving.served import log_model
from nplm_repro.storage.archive import ARCHIVED_FROM, ARCHIVED_ID
from nplm_repro.storage.finding import find_finished, search
from nplm_repro.storage.kept import kept_scores, log_scores
from nplm_repro.storage.locks import config_lock, model_lock
from nplm_repro.storage.redaction import redact
from nplm_repro.storage.store import open_store, reach_store
from nplm_repro.tracking.archived import keep_run
from nplm_repro.tracking.components import ComponentFailed, component_runs, former_key
from nplm_repro.tracking.config_checks import check_sizes
from nplm_repro.tracking.keys import config_key, family, model_key, trains
from nplm_repro.tracking.records import check_system_metrics, open_run

log = logging.getLogger(__name__)


def last_checkpoint(run: Run) -> Path | None:
    """The last checkpoint of a run a kill interrupted (KILLED, or RUNNING with its process gone), else None."""
    if run.info.status not in ("KILLED", "RUNNING"):
        return None
    directory = run.data.tags.get("checkpoint_dir")
    last = Path(directory or "") / "last.ckpt"
    return last if directory and last.is_file() else None


def find_resumable(uri: str, experiment: str, config_key: str) -> tuple[str, Path] | None:
    """The newest run of this config, with the last checkpoint it wrote, if a kill interrupted it; else None. Never an
    older run: the newest is the config's latest state (it may have restarted from scratch, `rerun=true`), and an
    older checkpoint would bring back what came before it. The caller holds the config's lock, so no live job owns
    the run."""
    runs = search(uri, experiment, f"tags.config_key = '{config_key}'", max_results=1)
    last = last_checkpoint(runs[0]) if runs else None
    return (runs[0].info.run_id, last) if last else None


ORPHANED = "its process ended without ending the run (kill -9, out of memory, a lost machine)"


def end_orphans(uri: str, experiment: str, config_key: str, keep: str | None = None) -> None:
    """Mark KILLED (tag `killed_because`) the runs of this config still RUNNING, but `keep`. The caller holds the
    config's lock, which a live job recording such a run would hold: their process is gone."""
    client = mlflow.MlflowClient(uri)
    for run in search(uri, experiment, f"tags.config_key = '{config_key}'", "attributes.status = 'RUNNING'"):
        if run.info.run_id != keep:
            client.set_tag(run.info.run_id, "killed_because", ORPHANED)
            client.set_terminated(run.info.run_id, "KILLED")
            log.warning("run %s of this config was left RUNNING by a process now gone: marked KILLED", run.info.run_id)


def base_scores(uri: str, base: str, corpus: Corpus) -> Scores:
    """The kept scores of the finished run `base` (one a job adopts, or a component a mixture mixes): what its own
    evaluation scored, with its best weights or, for a run stopped before its first validation, its last. A run made
    before runs kept scores is scored again from its checkpoint, and keeps them from then on (as `nplm-score --log`
    would)."""
    client = mlflow.MlflowClient(uri)
    scores = kept_scores(client, base)
    if scores is None:
        tags = client.get_run(base).data.tags
        if ARCHIVED_ID in tags:
            row = tags.get("row") or tags.get("family_label", "its row")
            raise NplmError(
                f"run {base} (row {row}), which this row mixes, was imported from {tags.get(ARCHIVED_FROM, 'an archive')}"
                f", which ships each text's sum of scores, not every token's: re-run row {row} here (its job with "
                "rerun=true), then this row"
            )
        if not has_weights(client, base):
            raise NplmError(
                f"run {base}, which this row mixes, kept no scores ({ARTIFACT}) and has no weights (Model or "
                f"{CHECKPOINT_BEFORE_MODELS}) to score it again: train its row again (rerun=true) so that the mixture "
                "finds the new run"
            )
        log.info("run %s kept no scores: scoring it again from its checkpoint", base)
        scores = RunScorer(uri, base, corpus=corpus).kept()
        log_scores(client, base, scores)
    return scores


@dataclass
class Recording:
    """What the ledger gives a family's `fit_run` (nplm_repro/family.py `Job`): the checkpoint it resumes from, and
    the kept scores of the runs its family needs (`bases`: a mixture's components)."""

    cfg: DictConfig
    corpus: Corpus
    bases: list[str]
    resume: Path | None

    def resume_from(self) -> Path | None:
        return self.resume

    def needed_scores(self) -> list[Scores]:
        return [base_scores(self.cfg.tracking.uri, base, self.corpus) for base in self.bases]


def failed_run(cfg: DictConfig, corpus: Corpus, error: BaseException) -> None:
    """A FAILED run of this job, with the tag `error`, for a job that fails before it could record one."""
    logger = open_run(cfg, corpus, config_key=config_key(cfg, corpus.fingerprint), error=redact(one_line(error)))
    logger.finalize("failed")


def run(cfg: DictConfig) -> tuple[str, dict[str, float]]:
    """One row: the model `cfg.model` names, on the corpus `cfg.data` names; returns its run id and metrics.

    A job whose config and data already have a FINISHED run (tag config_key) returns that run, unless
    `rerun=true`. The config's lock is held from the search to the end of the run (see `record`); with
    `trainer.precision=auto`, the locks of the config under each precision auto may resolve to, since a run of this
    job under either is this job's (`settle_precision`).
    """
    check_system_metrics(cfg.tracking)
    threads = cfg.threads or launcher_threads()
    if threads:
        torch.set_num_threads(threads)
    log.info("%s: torch threads %d", cfg.get("row") or "run", torch.get_num_threads())
    report_status(row=cfg.get("row") or "run", state="running")
    reach_store(cfg.tracking.uri)  # a store that cannot be reached or named stops the job before any work
    corpus = load_corpus(cfg.data)  # before the store is opened: a corpus found bad when read leaves no store
    check_sizes(cfg, corpus.sizes())  # the values against the data read: a text corpus's splits, the words
    open_store(cfg.tracking.uri, experiment=cfg.tracking.experiment)  # reached above
    uri, experiment = cfg.tracking.uri, cfg.tracking.experiment
    needs = family_of(cfg.model).needs(cfg)  # the runs its family makes the row from: a mixture's components
    try:
        needed = component_runs(cfg, corpus, needs) if needs else []
    except ComponentFailed as error:
        failed_run(cfg, corpus, error)
        raise
    bases = [r.info.run_id for r in needed]
    parts = [r.data.tags.get("config_key", r.info.run_id) for r in needed]  # part of the row's key
    # auto becomes a concrete precision before the config is keyed (the key says what computed): the one a run of
    # this config already resolved, else what this machine runs faster (`settle_precision`)
    own = trains(cfg)
    training = training_of(cfg.optim) if own else None
    variants = {}
    for precision in choices(cfg.trainer.precision, training, family(cfg.model)):
        variants[precision] = cfg.copy()
        variants[precision].trainer.precision = precision
    keys = {p: config_key(v, corpus.fingerprint, parts) for p, v in variants.items()}
    models = {p: model_key(v, corpus.fingerprint) for p, v in variants.items()} if own else {}  # the trained model's
    with contextlib.ExitStack() as held:  # every key auto may take, in one order: two jobs never wait on each other
        for model in sorted(set(models.values())):
            held.enter_context(model_lock(model))
        for key in sorted(set(keys.values())):
            held.enter_context(config_lock(key))
        cfg.trainer.precision, precision_tags = settle_precision(cfg, keys, models, training)
        key, model = keys[cfg.trainer.precision], models.get(cfg.trainer.precision)
        for other in set(keys.values()) - {key}:  # a run of this job under the precision it did not take
            end_orphans(uri, experiment, other)
        former = former_key(cfg, needed, corpus.fingerprint) if needed and not cfg.rerun else None
        found = None if cfg.rerun else find_finished(uri, experiment, config_key=key)
        found = found or (former and find_finished(uri, experiment, config_key=former))
        if found:
            return reuse(cfg, found)
        made = None if cfg.rerun or not model else find_finished(uri, experiment, model_key=model)
        ran = adopt(cfg, corpus, key, made) if made else record(cfg, corpus, key, precision_tags, bases)
    if cfg.get("study") and cfg.get("report"):  # shipped as soon as it ends: a lost machine loses no finished run
        keep_run(uri, experiment, cfg.study, corpus.fingerprint, Path(cfg.report), ran[0])
    return ran


def settle_precision(
    cfg: DictConfig, keys: dict[str, str], models: dict[str, str], training: Training | None
) -> tuple[str, dict[str, str]]:
    """The precision this job computes in, and its tags. With `auto`, a run of this job may already have resolved it
    (`keys`, `models`: each precision's config_key and model_key): its newest FINISHED run, else its resumable run, else
    the finished model it would adopt or mix, in that order; the job takes that run's precision, so that it skips,
    resumes or adopts that run instead of training anew in the other (the probe measures with the machine's load,
    and a fresh cache measures again). Only when no run has resolved it does the probe choose (`job_precision`)."""
    if len(keys) > 1 and not cfg.rerun:
        uri, experiment = cfg.tracking.uri, cfg.tracking.experiment
        looks = [
            ("config_key", keys, lambda runs: [r for r in runs if r.info.status == "FINISHED"]),
            ("config_key", keys, lambda runs: [r for r in runs[:1] if last_checkpoint(r)]),
            ("model_key", models, lambda runs: [r for r in runs if r.info.status == "FINISHED"]),
        ]
        for tag, by_precision, usable in looks:
            found = [
                (run, precision)
                for precision, key in by_precision.items()
                for run in usable(search(uri, experiment, f"tags.{tag} = '{key}'"))
            ]
            if found:
                run, precision = max(found, key=lambda pair: pair[0].info.start_time)
                log.info("precision=auto -> %s, as run %s of this job resolved it", precision, run.info.run_id)
                tags = {k: v for k, v in run.data.tags.items() if k.startswith("precision.")}
                return precision, tags if training is not None else {}
    return job_precision(cfg.trainer.precision, cfg.trainer.accelerator, training, family(cfg.model))


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


# What a trained run's tags say of how and where it computed: an adopted run is that computation, so it says the same.
COMPUTED_TAGS = ("git_commit", "mlflow.source.git.commit", "model_key", "checkpoint_dir", "python", "torch_threads")
COMPUTED_PREFIXES = ("version.", "cpu_", "precision.")


def adopt(cfg: DictConfig, corpus: Corpus, key: str, made: str) -> tuple[str, dict[str, float]]:
    """This job's model was already trained by a job of another study (same model_key): record it as a run of this
    study without training it again. The new run has this job's config and tags, the trained run's metrics (with
    their per-epoch histories), its kept scores and its tags of where it computed, and the tag `adopted_from`."""
    client = mlflow.MlflowClient(cfg.tracking.uri)
    source = client.get_run(made)
    if "adopted_from" in source.data.tags:  # adopted itself: adopt the run that trained it
        made = source.data.tags["adopted_from"]
        source = client.get_run(made)
    log.info("adopted: run %s (study %s) trained this model already", made, source.data.tags.get("study", "none"))
    scores = base_scores(cfg.tracking.uri, made, corpus)
    computed = {k: v for k, v in source.data.tags.items() if k in COMPUTED_TAGS or k.startswith(COMPUTED_PREFIXES)}
    logger = open_run(cfg, corpus, config_key=key, adopted_from=made)
    try:
        client.log_batch(logger.run_id, tags=[RunTag(name, value) for name, value in computed.items()])
        # its results, not MLflow's system metrics: those of the training are on the trained run
        names = [name for name in source.data.metrics if not name.startswith("system/")]
        history = [m for name in names for m in client.get_metric_history(made, name)]
        for start in range(0, len(history), 1000):  # MLflow takes at most 1000 metrics per batch
            client.log_batch(logger.run_id, metrics=history[start : start + 1000])
        log_scores(client, logger.run_id, scores)
        client.log_text(logger.run_id, redact(OmegaConf.to_yaml(cfg, resolve=True)), "config.yaml")
        client.log_text(logger.run_id, corpus.summary() + "\n", "data.txt")
        logger.close()
    except BaseException:
        logger.finalize("failed")
        raise
    return logger.run_id, {k: v for k, v in source.data.metrics.items() if k in names}


def own_dir(path: Path) -> Path:
    """A new, empty checkpoint directory for one run: `path`, or `path-2`, `path-3`, ... if taken.

    Hydra names output directories by the second, so two commands started in the same second in the same
    directory share one; their runs would then share `checkpoints/`, and a resume could load the other's
    last.ckpt. `mkdir` is atomic: of two processes, only one gets each name.
    """
    base = path.resolve()
    base.parent.mkdir(parents=True, exist_ok=True)
    for candidate in itertools.chain([base], (base.with_name(f"{base.name}-{i}") for i in itertools.count(2))):
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        if candidate != base:
            log.info("checkpoints: %s is another run's, this run's are in %s", base, candidate)
        return candidate


def record(
    cfg: DictConfig, corpus: Corpus, key: str, tags: dict[str, str], bases: list[str] = ()
) -> tuple[str, dict[str, float]]:
    """Fit the model as its family fits a run (`fit_run`: train, count or mix) and record it as one MLflow run
    (tagged with its config_key and `tags`), from the runs `bases` its family needs (a mixture's components:
    `component_runs`, found before its key, which holds their config_keys).

    The caller holds the config's lock, so a run of this config still RUNNING has lost its process (`kill -9`,
    out of memory). A trained model whose last run of this config was killed (KILLED, or such a RUNNING one) continues
    from that run's last checkpoint, in that run, unless `rerun=true`; other RUNNING runs of the config are
    marked KILLED, or the report would show them running forever. A failed run gets the tag `error` and
    error.txt.
    """
    L.seed_everything(cfg.seed, workers=True)
    family, resume, tags = family_of(cfg.model), None, dict(tags)
    if bases:
        tags["base_run_id"] = ",".join(bases)
    if trains(cfg):
        tags["model_key"] = model_key(cfg, corpus.fingerprint)
        if cfg.callbacks.get("model_checkpoint"):
            resume = None if cfg.rerun else find_resumable(cfg.tracking.uri, cfg.tracking.experiment, key)
            checkpoints = resume[1].parent if resume else own_dir(Path(cfg.callbacks.model_checkpoint.dirpath))
            cfg.callbacks.model_checkpoint.dirpath = tags["checkpoint_dir"] = str(checkpoints)
            if resume:
                log.info("resuming run %s from %s", *resume)
    end_orphans(cfg.tracking.uri, cfg.tracking.experiment, key, keep=resume[0] if resume else None)
    logger = open_run(cfg, corpus, resume=resume[0] if resume else None, config_key=key, **tags)
    try:
        job = Recording(cfg, corpus, list(bases), resume[1] if resume else None)
        metrics, scores = family.fit_run(cfg, corpus, logger, job)
        check_perplexities(metrics)
        log_scores(logger.experiment, logger.run_id, scores)
        best = (
            best_checkpoint(cfg.callbacks) if "model_key" in tags else None
        )  # a trained model's weights, as its Model
        if best:
            module = get_class(cfg.model._target_)
            log_model(logger.experiment, logger.run_id, best, corpus, cfg.data, cfg.model._target_)
            weights = module.load_from_checkpoint(best, map_location="cpu")
            log_features(
                logger.experiment,
                logger.run_id,
                weights,
                corpus,
                logger.experiment.get_run(logger.run_id).info.run_name,
            )
        logger.experiment.log_text(logger.run_id, redact(OmegaConf.to_yaml(cfg, resolve=True)), "config.yaml")
        logger.experiment.log_text(logger.run_id, corpus.summary() + "\n", "data.txt")
        logger.close()
    except BaseException as error:
        if not interrupted(error):
            logger.experiment.set_tag(logger.run_id, "error", redact(one_line(error)))
            logger.experiment.log_text(logger.run_id, redact(traceback.format_exc()), "error.txt")
        logger.finalize("failed")
        raise
    log.info("%s", summary(cfg.get("row") or "run", logger.run_id, metrics))
    return logger.run_id, metrics


def check_perplexities(metrics: dict[str, float]) -> None:
    """A run whose perplexity of a split is not a finite number has diverged: it fails, so that no report, claim or
    registry takes it (MLflow's SQL store would keep inf as 1.8e308, a number that looks measured)."""
    bad = {k: v for k, v in metrics.items() if k.endswith("_ppl") and not math.isfinite(v)}
    if bad:
        found = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise NplmError(f"{found}: {DIVERGED}")


def summary(name: str, run_id: str, metrics: dict[str, float]) -> str:
    """What a run measured, once: split, tokens and perplexity (Lightning's own table repeats them per split), and
    what the training cost."""
    lines = [f"{name}, run {run_id}: perplexity of every token, exact softmax", "  split      tokens  perplexity"]
    for split in SPLITS:
        if f"{split}_ppl" in metrics:
            tokens = metrics.get(f"{split}_tokens")
            lines.append(f"  {split:<5} {f'{tokens:,.0f}' if tokens else '':>11} {metrics[f'{split}_ppl']:>11,.2f}")
    costs = [(k, metrics[k]) for k in ("epochs", "fit_seconds", "score_seconds") if k in metrics]
    if costs:
        lines.append("  " + ", ".join(f"{k.replace('_', ' ')} {v:,.0f}" for k, v in costs))
    return "\n".join(lines)


def launcher_threads() -> int | None:
    """The launcher's `cpus_per_task` (submitit: SLURM or local), for `threads: null`; None for other launchers."""
    if not HydraConfig.initialized():
        return None
    return HydraConfig.get().launcher.get("cpus_per_task")
