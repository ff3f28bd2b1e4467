"""Run identity does not depend on where code lives: the keys of stored runs keep matching."""

import pytest
from helpers import composed

from nplm_repro.tracking.components import former_config
from nplm_repro.tracking.keys import config_key, is_bookkeeping, model_key


def test_todays_keys_are_those_of_stored_runs() -> None:
    """Runs in users' stores keep matching: keys computed by main at b1debf9, before the package moved into
    subpackages (default precision then bf16-mixed), for the Brown fingerprint. MLP6, since a mixture of MLP5's and
    Del. Int.'s rows, finds its stored run by the key of its former config (`former_config`: MLP5's with
    model.mix=fixed)."""
    keys = {}
    for row in ("mlp5", "kn3"):
        cfg = composed(f"experiment={row}", "trainer.precision=bf16-mixed")
        keys[row] = (config_key(cfg, "b45c28977b58c44b"), model_key(cfg, "b45c28977b58c44b"))
    mlp6 = former_config(composed("experiment=mlp5", "trainer.precision=bf16-mixed"), "fixed", None)
    keys["mlp6"] = (config_key(mlp6, "b45c28977b58c44b"), model_key(mlp6, "b45c28977b58c44b"))
    assert keys == {
        "mlp5": ("8b13a004ab62ee3a", "c6639489501f8df8"),
        "kn3": ("683563fe4129996c", "7e68f41a4a06f4f6"),
        "mlp6": ("39711c54ea6eaaf6", "c6639489501f8df8"),
    }


@pytest.mark.parametrize(
    "overrides,config,model",
    [
        (("experiment=mlp5",), "95160054aee03774", "8d570b9cfa835952"),
        (("experiment=kn3",), "b6f922925f41f37c", None),
        (("experiment=del_int",), "cf25a758bfb7d01f", None),
        (("experiment=class_n3_c500",), "ba5ffb34b8b04328", None),
    ],
)
def test_every_family_keeps_the_key_it_had_before_the_move(
    overrides: tuple[str, ...], config: str, model: str | None
) -> None:
    """Keys computed at 05d9cc6 (the flat package), in float32 and on a fixed data path, for each family."""
    cfg = composed(*overrides, "trainer.precision=32-true", "data.path=brown.zip")
    assert config_key(cfg, "0123456789abcdef") == config
    if model:
        assert model_key(cfg, "0123456789abcdef") == model


def test_a_mixed_mlp_row_finds_its_stored_run_by_its_former_key() -> None:
    """MLP6 is a mixture of MLP5's and Del. Int.'s rows; its stored run (an MLP5 with model.mix=fixed, keyed at
    05d9cc6) is found by the key of its former config, and holds MLP5's model."""
    mixture = composed("experiment=mlp6", "trainer.precision=32-true", "data.path=brown.zip")
    assert list(mixture.model.components) == ["MLP5", "Del. Int."] and mixture.model.mode == "fixed"
    mlp5 = composed("experiment=mlp5", "trainer.precision=32-true", "data.path=brown.zip")
    former = former_config(mlp5, mixture.model.mode, mixture.study)
    assert (config_key(former, "0123456789abcdef"), model_key(former, "0123456789abcdef")) == (
        "cb51ef23868c6329",
        "8d570b9cfa835952",
    )


def test_a_sampled_run_keeps_its_key() -> None:
    cfg = composed("experiment=mlp9", "optim=sampled", "data.path=brown.zip")
    assert (config_key(cfg, "0123456789abcdef"), model_key(cfg, "0123456789abcdef")) == (
        "24269bad12448644",
        "72726c1a6159c1ef",
    )


def test_processes_that_split_the_output_units_or_share_the_weights_are_not_ddp_with_as_many() -> None:
    """ddp_spawn's trainer.devices=2 takes two batches a step, parameter_parallel's trains one process's steps, the
    asynchronous processes step on their own: four configs, four keys; auto and ddp_spawn on one device compute the
    same, one key."""
    keys = {
        strategy: config_key(composed("experiment=mlp5", f"trainer.strategy={strategy}", devices), "0123456789abcdef")
        for strategy, devices in (("auto", "trainer.devices=1"), ("ddp_spawn", "trainer.devices=1"))
    }
    assert keys["auto"] == keys["ddp_spawn"]
    two = {
        s: config_key(composed("experiment=mlp5", f"trainer.strategy={s}", "trainer.devices=2"), "0123456789abcdef")
        for s in ("ddp_spawn", "parameter_parallel", "asynchronous", "asynchronous_locked")
    }
    assert len(set(two.values())) == 4
    # and a report tells them apart as their keys do: the strategy is bookkeeping unless its steps are its own
    assert is_bookkeeping("trainer.strategy", "ddp_spawn") and is_bookkeeping("trainer.strategy", "auto")
    assert not any(is_bookkeeping("trainer.strategy", s) for s in ("parameter_parallel", "asynchronous"))
    assert is_bookkeeping("tracking.uri", "parameter_parallel") and not is_bookkeeping("trainer.devices", "2")
