"""Whether a claim's two arms are a controlled comparison: they may differ only in what the claim names.

A claim compares two rows ("the model beats the baseline"); its verdict means something only when the rows differ in
the thing the claim is about. The keys that may differ are the model's (`model.*`: the rows name the models), the
keys the two rows' labels set apart (`LSTM trainer.precision=32-true` against `LSTM trainer.precision=bf16-mixed`:
the precision), and what the claim declares (`varies: [optim.lr, optim.weight_decay]`, globs allowed); choosing the
sampled output layer (`optim.output`) brings its own knobs along (tracking/keys.py SAMPLING_KEYS). Every other key
of the two runs' configurations that can change a number must agree: the optimiser, the resolved precision, the
validation fraction, the ceiling and the stopping rules, the data. A counted or mixed row has no training of its
own: beside it only the data keys are compared.

The report (reporting/claims.py) gives a pair that differs elsewhere the verdict `confounded`, naming each key with
both values; a sweep refuses such a claim before any job where the composed configs already show it
(tracking/study_rows.py).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence

from nplm_repro.tracking.keys import SAMPLING_KEYS

CONFOUNDED = "confounded"
ALWAYS = ("model.*",)  # the rows name their models: a claim is about them
WHEN_TRAINED = ("data.", "model.", "optim.", "trainer.", "callbacks.")  # what a trained run's key holds
WHEN_NOT = ("data.",)  # beside a counted or mixed row: its data alone (its model is what the claim names)
# Values that mean the same: the whole split is `null` or 1.0; an early stop with no least gain is 0.
SAME = {
    "trainer.limit_val_batches": {"None": "1.0", "1": "1.0", "": "1.0"},
    "trainer.limit_train_batches": {"None": "1.0", "1": "1.0", "": "1.0"},
    "callbacks.early_stopping.min_delta": {"0": "0.0", "": "0.0", "None": "0.0"},
}
UNSET = "(unset)"


def label_keys(label: str) -> dict[str, str]:
    """The `key=value` words of a row's label (`LSTM trainer.precision=32-true` -> {trainer.precision: 32-true}); a
    paper column's word (`h=50`) is its model key."""
    words = dict(word.split("=", 1) for word in label.split() if "=" in word)
    return {(key if "." in key else f"model.{key}"): value for key, value in words.items()}


def allowed(label_a: str, label_b: str, varies: Sequence[str] | None = None) -> tuple[str, ...]:
    """The key patterns two rows may differ in: the model's, those their labels set apart, and the claim's `varies`;
    the sampled output layer's knobs come with `optim.output`."""
    a, b = label_keys(label_a), label_keys(label_b)
    named = [key for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    patterns = [*ALWAYS, *named, *(varies or ())]
    if any(fnmatch.fnmatchcase("optim.output", p) for p in patterns):
        patterns += [f"optim.{key}" for key in SAMPLING_KEYS]
    return tuple(dict.fromkeys(patterns))


def _value(config: Mapping[str, str], key: str) -> str:
    value = str(config.get(key, UNSET))
    return SAME.get(key, {}).get(value, value)


def differences(
    a: Mapping[str, str], b: Mapping[str, str], patterns: Iterable[str], both_trained: bool = True
) -> list[tuple[str, str, str]]:
    """(key, a's value, b's value) for each key the two configurations differ in beyond `patterns` (`allowed`):
    every key of a trained run's configuration when both rows trained, else their data keys."""
    patterns = tuple(patterns)
    groups = WHEN_TRAINED if both_trained else WHEN_NOT
    keys = sorted(k for k in set(a) | set(b) if k.startswith(groups))
    found = []
    for key in keys:
        if any(fnmatch.fnmatchcase(key, p) for p in patterns):
            continue
        if _value(a, key) != _value(b, key):
            found.append((key, str(a.get(key, UNSET)), str(b.get(key, UNSET))))
    return found


def confounded(found: Sequence[tuple[str, str, str]]) -> str:
    """The verdict of a pair whose arms also differ in `found`: `confounded: they also differ in trainer.precision
    (bf16-mixed / 32-true), ...`, each key with both values, the baseline's first."""
    keys = ", ".join(f"{key} ({a} / {b})" for key, a, b in found)
    return f"{CONFOUNDED}: they also differ in {keys}"
