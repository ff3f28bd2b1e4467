"""What a job's config must hold before it runs, the same for a single run and for each job of a sweep: every value
in range, naming its key (`check_config`: the common rules, the corpus's, then the model family's own, its `rules`
and `check`), the values against the sizes of the data (`check_sizes`: the split sizes the config gives; the ledger
asks again with the corpus read) and the corpus files it names there (`check_corpus`). In tracking, where the sweep
checks every job before it creates the store and the parent run; checks.py's `check_job` runs them for a single job.
"""

from __future__ import annotations

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from nplm_repro.data.load import CORPORA, KINDS, corpus_kind
from nplm_repro.data.splits import Sizes
from nplm_repro.errors import NplmError
from nplm_repro.rules import Rule, at_least, one_of, optional

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
    kind = KINDS.get(cfg.data.corpus)  # an unknown one is refused by COMMON's rule
    rules = dict(COMMON) | dict(kind.rules if kind else {}) | family.rules(cfg)
    for key, (ok, expected) in rules.items():
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise NplmError(f"{key}={value!r} is invalid: expected {expected}")
    if OmegaConf.select(cfg, "trainer.fast_dev_run"):
        raise NplmError(FAST_DEV_RUN)
    family.check(cfg)
    check_sizes(cfg, Sizes(cfg.data.split.get("train")))  # null for a text corpus cut in proportions: read later


def check_sizes(cfg: DictConfig, sizes: Sizes) -> None:
    """The job's values against the sizes of its data, each checked once it is known (a size None is not yet): a
    trained family's batch is drawn from the training split, then the family's own `check_sizes`
    (nplm_repro/family.py). `check_config` asks with the sizes the config gives, the ledger again with those of the
    corpus read, before the store is opened (a text corpus's split sizes and every corpus's words are known only
    then)."""
    family = get_class(cfg.model._target_)
    if family.trained and sizes.train is not None and cfg.optim.batch_size > sizes.train:
        raise NplmError(
            f"optim.batch_size={cfg.optim.batch_size} is larger than the training split ({sizes.train_said()}): "
            "a batch is drawn from it"
        )
    family.check_sizes(cfg, sizes)


def check_corpus(data: DictConfig) -> None:
    """The corpus files the data config names exist (and a zip is one), as the readers will look for them: a
    typo stops here, before a store is created for a run that cannot start."""
    corpus_kind(data).check_files(data)
