"""Config checks and the console-script wrapper: a bad key or value is one line and a non-zero exit.

Hydra already rejects unknown keys (the composed config is in struct mode); `check_config` rejects values
that compose fine but make no sense, naming the key, before any data is read or any run is created.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.corpus import CORPORA
from nplm_repro.errors import NplmError, interrupted
from nplm_repro.mixture import MIX_MODES
from nplm_repro.precision import PRECISIONS
from nplm_repro.sampled_loss import ESTIMATORS, PROPOSALS

EXIT_FAILED = 1  # anything else that went wrong: the run is FAILED, its traceback in the run's error.txt
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # as a shell reports a job stopped by Ctrl-C


Rule = tuple[Callable[[Any], bool], str]


def _at_least(low: int) -> Rule:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low), f"an integer >= {low}"


def _number(low: float, high: float = math.inf, low_open: bool = False) -> Rule:
    def ok(v: Any) -> bool:
        return (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and (low < v if low_open else low <= v)
            and v <= high
        )

    bound = f"> {low}" if low_open else f">= {low}"
    return ok, f"a number {bound}" if high == math.inf else f"a number {bound} and <= {high}"


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
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
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
    "optim.recipe": _one_of("paper", "fast"),
    "optim.lr": _number(0, low_open=True),
    "optim.weight_decay": _number(0),
    "optim.batch_size": _at_least(1),
    "optim.output": _one_of("exact", "sampled"),
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
RECIPES: dict[str, dict[str, Rule]] = {
    "paper": {"optim.decay_rate": _number(0)},
    "fast": {"optim.plateau_factor": _number(0, 1, low_open=True)},
}
NEURAL_MODEL = "nplm_repro.module.NPLMModule"


def is_neural(cfg: DictConfig) -> bool:
    """Whether `model` is eq. (1) (trained by Lightning) rather than an n-gram baseline (counted)."""
    return cfg.model._target_ == NEURAL_MODEL


def check_config(cfg: DictConfig) -> None:
    """Raise NplmError naming the first key whose value is out of range."""
    rules = dict(COMMON) | CORPUS_RULES.get(cfg.data.corpus, {})
    if is_neural(cfg):
        rules |= NEURAL | RECIPES.get(cfg.optim.recipe, {})
        if cfg.optim.get("output") == "sampled":
            rules |= SAMPLED
    for key, (ok, expected) in rules.items():
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise NplmError(f"{key}={value!r} is invalid: expected {expected}")
    if is_neural(cfg) and cfg.model.h == 0 and not cfg.model.direct:
        raise NplmError("model.h=0 needs model.direct=true (without hidden units, W is the only path to the output)")


def one_line(error: BaseException) -> str:
    """Hydra/OmegaConf messages span lines; keep the first line of the error and of its cause."""
    parts = [(str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")]
    if error.__cause__ is not None and str(error.__cause__).strip():
        parts.append(str(error.__cause__).strip().splitlines()[0])
    return ": ".join(parts)


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(code)


_user_wants_traceback = False  # HYDRA_FULL_ERROR as the user set it, before `cli` sets it for its own use


def _unexpected(error: Exception) -> str:
    return f"{type(error).__name__}: {one_line(error)} (HYDRA_FULL_ERROR=1 shows the traceback)"


@contextlib.contextmanager
def errors_exit() -> Iterator[None]:
    """Inside a single Hydra job: NplmError becomes one line and exit 2, any other exception one line and exit 1.
    SystemExit bypasses Hydra's own report ("Error executing job with overrides: ..."), which would come first.

    Not in a sweep: there a job's error is its failure, and `cli` prints it once the sweep ends.
    """
    try:
        yield
    except NplmError as error:
        _fail(one_line(error))
    except Exception as error:
        if _user_wants_traceback:
            raise
        _fail(_unexpected(error), EXIT_FAILED)


def cli(main: Callable[[], Any]) -> Callable[[], None]:
    """Wrap a @hydra.main function: a bad key or value (NplmError, from a job too) prints `prog: error: ...` and
    exits 2; any other exception prints `prog: error: <type>: ...` and exits 1 (a run keeps its traceback in
    error.txt).

    Hydra prints its own multi-line report unless HYDRA_FULL_ERROR is set; we set it so the error reaches
    us, and keep the full traceback when the user set it. Ctrl-C or SIGTERM: one line and exit 130.
    """

    @functools.wraps(main)
    def run() -> None:
        global _user_wants_traceback
        _user_wants_traceback = bool(os.environ.get("HYDRA_FULL_ERROR"))
        os.environ["HYDRA_FULL_ERROR"] = "1"
        try:
            main()
        except (HydraException, OmegaConfBaseException, NplmError) as error:
            if _user_wants_traceback:
                raise
            _fail(one_line(error))
        except (KeyboardInterrupt, SystemExit) as error:
            if not interrupted(error) or _user_wants_traceback:
                raise
            print(f"{os.path.basename(sys.argv[0])}: interrupted (a run being recorded is now KILLED)", file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as error:
            if _user_wants_traceback:
                raise
            _fail(_unexpected(error), EXIT_FAILED)

    return run
