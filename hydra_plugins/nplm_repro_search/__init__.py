"""nplm_repro's sweepers where Hydra takes sweepers from: classes defined in the namespace package hydra_plugins
(Hydra registers a plugin under the module that defines it). The code is in nplm_repro/tracking/; the search's config
is conf/hydra/sweeper/optuna.yaml.

`hydra/sweeper=basic`, the default, is `RowsFirst`: Hydra's basic sweeper with a mixed row's jobs after those of
the rows it mixes (nplm_repro/sweeping/sweep_order.py), with Hydra's keys (max_batch_size, params). `register` puts
both into Hydra's plugins, and RowsFirst's config in the place of Hydra's own in its config store.
"""

from dataclasses import dataclass

from hydra._internal.core_plugins.basic_sweeper import BasicSweeperConf
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins

from nplm_repro.sweeping.search import Search
from nplm_repro.sweeping.sweep_order import RowsFirst as _RowsFirst


class OptunaSearch(Search):
    """`hydra/sweeper=optuna`: nplm_repro.sweeping.search.Search."""


class RowsFirst(_RowsFirst):
    """`hydra/sweeper=basic`, the default: nplm_repro.sweeping.sweep_order.RowsFirst."""


@dataclass
class RowsFirstConf(BasicSweeperConf):
    _target_: str = f"{__name__}.RowsFirst"


def register() -> None:
    """Register the sweepers by hand (Hydra finds plugins by walking the folders of the namespace package
    hydra_plugins, which an editable install's import hook does not list), and store RowsFirst's config as
    `hydra/sweeper=basic` once Hydra's plugins are loaded: loading them stores Hydra's own again."""
    plugins = Plugins.instance()
    for sweeper in (OptunaSearch, RowsFirst):
        plugins.register(sweeper)
    ConfigStore.instance().store(group="hydra/sweeper", name="basic", node=RowsFirstConf, provider="nplm_repro")
