"""A sweep's jobs in the order their rows need: a mixed row (`model.components`) after the rows it mixes.

Hydra's basic sweeper launches its jobs as the command line's product gives them, so `-m
experiment=lstm_trigram,del_int,lstm` started the mixture first, which found no run of its rows and failed; under the
parallel launcher it started beside them and looked before they had made their runs. `RowsFirst` (the default
sweeper, conf/hydra/sweeper/rows_first.yaml; Hydra finds it as hydra_plugins.nplm_repro_search.RowsFirst) is the
basic sweeper whose batches are levels (`levels`): first every job whose row mixes no row of the sweep, then the
mixtures over those, and so on, each in the order written. The launcher runs a batch to its end before the next
starts, so under the parallel launcher too a mixture starts once its rows' jobs of the same sweep have ended.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins import basic_sweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.tracking.study_rows import less_seed

Rows = tuple[str | None, tuple[str, ...]]  # a job's row, and the rows it mixes


def levels(jobs: Sequence[list[str]], rows_of: Callable[[list[str]], Rows]) -> list[list[list[str]]]:
    """`jobs` in batches: a job in the batch after the last that holds a job of a row it mixes (a row the sweep does
    not run is its store's business: components.py finds its run or says to run it first), each batch in the order
    written. The sweep's pre-check has refused rows that mix one another in a cycle (sweep.py `check_components`)."""
    rows = [rows_of(job) for job in jobs]
    level = [0] * len(jobs)
    for _ in jobs:  # a longest chain of mixtures has at most as many links as there are jobs
        of_row: dict[str, int] = {}
        for (row, _mixed), at in zip(rows, level, strict=True):
            if row is not None:
                of_row[row] = max(of_row.get(row, 0), at)
        level = [max((of_row[c] + 1 for c in mixed if c in of_row), default=0) for _row, mixed in rows]
    return [[job for job, at in zip(jobs, level, strict=True) if at == n] for n in sorted(set(level))]


class RowsFirst(Sweeper):
    """Hydra's basic sweeper, its jobs in `levels`, each level split as `max_batch_size` says. It holds one rather
    than being one: loading Hydra's plugins runs the basic sweeper's module again, and a subclass of the class it
    made before would fail its `super(BasicSweeper, self)`."""

    def __init__(self, max_batch_size: int | None, params: dict[str, str] | None = None) -> None:
        self.basic = basic_sweeper.BasicSweeper(max_batch_size, params)
        self.basic.split_arguments = self.split_arguments  # what its `sweep` calls

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.basic.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        """The basic sweeper's loop, with every batch launched whether a job of an earlier one failed or not: a row's
        failure stops no other row's mixture (a mixture of the failed row fails on its own, naming it), and the
        first failure is raised once every batch has run, as the launcher does within one batch."""
        basic = self.basic
        params = [f"{key}={value}" for key, value in (basic.params or {}).items()] + list(arguments)
        parser = OverridesParser.create(config_loader=basic.hydra_context.config_loader)
        basic.overrides = self.split_arguments(parser.parse_overrides(params), basic.max_batch_size)
        folder = Path(basic.config.hydra.sweep.dir)
        folder.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(basic.config, folder / "multirun.yaml")
        returns, launched = [], 0
        while not basic.is_done():
            batch = basic.get_job_batch()
            basic.validate_batch_is_legal(batch)
            returns.append(basic.launcher.launch(batch, initial_job_idx=launched))
            launched += len(batch)
        for result in (r for results in returns for r in results):
            _ = result.return_value  # a failed job's error, raised now that every batch has run
        return returns

    def split_arguments(self, overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:
        basic = basic_sweeper.BasicSweeper
        every = [job for batch in basic.split_arguments(overrides, None) for job in batch]
        known: dict[tuple[str, ...], Rows] = {}

        def rows_of(job: list[str]) -> Rows:
            kind = less_seed(job)
            if kind not in known:
                try:
                    loader = self.basic.hydra_context.config_loader
                    composed = loader.load_sweep_config(self.basic.config, list(job))
                    known[kind] = (composed.get("row"), tuple(OmegaConf.select(composed, "model.components") or []))
                except (HydraException, OmegaConfBaseException):
                    known[kind] = (None, ())  # refused before (sweep.py `compose_jobs`), or fails as its own job
            return known[kind]

        batches = levels(every, rows_of)
        if max_batch_size is None:
            return batches
        return [list(chunk) for b in batches for chunk in basic.split_overrides_to_chunks(b, max_batch_size)]
