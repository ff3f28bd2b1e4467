"""The stored forms of before, read as today's (nplm_repro/migrations.py): each upgrade gives what the current
version writes, and leaves today's form as it is."""

import numpy as np
import pandas as pd
from hydra.utils import get_class
from omegaconf import OmegaConf

from nplm_repro.migrations import counted, upgrade_config, upgrade_reading, upgrade_runs
from nplm_repro.models.training import ProgressBar


def test_a_config_naming_a_moved_class_names_it_where_it_lives() -> None:
    cfg = OmegaConf.create(
        {
            "callbacks": {
                "progress_bar": {"_target_": "nplm_repro.models.lightning_module.ProgressBar", "refresh_rate": 5},
                "early_stopping": {"_target_": "lightning.pytorch.callbacks.EarlyStopping", "patience": "${seed}"},
            },
            "seed": 2,
        }
    )
    OmegaConf.set_struct(cfg, True)  # as Hydra hands it over
    upgraded = upgrade_config(cfg)
    assert get_class(upgraded.callbacks.progress_bar._target_) is ProgressBar
    assert upgraded.callbacks.early_stopping._target_ == "lightning.pytorch.callbacks.EarlyStopping"
    assert OmegaConf.to_container(upgraded.callbacks.early_stopping)["patience"] == "${seed}"


def test_a_model_that_does_not_name_its_class_is_eq_1s() -> None:
    assert upgrade_reading({"vocab": ["a"]}) == {
        "module": "nplm_repro.models.lightning_module.NPLMModule",
        "vocab": ["a"],
    }
    assert upgrade_reading({"module": "x.Y"}) == {"module": "x.Y"}


def test_runs_from_before_the_family_tags_get_the_tags_their_family_would_have_set() -> None:
    raw = pd.DataFrame(
        {
            "params.model._target_": [
                "nplm_repro.module.NPLMModule",
                "nplm_repro.module.NPLMModule",
                "nplm_repro.ngram.KneserNey",
                "nplm_repro.models.lstm.LSTMModule",
            ],
            "params.model.mix": [np.nan, "fixed", np.nan, np.nan],
            "tags.family": [np.nan, np.nan, np.nan, "lstm"],
            "tags.family_kind": [np.nan, np.nan, np.nan, "trained"],
            "tags.family_colour": [np.nan, np.nan, np.nan, "C4"],
        }
    )
    runs = upgrade_runs(raw)
    assert list(runs["tags.family"]) == ["mlp", "mlp", "kneser_ney", "lstm"]
    assert list(runs["tags.family_kind"]) == ["trained", "mixed", "counted", "trained"]
    assert list(runs["tags.family_colour"]) == ["C0", "C0", "C1", "C4"]
    assert raw["tags.family"].isna().sum() == 3  # the runs read are left as they were


def test_a_run_without_its_kind_tag_counted_when_it_neither_trained_nor_mixed() -> None:
    assert counted({"family_kind": "counted"}) and not counted({"family_kind": "trained"})
    assert counted({}) and not counted({"model_key": "k"}) and not counted({"base_run_id": "r"})
