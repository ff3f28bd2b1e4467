"""Whether a claim's two arms are a controlled comparison: they may differ only in what the claim names.

A claim compares two rows ("the model beats the baseline"); its verdict means something only when the rows differ in
the thing the claim is about. Two arms are compared run by run, matched by seed (`arm_differences`), on everything
their runs recorded (`record`): every key of their configurations that can change a number (the data, the model, the
optimiser, the trainer, the callbacks), the precision that actually ran (`precision_ran`: a class output layer
computes in float32 under bf16-mixed), the code (commit and uncommitted changes), the CPU model, torch's version and
threads, and the set of seeds. Only two kinds of key may differ (`allowed`): the model's keys (`model.*`: the rows
name their models), and the keys the claim lists in `varies` (globs allowed; choosing the sampled output layer,
`optim.output`, brings its own knobs along: tracking/keys.py SAMPLING_KEYS). A row's label never lets a key differ:
`MLP9 optim.batch_size=1024` against `MLP9 optim.batch_size=256` needs `varies: [optim.batch_size]`.

A counted row (an n-gram) has no training: beside it only the data and the code are compared. A mixed row is
compared through the runs it mixes: its first component's whole record under the mixture's model keys; of the runs
it mixes beyond the first, which its name says (`LSTM + MLP9` against `LSTM + LSTM`), and of its own run, what they
recorded of where and from what code they computed (compared against another mixture's only).

The report (reporting/claims.py) gives a pair that differs elsewhere the verdict `confounded`, naming each key with
both values; a sweep refuses such a claim before any job where the composed configs already show it
(tracking/study_rows.py).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from nplm_repro.tracking.keys import SAMPLING_KEYS
from nplm_repro.tracking.runs import present

CONFOUNDED = "confounded"
ALWAYS = ("model.*",)  # the rows name their models: a claim is about them
WHEN_TRAINED = ("data.", "model.", "optim.", "trainer.", "callbacks.", "run.")  # what a trained run's record holds
WHEN_NOT = ("data.", "run.code")  # beside a counted row: its data and its code (its model is what the claim names)
# What a run recorded of how it computed, beside its configuration: the tidy frame's columns (tracking/runs.py)
RECORDED = {"run.code": "code", "run.cpu_model": "cpu_model", "run.torch": "torch", "run.threads": "threads"}
WITH = "mixed with."  # the prefix of a mixture's further components' keys
SEEDS = "seeds"
UNSET = "(unset)"
# Values that mean the same. Lightning reads limit_*_batches as a fraction when a float and as a count when an int:
# `1.0`, `null` and a run without the key are the whole split, `1` is one batch. An early stop with no least gain is 0.
WHOLE = {"None": "1.0", "": "1.0", UNSET: "1.0"}
SAME = {
    "trainer.limit_val_batches": WHOLE,
    "trainer.limit_train_batches": WHOLE,
    "callbacks.early_stopping.min_delta": {"0": "0.0", "": "0.0", "None": "0.0", UNSET: "0.0"},
}
OUTPUT_IN_FLOAT32 = ("classes",)  # model.output values whose layer computes in float32 whatever the precision


def allowed(varies: Sequence[str] | None = None) -> tuple[str, ...]:
    """The key patterns two rows may differ in: the model's and the claim's `varies`; the sampled output layer's
    knobs come with `optim.output`."""
    patterns = [*ALWAYS, *(varies or ())]
    if any(fnmatch.fnmatchcase("optim.output", p) for p in patterns):
        patterns += [f"optim.{key}" for key in SAMPLING_KEYS]
    return tuple(dict.fromkeys(patterns))


def precision_ran(config: Mapping[str, str]) -> dict[str, str]:
    """`config` with the precision its run computed in: a class output layer (OUTPUT_IN_FLOAT32) runs in float32
    under bf16-mixed, though its recorded `trainer.precision` is the same string."""
    precision = config.get("trainer.precision")
    if precision in (None, "32-true") or config.get("model.output") not in OUTPUT_IN_FLOAT32:
        return dict(config)
    return {**config, "trainer.precision": f"{precision} (output layer 32-true)"}


def _value(config: Mapping[str, str], key: str) -> str:
    value = str(config.get(key, UNSET))
    return SAME.get(key, {}).get(value, value)


def _matches(key: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def differences(
    a: Mapping[str, str], b: Mapping[str, str], patterns: Iterable[str], both_trained: bool = True
) -> list[tuple[str, str, str]]:
    """(key, a's value, b's value) for each key the two records differ in beyond `patterns` (`allowed`): every key
    of a trained run's record when both rows trained, else their data and code. A mixture's further components
    (`mixed with.`) are compared against another mixture's only."""
    return _split(a, b, tuple(patterns), both_trained)[0]


def _split(
    a: Mapping[str, str], b: Mapping[str, str], patterns: tuple[str, ...], both_trained: bool
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """The keys two records differ in: (those beyond `patterns`, those within them but model.*)."""
    groups = WHEN_TRAINED if both_trained else WHEN_NOT
    keys = sorted(k for k in set(a) | set(b) if k.startswith(groups) or (k.startswith(WITH) and k in a and k in b))
    found, varied = [], []
    for key in keys:
        if _value(a, key) == _value(b, key) or _named_by_rows(key):
            continue
        difference = (key, str(a.get(key, UNSET)), str(b.get(key, UNSET)))
        if not _matches(key, patterns):
            found.append(difference)
        elif not _matches(key, ALWAYS):
            varied.append(difference)
    return found, varied


def _named_by_rows(key: str) -> bool:
    """A key the rows' names say differs: the model's, and what a mixture mixes beyond its first component (`LSTM +
    MLP9` against `LSTM + LSTM`); only where and from what code those further runs computed is compared."""
    if key.startswith(WITH):
        return not key.removeprefix(WITH).partition(".")[2].startswith("run.")
    return _matches(key, ALWAYS)


def record(run_id: str, runs: pd.DataFrame) -> dict[str, str]:
    """What run `run_id` of `runs` (tidy, indexed by run_id) recorded: its configuration with the precision that ran,
    and RECORDED; a mixed run's through the runs it mixes."""
    run = runs.loc[run_id]
    config = precision_ran(json.loads(run["config"]))
    mine = config | {key: _text(run.get(column)) for key, column in RECORDED.items()}
    mixes = [r for r in str(run.get("mixes") or "").split(",") if r]
    if run.get("kind") != "mixed" or not mixes:
        return mine
    if not all(r in runs.index for r in mixes):
        return mine | {"run.mixes": "(its runs are not in the store)"}
    first, *others = (record(r, runs) for r in mixes)
    model = {k: v for k, v in config.items() if k.startswith("model.")}
    shared = {k: v for k, v in first.items() if not k.startswith("model.")}
    own = {f"{WITH}0.{key}": mine[key] for key in RECORDED}  # the mixture's own: it learned its weights
    further = {f"{WITH}{i}.{k}": v for i, other in enumerate(others, 1) for k, v in other.items()}
    return shared | model | own | further


def trained_arm(records: Mapping[str, Mapping[str, str]]) -> bool:
    """Whether an arm's runs trained (a mixture through its first component): their records have trainer keys."""
    return bool(records) and all(any(k.startswith("trainer.") for k in r) for r in records.values())


def _text(value: object) -> str:
    """A recorded value as a string ('' where none; threads, which pandas read as float, as an integer)."""
    if not present(value):
        return ""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def arm(run_ids: Iterable[str], runs: pd.DataFrame) -> dict[str, dict[str, str]]:
    """A row's runs (`run_ids` of `runs`, tidy and indexed by run_id) by seed: each one's `record`."""
    return {str(runs.at[r, "seed"]): record(r, runs) for r in run_ids}


def arm_differences(
    a: Mapping[str, Mapping[str, str]],
    b: Mapping[str, Mapping[str, str]],
    varies: Sequence[str] | None = None,
    both_trained: bool = True,
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """Two arms (seed -> record) compared run by run: (the keys they differ in beyond the model's and `varies`, the
    keys within `varies` that actually differed), each with both values, several values joined by commas. Trained
    arms are matched by seed and must have the same seeds; beside a counted arm each run meets each run."""
    patterns = allowed(varies)
    found: dict[str, tuple[list[str], list[str]]] = {}
    varied: dict[str, tuple[list[str], list[str]]] = {}
    if both_trained:
        if set(a) != set(b):
            found[SEEDS] = ([",".join(sorted(a, key=_seed))], [",".join(sorted(b, key=_seed))])
        pairs = [(a[s], b[s]) for s in sorted(set(a) & set(b), key=_seed)]
    else:
        pairs = [(x, y) for x in a.values() for y in b.values()]
    for x, y in pairs:
        beyond, within = _split(x, y, patterns, both_trained)
        for into, differing in ((found, beyond), (varied, within)):
            for key, value_a, value_b in differing:
                values = into.setdefault(key, ([], []))
                for seen, value in zip(values, (value_a, value_b)):
                    if value not in seen:
                        seen.append(value)
    return _joined(found), _joined(varied)


def _seed(seed: str) -> tuple[int, str]:
    return (int(seed), seed) if seed.isdigit() else (1 << 30, seed)


def _joined(found: dict[str, tuple[list[str], list[str]]]) -> list[tuple[str, str, str]]:
    return [(key, ",".join(a), ",".join(b)) for key, (a, b) in found.items()]


def confounded(found: Sequence[tuple[str, str, str]]) -> str:
    """The verdict of a pair whose arms also differ in `found`: `confounded: they also differ in trainer.precision
    (bf16-mixed / 32-true), ...`, each key with both values, the baseline's first."""
    return f"{CONFOUNDED}: they also differ in {listed(found)}"


def listed(found: Sequence[tuple[str, str, str]]) -> str:
    """`key (a / b), ...`: keys with both arms' values."""
    return ", ".join(f"{key} ({a} / {b})" for key, a, b in found)
