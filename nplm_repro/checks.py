"""Config checks: a value that composes but makes no sense is refused, naming its key, before any work.

Hydra already rejects unknown keys (the composed config is in struct mode); `check_config` rejects values
that compose fine but make no sense, naming the key, before any data is read or any run is created.
`check_job` adds what a job needs beyond the values (every interpolation resolves, the corpus is there, the cache
can be written), and `OutputDirs` the output directory Hydra is about to create: each a user's mistake, one line,
before a store is opened.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.baselines.mixture import MIX_MODES
from nplm_repro.cli import errors_exit
from nplm_repro.data.brown import find_brown
from nplm_repro.data.corpus import open_zip
from nplm_repro.data.load import CORPORA
from nplm_repro.data.text import source_path
from nplm_repro.errors import NplmError, one_line
from nplm_repro.models.features import FEATURES
from nplm_repro.models.precision import PRECISIONS
from nplm_repro.models.sampled_loss import ESTIMATORS, PROPOSALS
from nplm_repro.tracking.keys import is_neural
from nplm_repro.tracking.locks import locks_dir

Rule = tuple[Callable[[Any], bool], str]
SEED_MAX = 2**32 - 1


def _at_least(low: int) -> Rule:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low), f"an integer >= {low}"


def _number(low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False) -> Rule:
    def ok(v: Any) -> bool:
        return (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and (low < v if low_open else low <= v)
            and (v < high if high_open else v <= high)
        )

    bound = f"> {low}" if low_open else f">= {low}"
    return ok, f"a number {bound}" if high == math.inf else f"a number {bound} and {'<' if high_open else '<='} {high}"


def _one_of(*choices: Any) -> Rule:
    return (lambda v: v in choices), " or ".join(map(str, choices))


def _optional(rule: Rule) -> Rule:
    return (lambda v: v is None or rule[0](v)), f"null or {rule[1]}"


def _flag() -> Rule:
    return (lambda v: isinstance(v, bool)), "true or false"


def _text(what: str) -> Rule:
    return (lambda v: isinstance(v, str) and v.strip() != ""), what


def _lines() -> Rule:
    return (lambda v: isinstance(v, Sequence) and not isinstance(v, str) and all(isinstance(x, str) for x in v)), (
        "a list of strings"
    )


COMMON: dict[str, Rule] = {
    "data.corpus": _one_of(*CORPORA),
    "model.n": _at_least(2),
    "data.vocab_from": _one_of("stream", "train"),
    "data.max_unk_freq": _at_least(0),
    "data.eval_batch_size": _at_least(1),
    "data.split.test": _optional(_at_least(1)),
    # what numpy's generator takes (Lightning's seed_everything seeds it too)
    "seed": (lambda v: type(v) is int and 0 <= v <= SEED_MAX, f"an integer from 0 to {SEED_MAX}"),
    "study": ((lambda v: v is None or (isinstance(v, str) and v.strip() != "")), "null or a name"),
    "report": ((lambda v: v is None or (isinstance(v, str) and v.strip() != "")), "null or a directory"),
    "rerun": (lambda v: isinstance(v, bool), "true or false"),
    "threads": _optional(_at_least(1)),
}
BROWN: dict[str, Rule] = {"data.split.train": _at_least(1), "data.split.valid": _at_least(1)}
TEXT: dict[str, Rule] = {  # conf/data/text.yaml, ap.yaml
    "data.path": _text("a UTF-8 text file, a directory of them or a zip"),
    "data.members": _optional(_text("a file-name prefix")),
    "data.encoding": _text("an encoding name (utf-8, latin-1, ...)"),
    "data.tags": ((lambda v: v == "auto" or isinstance(v, bool)), "auto, true or false"),
    "data.paragraphs": _flag(),
    "data.drop_lines": _lines(),
    "data.numbers": _flag(),
    "data.proper_nouns": _flag(),
    "data.lowercase": _flag(),
    "data.vocab_size": _optional(_at_least(2)),
    "data.split.train": _optional(_at_least(1)),
    "data.split.valid": _optional(_at_least(1)),
    "data.split.valid_path": _optional(_text("a file, directory or zip")),
    "data.split.test_path": _optional(_text("a file, directory or zip")),
}
CORPUS_RULES = {"brown": BROWN, "text": TEXT, "ap": TEXT}
_limit: Rule = (lambda v: type(v) is int and (v == -1 or v >= 1), "an integer >= 1, or -1 for no limit")
NEURAL: dict[str, Rule] = {
    "model.m": _at_least(1),
    "model.h": _at_least(0),
    "model.direct": (lambda v: isinstance(v, bool), "true or false"),
    "model.mix": _one_of(*MIX_MODES),
    "model.features": _one_of(*FEATURES),
    "optim.recipe": _one_of("paper", "fast"),
    "optim.lr": _number(0, low_open=True),
    "optim.weight_decay": _number(0),
    "optim.batch_size": _at_least(1),
    "optim.output": _one_of("exact", "sampled"),
    # the recipes' rate schedules, each on when set (lightning_module.schedules); torch drops only by a factor < 1
    "optim.decay_rate": _optional(_number(0)),
    "optim.plateau_factor": _optional(_number(0, 1, low_open=True, high_open=True)),
    "trainer.precision": _one_of("auto", *PRECISIONS),  # bf16-mixed: products in bfloat16, eval float32
    # 0 would train nothing and score the initial weights as if they were a model; -1 is Lightning's "no limit"
    "trainer.max_epochs": _optional(_limit),
    "trainer.max_steps": _optional(_limit),
    # ddp_spawn keeps the job (its MLflow run, its lock) in this process; ddp would re-run the whole command
    "trainer.strategy": _one_of("auto", "ddp_spawn"),
}
SAMPLED: dict[str, Rule] = {
    "optim.samples": _at_least(1),
    "optim.proposal": _one_of(*PROPOSALS),
    "optim.estimator": _one_of(*ESTIMATORS),
    # sampled training computes in float32: bf16-mixed would be recorded but not used
    "trainer.precision": _one_of("auto", "32-true"),
    "trainer.devices": _one_of(1),  # its sparse gradients are not tried under DDP
}

# Lightning's fast_dev_run turns off the run's logger and checkpoints: its run would sit among the study's with
# no perplexities (the report lists it as failed). debug=default is the quick check that is recorded apart.
FAST_DEV_RUN = (
    "trainer.fast_dev_run is refused: its run would join the study's runs with no perplexities; "
    "debug=default runs a few steps into experiment debug_<corpus> instead"
)


def check_config(cfg: DictConfig) -> None:
    """Raise NplmError naming the first key whose value is out of range."""
    rules = dict(COMMON) | CORPUS_RULES.get(cfg.data.corpus, {})
    if is_neural(cfg):
        rules |= NEURAL
        if cfg.optim.get("output") == "sampled":
            rules |= SAMPLED
    for key, (ok, expected) in rules.items():
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise NplmError(f"{key}={value!r} is invalid: expected {expected}")
    if OmegaConf.select(cfg, "trainer.fast_dev_run"):
        raise NplmError(FAST_DEV_RUN)
    if is_neural(cfg) and cfg.model.h == 0 and not cfg.model.direct:
        raise NplmError("model.h=0 needs model.direct=true (without hidden units, W is the only path to the output)")
    train = cfg.data.split.get("train")  # null for a text corpus cut in proportions: known once it is read
    if is_neural(cfg) and train is not None and cfg.optim.batch_size > train:
        raise NplmError(
            f"optim.batch_size={cfg.optim.batch_size} is larger than the training split (data.split.train={train}): "
            "a batch is drawn from it"
        )


def _raw(cfg: DictConfig, key: str) -> Any:
    """The value of `key` (OmegaConf's full_key: `a.b[0].c`) as written, interpolations unresolved."""
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    for part in re.findall(r"[^.\[\]]+", key):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def check_resolves(cfg: DictConfig) -> None:
    """Every value resolves: `${...}` names another key (or a resolver), so a free text holding it, say a note
    with `${oops}`, would fail wherever it is first read, after the store is open. One line naming the key and how
    to write a literal `${`."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as error:
        key = error.full_key
        raw = _raw(cfg, key)
        escaped = raw.replace("${", "\\${")
        raise NplmError(
            f"{key}={raw!r} cannot be resolved: {one_line(error)}; a literal ${{ is written \\${{: '{key}={escaped}'"
        ) from None


def check_corpus(data: DictConfig) -> None:
    """The corpus files the data config names exist (and a zip is one), as the readers will look for them: a
    typo stops here, before a store is created for a run that cannot start."""
    if data.corpus == "brown":
        source = find_brown(data.path)
        if source.is_file():
            open_zip(source).close()
        return
    paths = {"data.path": data.path, "data.split.valid_path": data.split.valid_path}
    paths["data.split.test_path"] = data.split.test_path
    for key, path in paths.items():
        if path is not None:
            source_path(path, key)


def check_job(cfg: DictConfig) -> None:
    """All a job checks before any work, each a user's mistake in one line: every value resolves, the values make
    sense (`check_config`), the corpus is there, and the cache's lock directory can be written ($NPLM_CACHE)."""
    check_resolves(cfg)
    check_config(cfg)
    check_corpus(cfg.data)
    locks_dir()


class OutputDirs(Callback):
    """Hydra's callback (conf/config.yaml, before the sweep's) that creates the output directory of a run
    (`hydra.run.dir`) or a sweep (`hydra.sweep.dir`) before anything else: Hydra would create it after a sweep's
    store and parent run, or fail with a bare FileNotFoundError. A directory that cannot be created is one line
    naming its key, and exit 2 (`errors_exit`: Hydra turns a callback's exception into a warning and goes on)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with errors_exit():
            _create(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        with errors_exit():
            _create(config, "hydra.sweep.dir")


def _create(config: DictConfig, key: str) -> None:
    path = Path(str(OmegaConf.select(config, key)))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise NplmError(f"{key}={path}: cannot create this directory ({error.strerror})") from None
