"""Hyperparameter search (`hparams_search=<name>`): Optuna's ask-and-tell over Hydra's launcher, its trials pruned
on their validation perplexity epoch by epoch, each trial one tracked run.

`Search` is the sweeper (Hydra finds it as hydra_plugins.nplm_repro_search.OptunaSearch, conf/hydra/sweeper/
optuna.yaml): it keeps an Optuna study in `storage`, asks `sampler` for a trial, launches its job with the
trial's values and the callback `Pruning` of that trial as overrides, and tells the study what the job returned
(its exact validation perplexity, `nplm-train`'s return value). `n_jobs` trials run at once, each started as soon
as a slot is free, so a pruned trial frees its core for the next one. No new trial starts once the ended and
running trials have spent `cpu_hours` (each trial's training seconds times its torch threads), or `n_trials` have
ended where a cap is set (the family searches set none: the budget alone ends them). Each trial records who proposed
its values (`PROPOSED`): the sampler, or the random draws of its start (TPE's first `n_startup_trials`).

Then `retrain` (`{top: 3, seeds: [2, 3]}`): the `top` trials by search value train again from scratch on each seed,
without pruning or budget, to convergence: one value per trial is one draw, and the budget may have cut a rival
still improving. The search chooses the trial of the lowest mean retrained validation perplexity (`RETRAINED` keeps
each value on the study); the report shows both (reporting/search.py).

`Pruning` is the job's side (`callbacks.pruning`, in the job's config and so in its run's key): after every
validation it reports the epoch's perplexity to the trial and asks `pruner`; a trial to prune stops as early
stopping stops a run, so it is scored and tracked like any run, with the metric `pruned_epoch`. Ctrl-C or SIGTERM
stops the search at once: its running trials' runs end KILLED. The search resumes: the same command after a stop
launches the trials it left running again, with the same numbers, so the ledger resumes their runs from their
last epoch, then asks for new ones until the budget is spent. A study is resumed only by a search of the same corpus,
store and fixed config, which it keeps as its binding (search_checks.py checks it before the sweep's store is made).
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from typing import Any

import lightning as L
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, Timer
from lightning.pytorch.loggers import MLFlowLogger
from omegaconf import DictConfig, OmegaConf

from nplm_repro.errors import NplmError
from nplm_repro.sweeping.console import job_error
from nplm_repro.sweeping.search_checks import BINDING, binding, import_optuna

log = logging.getLogger(__name__)
MONITOR = "valid_ppl_epoch"
STARTS = 0.9  # of the CPU hours: no trial starts after them, as one would be cut by the budget after an epoch or two
PROPOSED = "proposed_by"  # a trial's user attribute and its run's tag `search_proposed_by`: `random` or the sampler
SPACE = "search_space"  # its run's tag: the trial's distributions (`described`), for the report's edges
RETRAINED = "retrained"  # the study's user attribute: {trial number: {seed: validation perplexity}}


def space(params: dict[str, str], arguments: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The distributions of the swept keys (`params`, then the command line's sweeps: `interval(a, b)`,
    `tag(log, interval(a, b))`, `choice(a, b)`, `range(a, b)`) and the command line's plain overrides."""
    optuna = import_optuna()
    overrides = [f"{k}={v}" for k, v in params.items()] + list(arguments)
    found: dict[str, Any] = {}
    fixed: list[str] = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if not override.is_sweep_override():
            fixed.append(override.input_line)
            continue
        found[override.get_key_element()] = _distribution(override, optuna)
    return found, fixed


def _distribution(override: Override, optuna: Any) -> Any:
    if override.is_interval_sweep():
        sweep = override.value()
        log_scale = "log" in sweep.tags
        if isinstance(sweep.start, int) and isinstance(sweep.end, int):
            return optuna.distributions.IntDistribution(sweep.start, sweep.end, log=log_scale)
        return optuna.distributions.FloatDistribution(sweep.start, sweep.end, log=log_scale)
    return optuna.distributions.CategoricalDistribution(list(override.sweep_string_iterator()))


def written(value: Any) -> str:
    """`value` (a dict, list, string, number, bool or None) in Hydra's override grammar."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{written(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(written(v) for v in value) + "]"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)


def described(distributions: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A trial's distributions as plain JSON the report reads without Optuna: `{low, high, log}` for a range,
    `{choices}` for a choice."""
    found: dict[str, dict[str, Any]] = {}
    for key, distribution in distributions.items():
        if hasattr(distribution, "choices"):
            found[key] = {"choices": list(distribution.choices)}
        else:
            found[key] = {"low": distribution.low, "high": distribution.high, "log": bool(distribution.log)}
    return found


def proposer(sampler: dict[str, Any], ended: int) -> str:
    """Who proposes the next trial's values, `ended` trials having completed or been pruned: `random` during the
    sampler's start (Optuna's TPE draws its first `n_startup_trials`, default 10, at random; RandomSampler always),
    else the sampler's class name."""
    name = str(sampler.get("_target_", "")).rsplit(".", 1)[-1]
    if name == "RandomSampler" or ended < int(sampler.get("n_startup_trials", 10 if name == "TPESampler" else 0)):
        return "random"
    return name


def cpu_seconds(trial: Any) -> float:
    """What a trial's run has spent training: its seconds in fit times its torch threads (0 before its first epoch)."""
    return float(trial.user_attrs.get("cpu_seconds", 0.0))


class Search(Sweeper):
    def __init__(
        self,
        study_name: str,
        storage: str,
        direction: str,
        n_trials: int,
        n_jobs: int,
        sampler: Any,
        pruner: Any,
        params: DictConfig | None = None,
        cpu_hours: float | None = None,
        stop_seconds: float = 30.0,
        retrain: DictConfig | None = None,
        adopt: bool = False,
    ) -> None:
        """`n_trials` None: no cap, the budget `cpu_hours` alone ends the search. `retrain`: `{top, seeds}` or None.
        `adopt`: a study of this name kept with no binding is this search's (search_checks.py checks it)."""
        self.study_name, self.storage, self.direction = study_name, storage, direction
        self.n_trials, self.n_jobs, self.cpu_hours = n_trials, n_jobs, cpu_hours
        self.stop_seconds = stop_seconds
        self.sampler, self.pruner = sampler, pruner  # configs (the sweeper's config says _recursive_: false)
        self.retrain = OmegaConf.to_container(retrain) if retrain else None
        self.params = OmegaConf.to_container(params or {}, resolve=False)
        self.launcher: Any = None
        self._lock = threading.Lock()
        self._next_job = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> None:
        optuna = import_optuna()
        distributions, fixed = space(self.params, arguments)
        self._storage = optuna.storages.RDBStorage(self.storage)
        study = optuna.create_study(
            study_name=self.study_name,
            storage=self._storage,
            sampler=instantiate(self.sampler),
            pruner=instantiate(self.pruner),
            direction=self.direction,
            load_if_exists=True,
        )
        if study.user_attrs.get(BINDING) is None:  # made now, or before bindings were kept and adopted (search_checks)
            study.set_user_attr(BINDING, binding(self.config))
        self._next_job = len(study.trials)
        left = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))  # their numbers, values
        if left:
            log.info(
                "search %s: %d trials left running by a stopped search, launched again", self.study_name, len(left)
            )
        failed: list[str] = []
        with ThreadPoolExecutor(self.n_jobs) as pool:
            running: dict[Future[JobReturn], Any] = {}
            try:
                while True:
                    while len(running) < self.n_jobs and (left or self._more(study, len(running))):
                        trial = left.pop(0) if left else self._ask(study, distributions)
                        running[pool.submit(self._launch, trial, fixed)] = trial
                    if not running:
                        break
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    if any(future.exception() for future in done):
                        raise _first_error([*done, *wait(running).done])
                    for future in done:
                        trial = running.pop(future)
                        failed += self._tell(study, trial, future.result())
            except KeyboardInterrupt:
                self._stop(running)
                raise
        self._summary(study, failed)
        if self.retrain:
            self._retrain(study, fixed)

    def _ask(self, study: Any, distributions: dict[str, Any]) -> Any:
        """A new trial, with who proposed its values (`proposer`, counted as the sampler counts: before it draws)."""
        optuna = import_optuna()
        ended = len(
            study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
        )
        by = proposer(
            OmegaConf.to_container(self.sampler) if isinstance(self.sampler, DictConfig) else self.sampler, ended
        )
        trial = study.ask(distributions)
        trial.set_user_attr(PROPOSED, by)
        return trial

    def _retrain(self, study: Any, fixed: list[str]) -> None:
        """Train the `retrain.top` complete trials of lowest value again on each of `retrain.seeds`, from scratch,
        without pruning or budget (each run resumed or skipped by the ledger as any job), `n_jobs` at a time; keep
        each validation perplexity on the study (`RETRAINED`) and log the trial of the lowest mean. A failed retrain
        fails the search once every other has run."""
        assert self.retrain is not None
        top = sorted(
            (t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"), key=lambda t: t.value
        )[: int(self.retrain["top"])]
        seeds = [int(s) for s in self.retrain["seeds"]]
        kept = [o for o in fixed if o.split("=", 1)[0].lstrip("+~") != "seed"]
        retrained: dict[str, dict[str, float]] = dict(study.user_attrs.get(RETRAINED, {}))
        failed: list[str] = []
        with ThreadPoolExecutor(self.n_jobs) as pool:
            running: dict[Future[JobReturn], tuple[Any, int]] = {}
            try:
                for trial in top:
                    for seed in seeds:
                        overrides = [*kept, *self._values(trial), f"seed={seed}"]
                        running[pool.submit(self._job, overrides)] = (trial, seed)
                for future in as_completed(running):
                    trial, seed = running[future]
                    result = future.result()
                    if result.status != JobStatus.COMPLETED:
                        failed.append(f"trial {trial.number} seed {seed}: {job_error(result)}")
                        continue
                    retrained.setdefault(str(trial.number), {})[str(seed)] = float(result.return_value)
                    study.set_user_attr(RETRAINED, retrained)
            except KeyboardInterrupt:
                self._stop({f: t for f, (t, _) in running.items() if not f.done()})
                raise
        means = {n: sum(v.values()) / len(v) for n, v in retrained.items() if len(v) == len(seeds)}
        if means:
            chosen = min(means, key=means.__getitem__)
            log.info(
                "search %s: retrained trials %s on seeds %s: mean valid %s; chosen trial %s",
                self.study_name,
                ", ".join(str(t.number) for t in top),
                ", ".join(map(str, seeds)),
                ", ".join(f"{means[str(t.number)]:.1f}" for t in top if str(t.number) in means),
                chosen,
            )
        if failed:
            raise NplmError(f"search {self.study_name}: {len(failed)} retrain(s) failed ({failed[0]})")

    def _stop(self, running: dict[Future[JobReturn], Any]) -> None:
        """Ctrl-C or SIGTERM reached the search, which waits on its launches while the launcher's workers train: pass
        it on to the workers, whose jobs end their runs KILLED (resumable), so that the launches return and the
        search stops now, not when its trials end. Their trials stay RUNNING: the same command launches them again
        (`sweep`), and each run resumes from its last epoch.

        A worker whose job has not ended `stop_seconds` later (stuck ending its run) is killed, so that a stop never
        waits on it: its run, left RUNNING with its process gone, is marked KILLED at the sweep's end
        (`MlflowSweep.end_killed_jobs`) and resumes all the same."""
        if not running:
            return
        numbers = ", ".join(str(trial.number) for trial in running.values())
        log.warning("search %s stopped: trials %s end KILLED, resumed by the same command", self.study_name, numbers)
        signal_workers(signal.SIGTERM)
        if wait(running, timeout=self.stop_seconds).not_done:
            log.warning(
                "search %s: trials %s had not ended %.0f s after the stop: their workers are killed",
                self.study_name,
                ", ".join(str(trial.number) for future, trial in running.items() if not future.done()),
                self.stop_seconds,
            )
            signal_workers(signal.SIGKILL)
            wait(running)

    def _more(self, study: Any, running: int) -> bool:
        """Whether a new trial may start: fewer than n_trials (if a cap is set) ended or running, and less than
        STARTS of the CPU hours spent."""
        trials = study.get_trials(deepcopy=False)
        ended = sum(t.state.is_finished() for t in trials)
        capped = self.n_trials is not None and ended + running >= self.n_trials
        return not capped and (self.cpu_hours is None or spent(trials) < STARTS * self.cpu_hours)

    @staticmethod
    def _values(trial: Any) -> list[str]:
        """A trial's values as overrides."""
        return [f"{k}={Transformer.encode(v) if isinstance(v, str) else v}" for k, v in trial.params.items()]

    def _launch(self, trial: Any, fixed: list[str]) -> JobReturn:
        pruning = {"_target_": f"{Pruning.__module__}.Pruning", "storage": self.storage, "study": self.study_name}
        pruning |= {"trial": trial.number, "pruner": OmegaConf.to_container(self.pruner), "cpu_hours": self.cpu_hours}
        return self._job([*fixed, *self._values(trial), f"+callbacks.pruning={written(pruning)}"])

    def _job(self, overrides: list[str]) -> JobReturn:
        """One job of the sweep, numbered after every job before it."""
        with self._lock:
            number, self._next_job = self._next_job, self._next_job + 1
        (result,) = self.launcher.launch([overrides], initial_job_idx=number)
        return result

    def _tell(self, study: Any, trial: Any, result: JobReturn) -> list[str]:
        """Tell the study how `trial` (a Trial, or a FrozenTrial left running by a stopped search) ended: FAIL, PRUNED
        where its job said so (`pruned_epoch`), else its value."""
        optuna = import_optuna()
        error = job_error(result)
        if error is not None:
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            why = f"trial {trial.number}: {type(error).__name__}: {error}"
            log.error("search %s: %s", self.study_name, why)
            return [why]
        (frozen,) = [t for t in study.get_trials(deepcopy=False) if t.number == trial.number]  # as the job left it
        if "pruned_epoch" in frozen.user_attrs:
            study.tell(trial.number, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial.number, float(result.return_value))
        return []

    def _summary(self, study: Any, failed: list[str]) -> None:
        trials = study.get_trials(deepcopy=False)
        counts = {s: sum(t.state.name == s for t in trials) for s in ("COMPLETE", "PRUNED", "FAIL")}
        hours = spent(trials)
        best = f", best value {study.best_value:.1f} (trial {study.best_trial.number})" if counts["COMPLETE"] else ""
        log.info(
            "search %s: %d complete, %d pruned, %d failed, %.2f CPU hours%s",
            self.study_name,
            counts["COMPLETE"],
            counts["PRUNED"],
            counts["FAIL"],
            hours,
            best,
        )
        if failed and not counts["COMPLETE"]:
            raise NplmError(f"search {self.study_name}: every trial failed ({failed[0]})")


def _first_error(futures: Sequence[Future[JobReturn]]) -> BaseException:
    """The error a launch raised (a job's config that does not compose, a worker lost), once every launch has
    returned: joblib then shuts its workers down, and the other launches' own errors only say so."""
    errors = [e for e in (f.exception() for f in futures) if e is not None]
    return next((e for e in errors if "has been shutdown" not in str(e)), errors[0])


class Pruning(Callback):
    """A search's trial, seen from its run: each validation's perplexity reported as the trial's value at that
    epoch, the run stopped where the pruner says, its CPU seconds kept on the trial for the search's budget."""

    def __init__(self, storage: str, study: str, trial: int, pruner: Any, cpu_hours: float | None = None) -> None:
        """`pruner`: the search's (an Optuna pruner, instantiated by Hydra): a study loaded without one prunes by
        Optuna's default, not the search's. `cpu_hours`: the search's budget, which stops this trial once spent."""
        self.storage, self.study_name, self.number, self.pruner = storage, study, trial, pruner
        self.cpu_hours = cpu_hours
        self._trial: Any = None
        self._study: Any = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        optuna = import_optuna()
        storage = optuna.storages.RDBStorage(self.storage)
        self._study = optuna.load_study(study_name=self.study_name, storage=storage, pruner=self.pruner)
        trial_id = storage.get_trial_id_from_study_id_trial_number(
            storage.get_study_id_from_name(self.study_name), self.number
        )
        self._trial = optuna.trial.Trial(self._study, trial_id)  # the search's trial, reported to from this job
        frozen = next(t for t in self._study.get_trials(deepcopy=False) if t.number == self.number)
        logger = trainer.logger
        if isinstance(logger, MLFlowLogger):  # what the report reads of the search: its edges, who proposed
            tags = {
                f"search_{PROPOSED}": frozen.user_attrs.get(PROPOSED, ""),
                SPACE: json.dumps(described(frozen.distributions)),
            }
            for tag, value in tags.items():
                logger.experiment.set_tag(logger.run_id, tag, value)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or MONITOR not in trainer.callback_metrics:
            return
        epoch = trainer.current_epoch + 1
        self._trial.report(float(trainer.callback_metrics[MONITOR]), epoch)
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
        if timer is not None:
            seconds = timer.time_elapsed("train") * torch.get_num_threads()
            self._trial.set_user_attr("cpu_seconds", seconds)
        if self._trial.should_prune():
            self._stop(trainer, "pruned_epoch", epoch)
        elif self.cpu_hours is not None and spent(self._study.get_trials(deepcopy=False)) >= self.cpu_hours:
            self._stop(trainer, "budget_epoch", epoch)

    def _stop(self, trainer: L.Trainer, why: str, epoch: int) -> None:
        """Stop the run after this epoch, as early stopping does, saying why on the trial and the run."""
        self._trial.set_user_attr(why, epoch)
        if trainer.logger is not None:
            trainer.logger.log_metrics({why: float(epoch)}, step=trainer.global_step)
        log.info("trial %d stopped after epoch %d (%s)", self.number, epoch, why)
        trainer.should_stop = True


def workers() -> list[int]:
    """The launcher's workers: the processes this one started through multiprocessing (joblib's loky executor starts
    its workers so; the basic launcher starts none)."""
    return [process.pid for process in multiprocessing.active_children() if process.pid is not None]


def signal_workers(how: signal.Signals) -> None:
    """Send `how` to every worker of the launcher (`workers`)."""
    for pid in workers():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, how)


def spent(trials: Sequence[Any]) -> float:
    """The CPU hours `trials` (Optuna's trials) have spent."""
    return sum(cpu_seconds(t) for t in trials) / 3600.0
