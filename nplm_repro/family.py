"""The contract every model family answers, as every scikit-learn estimator answers fit, predict and score.

A family is one class, the one a config's `model._target_` names. The commands, the ledger, the checks and
`nplm-score` ask it what they need and never name it; the reports read what it said in a run's tags. It says:

- who it is: `family` (its name in run keys and the tag `family`), `label` (for people), `colour` (in figures) and
  `trained` (trained by Lightning: weights, a Model, and rows that read the optim and trainer keys);
- how a row of it gets its scores: `kind(cfg)`, one of KINDS: trained (weights, a Model), counted (an n-gram, no
  weights: its seed changes nothing) or mixed (other runs' kept scores);
- which finished runs a row of it is made from: `needs(cfg)` (a mixture's components; none for most families), each
  found by the ledger before the row's key, which holds theirs;
- what its config must satisfy: `rules(cfg)` (each key's values), `check(cfg)` (the keys together) and
  `check_sizes(cfg, sizes)` (what its values need of the data);
- `fit_run`: fit a run (train, count or mix) and return its metrics and its kept scores of valid and test;
- `score_run`: the ln P of any tokens (a split, a user's text) of a recorded run, rebuilt, by its own evaluation;
- how it describes itself to reports: `tags(cfg)`.

What a family needs of the store it gets through a `Job` (the ledger's, when it records a run) or a `Recorded`
run (nplm-score's): this module is a leaf, so the families sit below the tracking code that implements them.
`tests/test_contract.py` holds every family of `conf/model/` and the toy one of `tests/families/` to these duties.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
from hydra.utils import get_class

from nplm_repro.rules import Rule
from nplm_repro.scores import Scores

KINDS = ("trained", "counted", "mixed")
T = TypeVar("T")


class Tokens(Protocol):
    """What is scored: a span of a corpus (a split, or a user's text in a corpus of its own)."""

    corpus: Any  # data.corpus.Corpus: a leaf names no subpackage
    span: str

    def rows(self, order: int) -> np.ndarray:
        """Every token's window of `order` ids, the token last (baselines/ngram.py `split_windows`)."""
        ...


@dataclass(frozen=True)
class Need:
    """A finished run a row is made from (`Family.needs`): the newest of row `row` with seed `seed` (any seed, for a
    counted row) in study `study` (None: runs of no study), on the row's data. `key` is the config key that names
    it, which the ledger's errors about it cite."""

    row: str
    seed: int
    study: str | None
    key: str


class Job(Protocol):
    """What the ledger hands `fit_run`, besides the config, the corpus and the run's logger."""

    def resume_from(self) -> Path | None:
        """The last checkpoint of this config's run a kill interrupted, which training continues; else None."""
        ...

    def needed_scores(self) -> list[Scores]:
        """The kept scores of valid and test of the runs this row needs (its family's `needs`), in their order."""
        ...


class Recorded(Protocol):
    """A recorded run rebuilt from what it recorded (serving/scoring.py `RunScorer`), as `score_run` reads it."""

    run_id: str
    cfg: Any  # its config.yaml
    corpus: Any  # its data, read again and checked against its fingerprint

    def model(self) -> Any:
        """A trained run's best weights."""
        ...

    def parts(self) -> list[Recorded]:
        """The runs it was made from (its tag base_run_id: the runs its family's `needs` found), rebuilt on its data,
        in their order."""
        ...

    def logprob(self, tokens: Tokens) -> np.ndarray:
        """ln P of every token of `tokens`, as its family scores it (`score_run`)."""
        ...

    def reach(self) -> int | None:
        """How many tokens before a token its score reads, as its family says (`reach`)."""
        ...

    def kept_logprob(self, split: str) -> np.ndarray:
        """ln P of every token of a kept split (valid, test), as the run kept it; scored again if it kept none."""
        ...

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """`make()`, once per rebuilt run: what scoring builds (a counted model) is built once."""
        ...


class Family:
    """The duties of a family (this module's docstring), with what most families answer by default."""

    family: ClassVar[str] = ""
    label: ClassVar[str] = ""
    colour: ClassVar[str] = "C0"  # matplotlib's cycle
    trained: ClassVar[bool] = False  # trained by Lightning: weights, a Model, and rows that read optim and trainer

    @classmethod
    def kind(cls, cfg: Any) -> str:
        """trained, counted or mixed (KINDS): how a row of this config gets its scores."""
        return "trained" if cls.trained else "counted"

    @classmethod
    def needs(cls, cfg: Any) -> list[Need]:
        """The finished runs a row of this config is made from, which `Job.needed_scores` and `Recorded.parts` give
        back: none, unless its kind is mixed."""
        return []

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        """The values of the keys this family reads that make sense (config_checks.check_config applies them)."""
        return {}

    @classmethod
    def check(cls, cfg: Any) -> None:
        """What its values must satisfy together, beyond each key's rule: raise NplmError in one line."""

    @classmethod
    def check_sizes(cls, cfg: Any, sizes: Any) -> None:
        """What its values need of the data (`data.splits.Sizes`, a size None while unknown): NplmError in one line."""

    @classmethod
    def fit_run(cls, cfg: Any, corpus: Any, logger: Any, job: Job) -> tuple[dict[str, float], Scores]:
        """Fit a run of this config on the corpus, logging to `logger`: its metrics (`<split>_ppl` of every split it
        scored, exact) and its kept scores of valid and test."""
        raise NotImplementedError

    @classmethod
    def score_run(cls, run: Recorded, tokens: Tokens) -> np.ndarray:
        """ln P of every token of `tokens` by the recorded run, as its own evaluation scored its splits."""
        raise NotImplementedError

    @classmethod
    def reach(cls, run: Recorded) -> int | None:
        """How many tokens before a token its score reads (eq. (1): n - 1): a long text is scored a part at a time,
        each part with that many tokens before it, every token as in the whole text. None: the whole text before it
        (a recurrent state), so a text is scored whole."""
        return None

    @classmethod
    def tags(cls, cfg: Any) -> dict[str, str]:
        """What a run's tags say of its family, for reports, which never import a family."""
        return {
            "family": cls.family,
            "family_kind": cls.kind(cfg),
            "family_label": cls.label,
            "family_colour": cls.colour,
        }


def family_of(model: Any) -> type[Family]:
    """The family of the model a config's `model` group builds: the class its `_target_` names, which answers this
    contract; imports that class (every caller asks the family through this, never by name)."""
    return get_class(model._target_)
