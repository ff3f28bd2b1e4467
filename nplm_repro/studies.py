"""A study's declaration: what its report says beyond its table (notes, claims, columns, figures, its own sections),
read from the key `reporting` of the study's one file, sweeps/<study>.yaml, beside its jobs. The package applies
declarations and names no study, so a user's study is one file and no code (docs/studies.md).

The key is bookkeeping (tracking/keys.py BOOKKEEPING), neither in a job's config_key nor in its params: rewording a
claim never makes a finished run look new.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from nplm_repro.errors import NplmError

KEY = "reporting"
DEFAULT: dict[str, Any] = {"notes": ["sampled_vs_exact"]}  # what a study that declares nothing says under its table
# What a declaration may say (docs/studies.md lists what each means); anything else is a typo, refused
KNOWN = {
    "paper",
    "notes",
    "setup",
    "claims",
    "claims_heading",
    "elsewhere",
    "columns",
    "vocab_hint",
    "figures",
    "knobs",
    "recipe",
    "sampled_vs_exact",
}


def checked(spec: Any, where: str) -> dict[str, Any]:
    """A declaration as the engine reads it (DEFAULT's notes where it declares none); NplmError on a key it does not
    know, so a typo is one line rather than a section silently missing."""
    spec = spec or {}
    if not isinstance(spec, dict):
        raise NplmError(f"{where}: `{KEY}` must be a mapping of what the report says (docs/studies.md)")
    unknown = sorted(set(spec) - KNOWN)
    if unknown:
        raise NplmError(f"{where}: `{KEY}` has unknown keys {', '.join(unknown)} (known: {', '.join(sorted(KNOWN))})")
    return {"notes": DEFAULT["notes"], **spec}


def _declared(text: str, where: str) -> tuple[str | None, dict[str, Any]]:
    """A study file's `study` and its declaration."""
    try:
        config = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise NplmError(f"{where}: not YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise NplmError(f"{where}: not a study file (a mapping with `study` and `{KEY}`)")
    return config.get("study"), checked(config.get(KEY), where)


@functools.cache
def declaration(study: str) -> dict[str, Any]:
    """What sweeps/<study>.yaml (the config group `study`, installed with the package's configs) declares for its
    report; DEFAULT for a study with no file (runs made with `study=NAME` on the command line alone)."""
    found = resources.files("nplm_repro.conf").joinpath("study", f"{study}.yaml")
    if not found.is_file():
        return DEFAULT
    return _declared(found.read_text(), f"sweeps/{study}.yaml")[1]


def study_file(path: Path) -> tuple[str, dict[str, Any]]:
    """A study file anywhere (a user's, outside sweeps/): its study name and its declaration."""
    try:
        text = path.read_text()
    except OSError as error:
        raise NplmError(f"{path}: cannot read it: {error.strerror}") from None
    study, spec = _declared(text, str(path))
    if not study:
        raise NplmError(f"{path}: no `study: NAME` key, the tag its runs carry")
    return str(study), spec
