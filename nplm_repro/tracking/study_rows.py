"""The rows a study's jobs give, named as its report names them, known before any job runs: what its claims may name
(studies.py `check_claimed_rows`). A sweep checks its claims before it starts (sweeping/sweep.py), `nplm-report
--study` before it reads the store, so a claim on a row the study never runs (`MLP11`, `Del Int.`) is one line, not
a claim "not measured" in every report.

The jobs are the study file's own: its `hydra.sweeper.params`, expanded as Hydra's basic sweeper does (`expand`),
each job composed with the study alone; a command line that narrows a sweep (`experiment=kn3`) or moves a knob leaves
the claims the file's. A job's row is named as reporting/tables.py names it: a paper family's configuration after
the paper row whose columns (n, c, h, m, direct, mix) it has, else by the family's name in the tables (MLP, Del.
Int.); another family's by its row tag (LSTM + MLP9). The label of an untagged row of another family is its class's
own, and this module imports no family (nplm-report stays torch-free): a study with such a job is not checked.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from collections.abc import Callable, Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from hydra import compose, initialize_config_module
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.errors import NplmError, one_line
from nplm_repro.paper import (
    COLUMNS,
    FAMILY_NAMES,
    PAPER_MODEL,
    PAPER_TABLES,
    PAPER_TRIGRAM,
    ROW_NAMES,
    own_name,
    paper_table,
    row_key,
)
from nplm_repro.studies import CLAIM_KINDS, row_name
from nplm_repro.tracking.confounds import allowed, confounded, differences, precision_ran
from nplm_repro.tracking.keys import IMPLIED, family, is_bookkeeping, trains, without_unused
from nplm_repro.tracking.runs import MIX

log = logging.getLogger(__name__)

BASIC_SWEEPER = f"{BasicSweeper.__module__}.{BasicSweeper.__name__}"
# The sweepers whose jobs are known before any runs: Hydra's basic one, and the default that orders its jobs
# (`hydra/sweeper=basic`: sweeping/sweep_order.py); Optuna's draws its trials as it goes
KNOWN_JOBS = frozenset({BASIC_SWEEPER, "hydra_plugins.nplm_repro_search.RowsFirst"})
MODULE = "nplm_repro.conf"  # the package's configs, conf/ (its study/ is sweeps/)
COPY = "nplm_report_study"  # the name a study file outside the package is composed under: no installed study's


def expand(arguments: list[str], loader: ConfigLoader | None = None) -> list[list[str]]:
    """The overrides of every job, as Hydra's basic sweeper makes them of `arguments` (a sweep's params, then its
    command line): each sweep expanded, their product in order. `loader`, Hydra's config loader, parses choices of a
    config group (`glob(*)`) as the sweeper does."""
    overrides = OverridesParser.create(loader).parse_overrides(arguments)
    try:
        return BasicSweeper.split_arguments(overrides, None)[0]
    except HydraException as error:  # a search's sweep (interval, tag) given to the basic sweeper
        raise NplmError(one_line(error)) from None


def less_seed(job: Iterable[str]) -> tuple[str, ...]:
    """A job's overrides less its seed: jobs that differ only in their seed compose, check and name their row alike."""
    return tuple(o for o in job if o.split("=", 1)[0].lstrip("+~") != "seed")


@functools.cache
def _paper_rows() -> dict[tuple[str, ...], frozenset[str]]:
    """The paper's row names (both tables) by family and columns (`row_key`)."""
    rows: dict[tuple[str, ...], set[str]] = {}
    for table in PAPER_TABLES:
        for _, row in paper_table(table).iterrows():
            rows.setdefault(row_key(row["family"], row), set()).add(row["row"])
    return {key: frozenset(names) for key, names in rows.items()}


def columns(model: DictConfig) -> dict[str, str]:
    """A configuration's values of the paper's columns as its run's row has them (tracking/runs.py `tidy`): '' for a
    key its family has not, direct yes or no, mix no or yes for none and fixed."""
    values = {column: model.get(column) for column in COLUMNS}
    found = {column: "" if value is None else str(value) for column, value in values.items()}
    found["direct"] = {True: "yes", False: "no"}.get(values["direct"], "")
    found["mix"] = MIX.get(found["mix"] or "none", found["mix"])
    return found


@functools.cache
def _paper_mlps() -> dict[str, Any]:
    """The paper's MLP rows (both tables) by name."""
    return {
        r["row"]: r for table in PAPER_TABLES for _, r in paper_table(table).iterrows() if r["family"] == PAPER_MODEL
    }


def mixed_mlp(model: DictConfig) -> dict[str, str] | None:
    """The paper's columns of a mixture of a paper MLP row and Del. Int. (MLP6: MLP5's, mix yes), which a report
    shows as that MLP mixed (tracking/runs.py `as_mixed_mlps`); None for any other mixture."""
    components = list(model.get("components") or [])
    mlps = _paper_mlps()
    if len(components) != 2 or components[1] != FAMILY_NAMES[PAPER_TRIGRAM] or components[0] not in mlps:
        return None
    mode = str(model.get("mode"))
    return {column: str(mlps[components[0]][column]) for column in COLUMNS} | {"mix": MIX.get(mode, mode)}


def row_names(job: DictConfig) -> frozenset[str] | None:
    """The names a composed job's row (Hydra's config included: its choice of `model` is its family) takes in a
    report; None when only its family's class knows it (an untagged row of a family the paper has not)."""
    family, row = job.hydra.runtime.choices.get("model"), job.get("row")
    values = columns(job.model) if family in FAMILY_NAMES else mixed_mlp(job.model)
    if values is not None:
        family = family if family in FAMILY_NAMES else PAPER_MODEL
        own = own_name(row) if row else None
        return _paper_rows().get(row_key(family, values)) or frozenset({own or FAMILY_NAMES[family]})
    return frozenset({ROW_NAMES.get(row, row)}) if row else None


def composed(
    params: dict[str, Any], compose_job: Callable[[list[str]], DictConfig], where: str
) -> list[DictConfig] | None:
    """The jobs of `params` (a study's `hydra.sweeper.params`), less their seeds, each composed by `compose_job`; None
    when they do not compose here (a warning: the claims are then not checked, and what does not compose is said
    where it runs)."""
    jobs = dict.fromkeys(less_seed(job) for job in expand([f"{k}={v}" for k, v in params.items()]))
    try:
        return [compose_job(list(job)) for job in jobs]
    except (HydraException, OmegaConfBaseException, yaml.YAMLError, NplmError) as error:
        why = one_line(error)
        log.warning("%s: the rows its claims name are not checked: its jobs do not compose (%s)", where, why)
        return None


def declared_rows(jobs: list[DictConfig] | None) -> set[str] | None:
    """The names of the rows the composed `jobs` give; None when one is not known (`row_names`) or the jobs did not
    compose (`composed`)."""
    names: set[str] = set()
    for job in jobs or []:
        found = row_names(job)
        if found is None:
            return None
        names |= found
    return None if jobs is None else names


def job_config(job: DictConfig) -> dict[str, str]:
    """A composed job's configuration as its run's params will hold it (tracking/runs.py `_config`): the dotted keys
    of its data, model, optimiser, trainer and early stopping, less bookkeeping and the knobs it will not use, and
    `trainer.precision` the one it will compute in where that is known before its run (`auto` on a family that
    trains in float32 is 32-true, as its run records it)."""
    tree = {g: OmegaConf.to_container(job[g], resolve=True) for g in ("data", "model", "optim", "trainer")}
    tree["callbacks"] = {"early_stopping": OmegaConf.to_container(job.callbacks.early_stopping, resolve=True)}
    tree["model"].pop("_target_", None)
    flat = pd.json_normalize(without_unused(tree), sep=".").iloc[0].items()  # as records.py `flat_params` flattens
    flat = {key: str(value) for key, value in flat if not is_bookkeeping(key, value)}
    from nplm_repro.models.outputs import training_of  # loads torch: only a sweep's check reads this, no report
    from nplm_repro.models.precision import choices

    known = choices(str(job.trainer.precision), training_of(job.optim) if trains(job) else None, family(job.model))
    if len(known) == 1:
        flat["trainer.precision"] = known[0]
    return IMPLIED | flat


def check_controlled(spec: dict[str, Any], jobs: list[DictConfig], where: str) -> None:
    """NplmError on a claim whose two rows' jobs already differ, as composed, in a key the claim does not name
    (tracking/confounds.py): its report could only call it confounded. A row is matched by its name and the `key=value`
    words of its label (which let no key differ: the claim's `varies` does); a side no job matches (a precision
    `auto` will choose) is checked by the report instead."""
    configs = [(row_names(job) or frozenset(), job_config(job), job) for job in jobs]

    def matching(label: str) -> tuple[dict[str, str], DictConfig] | None:
        words = dict(word.split("=", 1) for word in label.split() if "=" in word)
        for names, config, job in configs:
            values = config | columns(job.model)  # a paper column's word (h=50, direct=no) as its row shows it
            if row_name(label) in names and all(values.get(k) == v for k, v in words.items()):
                return config, job
        return None

    for claim in spec.get("claims") or []:
        for kind in CLAIM_KINDS:
            for pair in claim.get(kind) or []:
                if not all(isinstance(row, str) for row in pair):
                    continue
                a, b = (matching(row) for row in pair)
                if a is None or b is None:
                    continue
                both_trained = trains(a[1]) and trains(b[1])
                found = differences(precision_ran(a[0]), precision_ran(b[0]), allowed(claim.get("varies")), both_trained)
                if found:
                    raise NplmError(
                        f"{where}: claim {claim['claim']!r}, {pair[0]} against {pair[1]}: {confounded(found)}; run "
                        f"them alike, or name the keys in the claim's `varies`"
                    )


def study_rows(study: str, path: Path | None, where: str) -> set[str] | None:
    """The names of the rows the jobs of a study file give (`declared_rows`): the installed sweeps/<study>.yaml, or
    the file at `path`, composed under a name no installed study has beside the folder that holds its `study/`
    folder (its own experiments), as `hydra.searchpath=[file://DIR]` finds them for its sweep. None for a study that
    declares no jobs of Hydra's basic sweeper."""
    if path is None:
        found = resources.files(MODULE).joinpath("study", f"{study}.yaml")
        if not found.is_file():
            return None
        text = found.read_text()
    else:
        text = path.read_text()
    sweeper = ((yaml.safe_load(text) or {}).get("hydra") or {}).get("sweeper") or {}
    if not sweeper.get("params") or sweeper.get("_target_", BASIC_SWEEPER) not in KNOWN_JOBS:
        return None
    with tempfile.TemporaryDirectory() as folder, initialize_config_module(MODULE, version_base="1.3"):
        chosen = [f"study={study}"]
        if path is not None:
            (Path(folder) / "study").mkdir()
            (Path(folder) / "study" / f"{COPY}.yaml").write_text(text)
            beside = [folder, *([str(path.resolve().parent.parent)] if path.resolve().parent.name == "study" else [])]
            chosen = [f"hydra.searchpath=[{','.join(f'file://{p}' for p in beside)}]", f"study={COPY}"]

        def compose_job(job: list[str]) -> DictConfig:
            return compose("config", overrides=[*chosen, *job], return_hydra_config=True)

        return declared_rows(composed(sweeper["params"], compose_job, where))
