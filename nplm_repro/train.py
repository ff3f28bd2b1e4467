"""`nplm-train`: fit one model on a corpus and record the run in MLflow (the run ledger does the work).

nplm-train experiment=mlp5                # a Table 1 MLP row (eq. 1, trained by Lightning)
nplm-train experiment=kn4                 # a Table 1 n-gram row (counted, no training loop)
nplm-train model.h=100 trainer.max_epochs=3
nplm-train -m study=brown_table1           # a study (sweeps/): every row, in parallel, under one MLflow parent run
nplm-train -m experiment=kn3,del_int       # any -m: one MLflow parent run, the jobs nested under it
nplm-train experiment=mlp5 hparams_search=paper_lr   # Optuna searches optim=paper's lr and decay (extra `optuna`)
nplm-train experiment=lstm hparams_search=lstm        # the LSTM's search, trials pruned epoch by epoch
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from hydra_plugins.nplm_repro_search import register
from nplm_repro.checks import check_job
from nplm_repro.cli import cli, fork_workers_from, freeze_imports, quiet
from nplm_repro.errors import sigterm_interrupts
from nplm_repro.exits import errors_exit
from nplm_repro.memory import keep_freed_memory
from nplm_repro.migrations import upgrade_config
from nplm_repro.sweeping.sweep import ends_sweeps
from nplm_repro.tracking.ledger import run

register()  # the sweepers: the search's (hparams_search=...) and the default, whose mixed rows wait for their rows
fork_workers_from("nplm_repro.train")  # a sweep's workers: imported once, forked


@hydra.main(config_path="pkg://nplm_repro.conf", config_name="config", version_base="1.3")
def _main(cfg: DictConfig) -> float:
    """One job; its validation perplexity is what a search (hparams_search=..., Optuna's sweeper) minimises."""
    keep_freed_memory()
    freeze_imports()  # in joblib's workers, whose end then does not scan torch's, Lightning's and MLflow's objects
    quiet()  # in joblib's workers too, which run only this function
    sigterm_interrupts()  # in joblib's and submitit's workers too, which run only this function
    with errors_exit(sweep=HydraConfig.get().mode == RunMode.MULTIRUN):
        cfg = upgrade_config(cfg)  # a config of before read as today's
        check_job(cfg)
        _, metrics = run(cfg)
    return metrics["valid_ppl"]


main = cli(ends_sweeps(_main))

if __name__ == "__main__":
    main()
