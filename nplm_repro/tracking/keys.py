"""What identifies a run: `config_key` (a job's config and data) and `model_key` (a trained model).

Keys name a model by its family (`mlp`, `lstm`, `kneser_ney`, ...: the class's `family` attribute), never by where
its class lives, so moving code retrains nothing. Inside the hash a model is spelled as key version 1 spelled it
(nplm_repro/migrations.py `key_model`: the class paths of its four families then, and the knobs a family lost at
their frozen values), so the runs already in users' stores keep matching (tests/test_keys.py pins them). Runs carry
the tag `key_version`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nplm_repro.family import family_of
from nplm_repro.migrations import LATER_KNOBS, key_model

KEY_VERSION = "1"
SAMPLING_KEYS = ("output", "samples", "proposal", "estimator")  # optim's, for optim.output=sampled only
# What `without_unused` leaves out of a trained run's key, read back where two runs are told apart (a report's labels,
# a claim's arms): an exact run trained the softmax over V with exact gradients.
IMPLIED = {"model.output": "standard", "optim.output": "exact"}

# Keys that record where or how a job ran, not what it computed: left out of `config_key`. The row name is
# left out too: the MLP a mixed row trains for itself (no row) is the same run as its own row's.
BOOKKEEPING = (
    "tracking",
    "rerun",
    "report",
    "reporting",  # what the study's report says (studies.py): rewording a claim makes no run new
    "note",
    "threads",
    "row",
    "data.path",
    "data.split.valid_path",
    "data.split.test_path",
    "data.eval_batch_size",
    "trainer.enable_progress_bar",
    "trainer.strategy",  # auto and ddp_spawn give the same steps for the same trainer.devices (but STEPS_OF_ITS_OWN)
    "callbacks.progress_bar",
    "callbacks.model_checkpoint.dirpath",
)


# Strategies whose steps are their own, kept in config_key: parameter_parallel's M processes each read every batch
# (models/parallel.py), so its trainer.devices=2 is not DDP's two batches a step; the asynchronous processes each
# step on their own batch into shared weights (models/asynchronous.py)
STEPS_OF_ITS_OWN = ("parameter_parallel", "asynchronous", "asynchronous_locked")


def is_bookkeeping(key: str, value: Any) -> bool:
    """Whether a dotted key of a run's config, at this value, is BOOKKEEPING: trainer.strategy is, unless its steps
    are its own (STEPS_OF_ITS_OWN), which then tells runs apart in a report as in config_key."""
    return key.startswith(BOOKKEEPING) and not (key == "trainer.strategy" and str(value) in STEPS_OF_ITS_OWN)


def family(model: DictConfig) -> str:
    """The family's name in run keys (its class's `family`), of a config's `model` group."""
    return family_of(model).family


def trains(cfg: DictConfig) -> bool:
    """Whether the row trains weights of its own (its family says `kind` trained): it has a `model_key` and
    checkpoints, and a job of another study with the same model_key adopts its run."""
    return family_of(cfg.model).kind(cfg) == "trained"


def trained(model: DictConfig) -> bool:
    """Whether the family trains (weights, a Model, the optim and trainer keys): an MLP mixed with the trigram too,
    whose run keys name the MLP it mixes (`model_key`); of a config's `model` group."""
    return family_of(model).trained


def without_unused(tree: dict[str, Any]) -> dict[str, Any]:
    """`tree` (a config as a dict) less the sampling keys of an exact run, which it did not use, less
    `model.features` when it is `learned`, less `model.output` when it is `standard` (with the class keys
    unless it is `classes`), and less a mixture's `model.from_study` when it is null (its own study): such a run is
    identified by what it was before sampled training, fixed features, other output layers and mixtures of another
    study's rows existed, so stored runs keep matching."""
    optim = tree.get("optim")
    if isinstance(optim, dict) and optim.get("output", "exact") == "exact":
        tree["optim"] = {k: v for k, v in optim.items() if k not in SAMPLING_KEYS}
    model = tree.get("model")
    if isinstance(model, dict):  # the model before the knobs existed: learned features, eq. (1)'s own output layer
        unused = {"features"} if model.get("features") == "learned" else set()
        if model.get("output", "standard") != "classes":
            unused |= {"classes", "class_method"} | ({"output"} if model.get("output") == "standard" else set())
        unused |= {k for k in LATER_KNOBS if k in model and model[k] is None}
        tree["model"] = {k: v for k, v in model.items() if k not in unused}
    return tree


def model_key(cfg: DictConfig, fingerprint: str) -> str:
    """What determines a trained model: data, model (less the mixture), optimiser, trainer, early stopping, seed.

    A job of another study with the same key adopts its finished run instead of training the same model again.
    """
    parts = without_unused({k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "optim", "trainer")})
    parts["model"] = key_model(parts["model"], family(cfg.model))
    parts["model"].pop("mix", None)
    parts |= {
        "data": fingerprint,
        "seed": cfg.seed,
        "stopping": OmegaConf.to_container(cfg.callbacks.early_stopping),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def config_key(cfg: DictConfig, fingerprint: str, components: Sequence[str] = ()) -> str:
    """What determines a run's results in its study: the resolved config less BOOKKEEPING, the data fingerprint, and
    for a mixture of rows the config_keys of the runs it mixes (`components`: its config names them only by row).

    A job whose key already has a FINISHED run is skipped (unless `rerun=true`): a re-run sweep finishes
    only what is missing. The study is part of the key, so every study's runs carry its tag.
    """
    kept = without_unused(OmegaConf.to_container(cfg, resolve=False))
    kept["model"] = key_model(kept["model"], family(cfg.model))
    for dotted in BOOKKEEPING:
        *path, last = dotted.split(".")
        node = functools.reduce(lambda d, k: d.get(k) or {}, path, kept)
        node.pop(last, None)
    resolved = OmegaConf.to_container(OmegaConf.create(kept), resolve=True)
    if (strategy := OmegaConf.select(cfg, "trainer.strategy")) in STEPS_OF_ITS_OWN:
        resolved["trainer"]["strategy"] = strategy
    keyed: dict[str, Any] = {"config": resolved, "data": fingerprint}
    if components:  # absent otherwise: every other run keeps its key
        keyed["components"] = list(components)
    text = json.dumps(keyed, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
