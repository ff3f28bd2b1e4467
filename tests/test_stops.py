"""What ended a fit: each of the trainer's stopping rules named by the run that it stopped (models/training.py
`StopReason`), and read back by the report, from that record or, for a run from before it, from the run's epochs
and fit seconds (tracking/stops.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers import composed

from nplm_repro.models.training import fit_callbacks, stop_reason
from nplm_repro.tracking.stops import seconds, stopped_by


class Curve(L.LightningModule):
    """One weight to train, and a validation perplexity that falls with the epoch, or rises (`rising`)."""

    def __init__(self, rising: bool) -> None:
        super().__init__()
        self.w, self.rising = torch.nn.Parameter(torch.zeros(1)), rising

    def training_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
        return (self.w - batch[0]).pow(2).mean()

    def validation_step(self, batch: list[torch.Tensor], _: int) -> None:
        epoch = self.current_epoch
        self.log("valid_ppl_epoch", 300.0 + epoch if self.rising else 300.0 / (epoch + 1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


STOPPING = [  # (what stops the fit, the trainer's settings, validation rising from epoch 1)
    ("early_stopping", {"max_epochs": 10}, True),  # patience 2: epochs 2 and 3 do not improve on 1
    ("max_epochs", {"max_epochs": 3}, False),
    ("max_steps", {"max_epochs": 10, "max_steps": 3}, False),  # 2 batches an epoch: in epoch 2
    ("max_time", {"max_epochs": 100_000, "max_time": "00:00:00:01"}, False),
]


@pytest.mark.parametrize("why,settings,rising", STOPPING, ids=[s[0] for s in STOPPING])
def test_each_stopping_rule_names_itself_as_what_ended_the_fit(
    why: str, settings: dict[str, Any], rising: bool, tmp_path: Path
) -> None:
    """With the run's own callbacks (conf/callbacks/default.yaml's early stopping, a Timer), the rule that stopped the
    fit is the one named, and no other."""
    budget = [f"+trainer.max_time='{settings['max_time']}'"] if "max_time" in settings else []
    cfg = composed(f"callbacks.model_checkpoint.dirpath={tmp_path}", "trainer.enable_progress_bar=false", *budget)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 1)), batch_size=2)
    trainer = L.Trainer(**settings, logger=False, enable_progress_bar=False, callbacks=fit_callbacks(cfg))
    trainer.fit(Curve(rising), data, data)
    assert stop_reason(trainer) == why


def recorded(**metrics: float) -> dict[str, float]:
    """A run's metrics as mlflow.search_runs gives them, `metrics.<name>`."""
    return {f"metrics.{name}": value for name, value in metrics.items()}


def test_a_run_names_its_recorded_stop_and_a_search_trials_stop_comes_first() -> None:
    config = {"trainer.max_epochs": "30"}
    assert stopped_by(recorded(epochs=30.0, max_epochs_epoch=30.0), config) == "max_epochs"
    assert stopped_by(recorded(epochs=12.0, early_stopping_epoch=12.0), config) == "early_stopping"
    assert stopped_by(recorded(epochs=6.0, pruned_epoch=6.0), config) == "pruned"
    assert stopped_by(recorded(epochs=30.0, budget_epoch=30.0, max_epochs_epoch=30.0), config) == "budget"
    assert stopped_by(recorded(), config) == ""  # a counted or mixed run fitted nothing


def test_a_run_from_before_the_record_is_read_from_its_epochs_and_fit_seconds() -> None:
    """All of trainer.max_epochs trained: the ceiling; trainer.max_time spent: the time budget; else early stopping."""
    config = {"trainer.max_epochs": "30", "trainer.max_time": "00:00:05:25"}
    assert seconds(config["trainer.max_time"]) == 325.0 and seconds("None") is None
    assert stopped_by(recorded(epochs=30.0, fit_seconds=120.0), config) == "max_epochs"
    assert stopped_by(recorded(epochs=4.0, fit_seconds=325.3), config) == "max_time"
    assert stopped_by(recorded(epochs=4.0, fit_seconds=200.0), config) == "early_stopping"
    assert stopped_by(recorded(epochs=4.0, fit_seconds=400.0), {"trainer.max_epochs": "30"}) == "early_stopping"
