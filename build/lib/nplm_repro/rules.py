"""Rules for config values, (ok, expected) pairs: `config_checks.check_config` applies the common ones and asks each
model family for its own (`rules` on the class `model._target_` names), so a family's knobs are checked where they
are defined. A leaf: every layer may use it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Rule = tuple[Callable[[Any], bool], str]
MIX_MODES = ("none", "fixed", "learned", "context")  # how a mixed row weighs its components (baselines/mixture.py)


def at_least(low: int) -> Rule:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low), f"an integer >= {low}"


def number(low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False) -> Rule:
    def ok(v: Any) -> bool:
        return (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and (low < v if low_open else low <= v)
            and (v < high if high_open else v <= high)
        )

    bound = f"> {low}" if low_open else f">= {low}"
    return ok, f"a number {bound}" if high == math.inf else f"a number {bound} and {'<' if high_open else '<='} {high}"


def one_of(*choices: Any) -> Rule:
    return (lambda v: v in choices), " or ".join(map(str, choices))


def optional(rule: Rule) -> Rule:
    return (lambda v: v is None or rule[0](v)), f"null or {rule[1]}"


def flag() -> Rule:
    return (lambda v: isinstance(v, bool)), "true or false"


def text(what: str) -> Rule:
    return (lambda v: isinstance(v, str) and v.strip() != ""), what


def lines() -> Rule:
    return (lambda v: isinstance(v, Sequence) and not isinstance(v, str) and all(isinstance(x, str) for x in v)), (
        "a list of strings"
    )
