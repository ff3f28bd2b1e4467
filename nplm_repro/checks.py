"""Config checks: a value that composes but makes no sense is refused, naming its key, before any work.

Hydra already rejects unknown keys (the composed config is in struct mode); `check_config` rejects values
that compose fine but make no sense, naming the key, before any data is read or any run is created.
`check_job` adds what a job needs beyond the values (every interpolation resolves, the corpus is there, the cache
can be written), and `OutputDirs` the output directory Hydra is about to create: each a user's mistake, one line,
before a store is opened.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.cli import errors_exit
from nplm_repro.data.brown import find_brown
from nplm_repro.data.corpus import open_zip
from nplm_repro.data.load import CORPORA
from nplm_repro.data.text import source_path
from nplm_repro.errors import NplmError, one_line
from nplm_repro.rules import Rule, at_least, flag, lines, one_of, optional, text
from nplm_repro.tracking.locks import locks_dir

SEED_MAX = 2**32 - 1


COMMON: dict[str, Rule] = {
    "data.corpus": one_of(*CORPORA),
    "data.vocab_from": one_of("stream", "train"),
    "data.max_unk_freq": at_least(0),
    "data.eval_batch_size": at_least(1),
    "data.split.test": optional(at_least(1)),
    # what numpy's generator takes (Lightning's seed_everything seeds it too)
    "seed": (lambda v: type(v) is int and 0 <= v <= SEED_MAX, f"an integer from 0 to {SEED_MAX}"),
    "study": ((lambda v: v is None or (isinstance(v, str) and v.strip() != "")), "null or a name"),
    "report": ((lambda v: v is None or (isinstance(v, str) and v.strip() != "")), "null or a directory"),
    "rerun": (lambda v: isinstance(v, bool), "true or false"),
    "threads": optional(at_least(1)),
}
BROWN: dict[str, Rule] = {"data.split.train": at_least(1), "data.split.valid": at_least(1)}
TEXT: dict[str, Rule] = {  # conf/data/text.yaml, ap.yaml
    "data.path": text("a UTF-8 text file, a directory of them or a zip"),
    "data.members": optional(text("a file-name prefix")),
    "data.encoding": text("an encoding name (utf-8, latin-1, ...)"),
    "data.tags": ((lambda v: v == "auto" or isinstance(v, bool)), "auto, true or false"),
    "data.paragraphs": flag(),
    "data.drop_lines": lines(),
    "data.numbers": flag(),
    "data.proper_nouns": flag(),
    "data.lowercase": flag(),
    "data.vocab_size": optional(at_least(2)),
    "data.split.train": optional(at_least(1)),
    "data.split.valid": optional(at_least(1)),
    "data.split.valid_path": optional(text("a file, directory or zip")),
    "data.split.test_path": optional(text("a file, directory or zip")),
}
CORPUS_RULES = {"brown": BROWN, "text": TEXT, "ap": TEXT}

# Lightning's fast_dev_run turns off the run's logger and checkpoints: its run would sit among the study's with
# no perplexities (the report lists it as failed). debug=default is the quick check that is recorded apart.
FAST_DEV_RUN = (
    "trainer.fast_dev_run is refused: its run would join the study's runs with no perplexities; "
    "debug=default runs a few steps into experiment debug_<corpus> instead"
)


def check_config(cfg: DictConfig) -> None:
    """Raise NplmError naming the first key whose value is out of range: the common rules, the corpus's, and those
    of the model's family (its class's `rules`), then the family's own checks across keys (`check`)."""
    family = get_class(cfg.model._target_)
    rules = dict(COMMON) | CORPUS_RULES.get(cfg.data.corpus, {}) | family.rules(cfg)
    for key, (ok, expected) in rules.items():
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise NplmError(f"{key}={value!r} is invalid: expected {expected}")
    if OmegaConf.select(cfg, "trainer.fast_dev_run"):
        raise NplmError(FAST_DEV_RUN)
    family.check(cfg)
    train = cfg.data.split.get("train")  # null for a text corpus cut in proportions: known once it is read
    if family.trained and train is not None and cfg.optim.batch_size > train:
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
