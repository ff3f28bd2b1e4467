"""Every stored form of before, read as today's, in one place: what users' stores, checkpoints, Models and command
lines still hold from earlier versions, and the one function that upgrades each, which the main path calls once per
thing it reads:

- run keys (tracking/keys.py): the spellings key version 1 hashed (`FAMILY_IDS`, `FROZEN`, `LATER_KNOBS`, `key_model`),
  so the runs in users' stores keep their keys (tests/test_keys.py pins them);
- a mixed row's former config (tracking/components.py `former_key`): an MLP with `model.mix` (`former_config`);
- run rows (tracking/runs.py `tidy`): the tags a run from before them lacks (`upgrade_runs`), and a run's family
  from its class path (`run_family`); a run's kind from its tags alone (tracking/components.py: `counted`);
- command lines (cli.py): a study's `-cd sweeps -cn NAME` (`upgrade_argv`), nplm-ask's `--run-seed`
  (`upgrade_run_seed`);
- configs (train.py): classes named by the module they lived in (`upgrade_config`);
- Models and checkpoints (serving/served.py, scoring.py, registry.py): a Model that does not name its class
  (`upgrade_reading`), weights kept as a checkpoint artifact before runs logged a Model (`CHECKPOINT_BEFORE_MODELS`);
- lock files (storage/locks.py): a model_key's, named when only MLPs trained (`MODEL_LOCK`).

Each says which stored form it reads and why it is still needed; one that no store can hold any more goes. A leaf
(docs/layout.md): every layer may import it, and it imports no subpackage.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, open_dict

from nplm_repro.errors import NplmError

# --- run keys ------------------------------------------------------------------------------------------------------

# Key version 1 spelled the model of its four families by their class paths then: frozen as plain names (never
# imported), since every run stored since is keyed with them. A later family is spelled by its name.
FAMILY_IDS = {
    "mlp": "nplm_repro.module.NPLMModule",
    "deleted_interpolation": "nplm_repro.ngram.DeletedInterpolation",
    "kneser_ney": "nplm_repro.ngram.KneserNey",
    "class_based": "nplm_repro.class_ngram.ClassBackoff",
}
# Model keys a family lost, at the value every run of it had when key version 1 hashed them: the MLP's `mix: none`,
# from when a mixed row was an MLP's `model.mix` (now a row of its own, `former_config`)
FROZEN = {"mlp": {"mix": "none"}}
# Model knobs added after runs were stored, whose null is what every run did before them: left out of keys at null
LATER_KNOBS = ("from_study", "dropout_attention", "dropout_embedding")


def key_model(model: dict[str, Any], family: str) -> dict[str, Any]:
    """`model` (a config's model node, as a dict) as key version 1 hashed it: its class path replaced by its family's
    frozen id (`FAMILY_IDS`, else the family's name), and the keys it lost at their frozen values (`FROZEN`). Needed
    while stores hold runs keyed so: a job finds its finished run by that key (tracking/keys.py)."""
    return FROZEN.get(family, {}) | model | {"_target_": FAMILY_IDS.get(family, family)}


def former_config(mlp: DictConfig, mode: str, study: str | None) -> DictConfig:
    """The config a mixture of an MLP and the interpolated trigram had when it was the MLP's own row with
    `model.mix` (the paper's MLP2 ... MLP10 and their other weightings, before `model=mixture`): `mlp` (its MLP
    component's config) with `model.mix` the mixture's mode, in the mixture's study. Needed while stores hold such
    rows: a mixture's job finds its stored run by this config's key (tracking/components.py `former_key`)."""
    former = mlp.copy()
    with open_dict(former):
        former.model.mix, former.study = mode, study
    return former


# --- run rows --------------------------------------------------------------------------------------------------------

# Runs from before the tag `family`: their class's name, wherever it lived then.
FAMILIES = {path.rsplit(".", 1)[-1]: family for family, path in FAMILY_IDS.items()}
# Runs from before the tags `family_kind` and `family_colour` (a family's `tags`, nplm_repro/family.py): what their
# family would have said (kind and colour); the n-grams were counted, and an MLP with `model.mix` other than none
# was mixed. (The label, the paper's name of the family, is read where the paper is: tracking/runs.py.)
BEFORE_TAGS = {"mlp": ("trained", "C0")}
COUNTED_BEFORE = ("counted", "C1")
# Knobs a family gained after its first runs: the value those runs had without them. A run's configuration shows
# them for every run of the family (tracking/runs.py), so that runs from before them compare with today's.
DEFAULTS_BEFORE = {"mlp": {"model.mix": "none", "model.features": "learned", "model.output": "standard"}}


def _text(value: object) -> str:
    """A value MLflow recorded, as text; '' when it is missing (None, or the NaN of a run without it)."""
    return "" if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)


def run_family(family_tag: str | None, target: str | None) -> str:
    """A run's family: its tag `family`, else (a run from before that tag) its class's name, wherever it lived."""
    return family_tag or FAMILIES.get((target or "").rsplit(".", 1)[-1], target or "")


def upgrade_runs(raw: pd.DataFrame) -> pd.DataFrame:
    """Runs as `mlflow.search_runs` gives them (`tags.*`, `params.*`), with the tags a run from before them lacks:
    `family` (`run_family`), `family_kind` (trained, counted, or mixed for an MLP stored with `model.mix`) and
    `family_colour`, each as its family would have tagged it (`BEFORE_TAGS`). Needed while stores hold runs from
    before those tags: the report sorts and draws runs by them (tracking/runs.py `tidy`)."""
    runs = raw.copy()

    def column(name: str) -> list[str]:
        return [_text(v) for v in runs[name]] if name in runs else [""] * len(runs)

    families = [run_family(f, t) for f, t in zip(column("tags.family"), column("params.model._target_"))]
    before = [BEFORE_TAGS.get(f, COUNTED_BEFORE) for f in families]
    mixed = [mix not in ("", "none") for mix in column("params.model.mix")]
    upgraded = {
        "family": families,
        "family_kind": ["mixed" if m else kind for m, (kind, _) in zip(mixed, before)],
        "family_colour": [colour for _, colour in before],
    }
    for tag, values in upgraded.items():
        runs[f"tags.{tag}"] = [have or value for have, value in zip(column(f"tags.{tag}"), values)]
    return runs


def counted(tags: Mapping[str, str]) -> bool:
    """Whether a run counted its model (an n-gram), from its tags alone: its tag `family_kind`; a run from before
    that tag counted when it neither trained (no tag `model_key`) nor mixed (no tag `base_run_id`). Needed while
    stores hold such runs: a mixture takes any seed's run of a counted row (tracking/components.py)."""
    if "family_kind" in tags:
        return tags["family_kind"] == "counted"
    return "model_key" not in tags and "base_run_id" not in tags


# --- command lines ---------------------------------------------------------------------------------------------------

# How a study ran before the studies became the config group `study`: sweeps/ as Hydra's config directory
OLD_STUDY_OPTIONS = {"-cd": "dir", "--config-dir": "dir", "-cn": "name", "--config-name": "name"}
# nplm-ask's name for --seed until it took nplm-score's; said once when it is given
RUN_SEED_DEPRECATED = "--run-seed is deprecated: use --seed (it will be removed in the next release)"


def upgrade_argv(argv: list[str]) -> list[str]:
    """`argv` with a study's command of before, `-cd DIR -cn NAME`, as `study=NAME` when DIR/NAME.yaml is the
    installed study NAME, which composes the same jobs; a study file of another version is an error (Hydra cannot
    run a group's file alone). Any other command line, such as `-cd` naming a config of one's own, is returned as
    it is. Needed while scripts and notes of users run studies the old way (cli.py runs every command through it)."""
    given: dict[str, tuple[str, list[int]]] = {}
    for i, arg in enumerate(argv):
        option, equals, value = arg.partition("=")
        if option in OLD_STUDY_OPTIONS and (equals or i + 1 < len(argv)):
            given[OLD_STUDY_OPTIONS[option]] = (value, [i]) if equals else (argv[i + 1], [i, i + 1])
    if given.keys() != {"dir", "name"}:
        return argv
    (folder, dir_at), (name, name_at) = given["dir"], given["name"]
    path = Path(folder) / f"{name}.yaml"
    if not path.is_file() or not path.read_text().startswith("# @package _global_"):
        return argv
    installed = resources.files("nplm_repro.conf") / "study" / path.name
    if not installed.is_file() or installed.read_text() != path.read_text():
        raise NplmError(
            f"{path} is not the study {name} installed with nplm_repro: a study is the config group `study` "
            f"(nplm-train -m study=<name>), so reinstall the package (pip install .) to run this file"
        )
    return [f"study={name}" if i == name_at[0] else arg for i, arg in enumerate(argv) if i not in dir_at + name_at[1:]]


def upgrade_run_seed(args: argparse.Namespace) -> str:
    """nplm-ask's deprecated `--run-seed` (`args.run_seed`) read as `--seed`, unless --seed names another seed (an
    error); the option that named the seed, for the caller's messages (cli.py `check_run`, which warns of
    `RUN_SEED_DEPRECATED` once the run is checked). Needed for one more release, for users' scripts."""
    old = getattr(args, "run_seed", None)
    if old is None:
        return "--seed"
    if args.seed not in (None, old):
        raise NplmError(f"--seed {args.seed} and --run-seed {old} name two seeds: give --seed alone")
    args.seed = old
    return "--run-seed"


# A model_key's lock file (storage/locks.py `model_lock`) keeps the name it had when only MLPs trained, mlp-<key>.lock:
# a job of an earlier version sharing the cache waits on the same file, so the two never train the same model at once
MODEL_LOCK = "mlp-"

# --- configs, Models and checkpoints ---------------------------------------------------------------------------------

# Classes a config names by the module they lived in: the progress bar lived in models/lightning_module.py
MOVED_CLASSES = {"nplm_repro.models.lightning_module.ProgressBar": "nplm_repro.models.training.ProgressBar"}
# The class of a trained run's MLflow Model that does not name its own (`module`): Models were eq. (1)'s alone then
MODULE_BEFORE_FAMILIES = "nplm_repro.models.lightning_module.NPLMModule"
# Where runs kept their weights before they logged a Model (serving/scoring.py and registry.py read it)
CHECKPOINT_BEFORE_MODELS = "checkpoints/best.ckpt"


def upgrade_config(cfg: DictConfig) -> DictConfig:
    """`cfg` with each callback that names a class by the module it lived in (`MOVED_CLASSES`) naming it where it
    lives. Needed while configs of before are run (a copy of conf/ kept as one's own, a sweep's saved config): the
    callbacks are no part of a run's keys, so its run is the same. Changes `cfg` in place; returns it."""
    for callback in (cfg.get("callbacks") or {}).values():
        if isinstance(callback, Mapping) and callback.get("_target_") in MOVED_CLASSES:
            callback["_target_"] = MOVED_CLASSES[callback["_target_"]]
    return cfg


def upgrade_reading(reading: dict[str, Any]) -> dict[str, Any]:
    """A trained run's MLflow Model's reading (its artifact `reading`: vocabulary, reader settings, the module's
    class) with the class (`module`) a Model from before families did not name (`MODULE_BEFORE_FAMILIES`). Needed
    while registries serve such Models (serving/served.py)."""
    return {"module": MODULE_BEFORE_FAMILIES} | reading
