"""A study's declaration: what its report says beyond its table (notes, claims, columns, figures, its own sections),
read from the key `reporting` of the study's one file, sweeps/<study>.yaml, beside its jobs. The package applies
declarations and names no study, so a user's study is one file and no code (docs/studies.md).

A claim names its rows by their labels; which rows a study's jobs give is known once they compose
(tracking/study_rows.py), and `check_claimed_rows` holds the claims to them.

The key is bookkeeping (tracking/keys.py BOOKKEEPING), neither in a job's config_key nor in its params: rewording a
claim never makes a finished run look new.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from nplm_repro.errors import NplmError, yaml_line

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
# What a claim compares, each a list of pairs of rows (reporting/claims.py applies them; docs/studies.md), and what
# it may say beside them; anything else is a typo, refused, or its pairs would silently count for nothing
CLAIM_KINDS = ("better", "equivalent", "more", "faster")
CLAIM_KEYS = ("claim", "by", "margin", "varies")


def checked(spec: Any, where: str) -> dict[str, Any]:
    """A declaration as the engine reads it (DEFAULT's notes where it declares none); NplmError on a key it does not
    know, or a claim it cannot apply (`_check_claims`), so a typo is one line rather than a section silently missing
    or a claim "not measured"."""
    spec = spec or {}
    if not isinstance(spec, dict):
        raise NplmError(f"{where}: `{KEY}` must be a mapping of what the report says (docs/studies.md)")
    unknown = sorted(set(spec) - KNOWN)
    if unknown:
        raise NplmError(f"{where}: `{KEY}` has unknown keys {', '.join(unknown)} (known: {', '.join(sorted(KNOWN))})")
    _check_claims(spec.get("claims") or [], where)
    return {"notes": DEFAULT["notes"], **spec}


def _check_claims(claims: Any, where: str) -> None:
    """Each claim a mapping of its words (`claim`), its kinds (CLAIM_KINDS), each a list of pairs of rows, and its
    thresholds: the engine would read a kind it does not know as no pairs at all."""
    shape = "a mapping with `claim: WORDS` and its pairs, [[baseline, model], ...] (docs/studies.md)"
    if not isinstance(claims, list):
        raise NplmError(f"{where}: `{KEY}.claims` must be a list of claims, each {shape}")
    for claim in claims:
        if not isinstance(claim, dict) or "claim" not in claim:
            raise NplmError(f"{where}: `{KEY}.claims` has {claim!r}: each claim is {shape}")
        unknown = sorted(str(key) for key in set(claim) - {*CLAIM_KINDS, *CLAIM_KEYS})
        if unknown:
            raise NplmError(
                f"{where}: claim {claim['claim']!r} has an unknown kind {', '.join(unknown)} (kinds: "
                f"{', '.join(CLAIM_KINDS)}; beside them: {', '.join(CLAIM_KEYS)})"
            )
        varies = claim.get("varies", [])
        if not isinstance(varies, list) or not all(isinstance(key, str) for key in varies):
            raise NplmError(f"{where}: claim {claim['claim']!r}: `varies` must be a list of keys, [optim.lr, ...]")
        for kind in CLAIM_KINDS:
            pairs = claim.get(kind) or []
            if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise NplmError(f"{where}: claim {claim['claim']!r}: `{kind}` must be pairs, [[baseline, model], ...]")


def row_name(label: str) -> str:
    """The row a claim's label names, less the `key=value` words that tell its configurations apart: `MLP n=5 h=50
    m=30 direct=no mix=no` is a row MLP, `MLP5 model.features=fixed_lsi` one of MLP5, `Kneser-Ney back-off n=3` one
    of Kneser-Ney back-off."""
    words = label.split()
    end = next((i for i, word in enumerate(words) if "=" in word), len(words))
    return " ".join(words[:end])


def claimed_rows(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(claim, label) of each row the claims name by its label; a row chosen among families (`{best_of: [...]}`)
    names none."""
    return [
        (str(claim["claim"]), row)
        for claim in spec.get("claims") or []
        for kind in CLAIM_KINDS
        for pair in claim.get(kind) or []
        for row in pair
        if isinstance(row, str)
    ]


def check_claimed_rows(spec: dict[str, Any], rows: set[str] | None, where: str) -> None:
    """NplmError on a claim on a row whose name (`row_name`) is none of `rows`, the names of the rows the study's
    jobs give (tracking/study_rows.py; None: not known, nothing checked): the report would show it "not measured"
    for ever."""
    if rows is None:
        return
    for claim, label in claimed_rows(spec):
        if row_name(label) not in rows:
            raise NplmError(
                f"{where}: claim {claim!r} is on row {label!r}, which no job of the study gives (its rows: "
                f"{', '.join(sorted(rows))})"
            )


class _UniqueKeys(yaml.SafeLoader):
    """YAML as Hydra reads a config file: a key given twice in one mapping is an error, where PyYAML keeps the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):  # PyYAML's own error follows
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _declared(text: str, where: str) -> tuple[str | None, dict[str, Any]]:
    """A study file's `study` and its declaration, the file read as Hydra reads it (`_UniqueKeys`)."""
    try:
        config = yaml.load(text, Loader=_UniqueKeys) or {}  # a SafeLoader
    except yaml.YAMLError as error:
        raise NplmError(yaml_line(error, where)) from None
    if not isinstance(config, dict):
        raise NplmError(f"{where}: not a study file (a mapping with `study` and `{KEY}`)")
    return config.get("study"), checked(config.get(KEY), where)


@functools.cache
def declaration(study: str) -> dict[str, Any]:
    """What sweeps/<study>.yaml (the config group `study`, installed with the package's configs) declares for its
    report, else the search whose `study` it is (conf/hparams_search/<name>.yaml: `nplm-report --study lstm_search`
    rebuilds a search's report as its sweep wrote it); DEFAULT for a study with no file (runs made with `study=NAME`
    on the command line alone)."""
    configs = resources.files("nplm_repro.conf")
    found = configs.joinpath("study", f"{study}.yaml")
    if found.is_file():
        return _declared(found.read_text(), f"sweeps/{study}.yaml")[1]
    for search in sorted(configs.joinpath("hparams_search").iterdir(), key=lambda f: f.name):
        if search.name.endswith(".yaml"):
            name, spec = _declared(search.read_text(), f"conf/hparams_search/{search.name}")
            if name == study:
                return spec
    return DEFAULT


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
