"""nplm_repro's Optuna sweeper where Hydra takes sweepers from: a class defined in the namespace package
hydra_plugins (Hydra registers a plugin under the module that defines it). The code is
nplm_repro/tracking/search.py, the config conf/hydra/sweeper/optuna.yaml."""

from nplm_repro.tracking.search import Search


class OptunaSearch(Search):
    """`hydra/sweeper=optuna`: nplm_repro.tracking.search.Search."""
