"""Config checks: a value that composes but makes no sense is refused, naming its key, before any work.

Hydra already rejects unknown keys (the composed config is in struct mode); `check_config` (tracking/config_checks.py,
which a sweep runs for every job too) rejects values that compose fine but make no sense, naming the key, before any
data is read or any run is created. `check_job` adds what a job needs beyond the values (every interpolation
resolves, the corpus is there, the cache can be written), and `OutputDirs` the output directory Hydra is about to
create: each a user's mistake, one line, before a store is opened.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.errors import NplmError, one_line
from nplm_repro.exits import errors_exit
from nplm_repro.storage.locks import locks_dir
from nplm_repro.tracking.config_checks import check_config, check_corpus


def _raw(cfg: DictConfig, key: str) -> Any:
    """The value of `key` (OmegaConf's full_key: `a.b[0].c`) as written, interpolations unresolved."""
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    for part in re.findall(r"[^.\[\]]+", key):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def check_resolves(cfg: DictConfig) -> None:
    """Every value resolves: `${...}` names another key (or a resolver), so a free text holding it, say a note
    with `${oops}`, would fail wherever it is first read, after the store is open. One line naming the key and how
    to write a literal `${`."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as error:
        key = error.full_key
        raw = _raw(cfg, key)
        escaped = raw.replace("${", "\\${")
        raise NplmError(
            f"{key}={raw!r} cannot be resolved: {one_line(error)}; a literal ${{ is written \\${{: '{key}={escaped}'"
        ) from None


def check_job(cfg: DictConfig) -> None:
    """All a job checks before any work, each a user's mistake in one line: every value resolves, the values make
    sense (`check_config`), the corpus is there, and the cache's lock directory can be written ($NPLM_CACHE)."""
    check_resolves(cfg)
    check_config(cfg)
    check_corpus(cfg.data)
    locks_dir()


class OutputDirs(Callback):
    """Hydra's callback (conf/config.yaml, before the sweep's) that creates the output directory of a run
    (`hydra.run.dir`) or a sweep (`hydra.sweep.dir`) before anything else: Hydra would create it after a sweep's
    store and parent run, or fail with a bare FileNotFoundError. A directory that cannot be created is one line
    naming its key, and exit 2 (`errors_exit`: Hydra turns a callback's exception into a warning and goes on)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with errors_exit():
            _create(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        with errors_exit():
            _create(config, "hydra.sweep.dir")


def _create(config: DictConfig, key: str) -> None:
    path = Path(str(OmegaConf.select(config, key)))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise NplmError(f"{key}={path}: cannot create this directory ({error.strerror})") from None
