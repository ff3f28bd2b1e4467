"""What a search (`hparams_search=<name>`, sweeping/search.py) is checked against before its store or parent run is
made (`check_search`, called by the sweep's `MlflowSweep.on_multirun_start`): a budget that allows nothing, a space
Optuna cannot draw from, and an Optuna study of the same name that searched something else.

An Optuna study is kept in `storage` (./optuna.db) under its name alone, so a second search in the folder of a first
would resume the first's study: it would run no trial and report the first's best value as its own. A study is
therefore bound to what it searches (`binding`): the corpus's fingerprint, the tracking store its trials' runs go
to, and the config's fixed part (the whole config less what the search sweeps, keyed as a run is: keys.config_key).
The search records its binding on the study it creates (`BINDING`); the same command after a stop finds the same
binding and resumes, any other command gets one line naming what differs and exit 2, and is told to give its search
a name of its own. A study from before bindings were kept (no binding) may have searched anything: it is refused the
same way, unless the command adopts it (`hydra.sweeper.adopt=true`), which binds it to that command's search.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from nplm_repro.data.load import load_corpus
from nplm_repro.errors import NplmError
from nplm_repro.storage.redaction import redact
from nplm_repro.storage.store import sqlite_file
from nplm_repro.tracking.keys import config_key

SEARCH_SWEEPER = "hydra_plugins.nplm_repro_search.OptunaSearch"
BINDING = "binding"  # the Optuna study's user attribute: what it searches (`binding`)
WHAT = {"corpus": "corpus fingerprint", "store": "tracking store", "config": "key of the config less the swept keys"}


def check_search(config: DictConfig) -> None:
    """Refuse, one line each, a search whose budget allows no trial (`n_trials` < 1, `cpu_hours` <= 0) or no end
    (neither), whose `n_jobs` < 1 or `stop_seconds` < 0, whose `retrain` is not `{top: >= 1, seeds: [...]}`, whose
    space has an empty range (`interval(3e-3, 3e-4)`, a `choice` of nothing), or whose study in `storage` searched
    another corpus, store or config (`check_binding`)."""
    sweeper = config.hydra.sweeper
    if sweeper._target_ != SEARCH_SWEEPER:
        return
    retrain = sweeper.get("retrain")
    budget = {
        "n_trials": (sweeper.n_trials, lambda v: v is None or _count(v), "an integer >= 1, or null for no cap"),
        "n_jobs": (sweeper.n_jobs, _count, "an integer >= 1"),
        "cpu_hours": (sweeper.cpu_hours, lambda v: v is None or v > 0, "a number > 0, or null for no limit"),
        "stop_seconds": (sweeper.stop_seconds, lambda v: v >= 0, "a number of seconds >= 0"),
        "retrain.top": (retrain and retrain.get("top"), lambda v: not retrain or _count(v), "an integer >= 1"),
        "retrain.seeds": (
            retrain and retrain.get("seeds"),
            lambda v: not retrain or (bool(v) and all(isinstance(s, int) for s in v) and len(set(v)) == len(v)),
            "a list of distinct integer seeds",
        ),
    }
    for name, (value, ok, expected) in budget.items():
        if not ok(value):
            raise NplmError(f"hydra.sweeper.{name}={value!r} is invalid: expected {expected} (nothing was run)")
    if sweeper.n_trials is None and sweeper.cpu_hours is None:
        raise NplmError(
            "hydra.sweeper.n_trials and cpu_hours are both null: the search would never end; give it a budget "
            "(cpu_hours) or a cap (n_trials) (nothing was run)"
        )
    for override in OverridesParser.create().parse_overrides(arguments(config)):
        if not override.is_sweep_override():
            continue
        key = override.get_key_element()
        if override.is_interval_sweep():
            interval = override.value()
            if not interval.start < interval.end:
                raise NplmError(
                    f"{key}: {override.input_line.split('=', 1)[1]} is an empty interval: write the lower bound "
                    f"first (interval({interval.end}, {interval.start})) (nothing was run)"
                )
        elif not list(override.sweep_string_iterator()):
            raise NplmError(f"{key}: {override.input_line.split('=', 1)[1]} has no value to try (nothing was run)")
    check_binding(config)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def arguments(config: DictConfig) -> list[str]:
    """The search's space and fixed overrides as the sweeper reads them: its `params`, then the command line's."""
    params = OmegaConf.to_container(config.hydra.sweeper.get("params") or {}, resolve=False)
    return [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)


def swept_keys(config: DictConfig) -> list[str]:
    """The keys the search draws a value of for each trial."""
    parsed = OverridesParser.create().parse_overrides(arguments(config))
    return sorted({o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()})


def import_optuna() -> Any:
    """Optuna, imported when a search runs (the extra `optuna`): plain runs never load it."""
    try:
        import optuna
    except ImportError:
        raise NplmError("hparams_search needs Optuna 4 or later: .venv/bin/pip install -e '.[optuna]'") from None
    return optuna


@functools.cache
def _fingerprint(data: str) -> str:
    return load_corpus(OmegaConf.create(json.loads(data))).fingerprint


def binding(config: DictConfig) -> dict[str, str]:
    """What a search searches: its corpus's fingerprint (the corpus is read once per process), its tracking store,
    and the key of its config less the swept keys, the data (its fingerprint) and Hydra's own node."""
    data = OmegaConf.to_container(config.data, resolve=True)
    fingerprint = _fingerprint(json.dumps(data, sort_keys=True))
    fixed = config.copy()
    with open_dict(fixed):
        fixed.pop("hydra", None)
        fixed.pop("data", None)  # its effect is the fingerprint: a corpus changed is said once, as the corpus
        for key in swept_keys(config):
            *path, last = key.split(".")
            node = OmegaConf.select(fixed, ".".join(path)) if path else fixed
            if isinstance(node, DictConfig):
                node.pop(last, None)
    return {"corpus": fingerprint, "store": redact(str(config.tracking.uri)), "config": config_key(fixed, "")}


def _same(bound: dict[str, str]) -> dict[str, str]:
    """A binding as compared: a SQLite store by its file's resolved path, however the URI named it (relative, absolute,
    through `..`), so that one store is never called another."""
    store = str(bound.get("store", ""))
    path = sqlite_file(store)
    return {**bound, "store": f"sqlite:///{path.resolve()}" if path is not None else store}


def check_binding(config: DictConfig) -> None:
    """The study of this search's name in its storage, if there is one, was made for this search's `binding`:
    else one line naming what differs and a name of its own for this search. A storage file not yet made is not
    made here (a refused command leaves nothing behind)."""
    sweeper = config.hydra.sweeper
    storage = str(sweeper.storage)
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).exists():
        return
    optuna = import_optuna()
    name = str(sweeper.study_name)
    names = {s.study_name for s in optuna.study.get_all_study_summaries(storage, include_best_trial=False)}
    if name not in names:
        return
    kept = optuna.load_study(study_name=name, storage=storage).user_attrs.get(BINDING)
    mine = binding(config)
    if (kept is not None and _same(kept) == _same(mine)) or (kept is None and sweeper.get("adopt")):
        return
    own = hashlib.sha256(json.dumps(mine, sort_keys=True).encode()).hexdigest()[:8]
    if kept is None:
        raise NplmError(
            f"search {name} in {redact(storage)} was made before searches kept what they search: its trials may be "
            f"of other data, another store or another config, so it is not resumed; start afresh under a name of "
            f"its own, hydra.sweeper.study_name={name}_{own}, or, if it is this search's, adopt it with "
            "hydra.sweeper.adopt=true (nothing was run)"
        )
    theirs, ours = _same(kept), _same(mine)
    differ = "; ".join(f"{WHAT[k]} {kept.get(k)} there, {mine[k]} here" for k in WHAT if theirs.get(k) != ours[k])
    raise NplmError(
        f"search {name} in {redact(storage)} searched something else ({differ}): it is resumed only by the command "
        f"that started it; give this search its own study name, hydra.sweeper.study_name={name}_{own}"
        " (nothing was run)"
    )
