"""Config checks and the console-script wrapper: a bad key or value is one line and a non-zero exit.

Hydra already rejects unknown keys (the composed config is in struct mode); `check_config` rejects values
that compose fine but make no sense, naming the key, before any data is read or any run is created.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.errors import NplmError
from nplm_repro.mixture import MIX_MODES

EXIT_BAD_INPUT = 2


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


NEURAL_MODEL = "nplm_repro.module.NPLMModule"


def is_neural(cfg: DictConfig) -> bool:
    """Whether `model` is eq. (1) (trained by Lightning) rather than an n-gram baseline (counted)."""
    return cfg.model._target_ == NEURAL_MODEL


def check_config(cfg: DictConfig) -> None:
    """Raise NplmError naming the first key whose value is out of range."""
    model, optim, data = cfg.model, cfg.optim, cfg.data
    rules: list[tuple[str, Any, bool, str]] = [
        ("model.n", model.n, _is_int(model.n) and model.n >= 2, "an integer >= 2"),
        ("data.vocab_from", data.vocab_from, data.vocab_from in ("stream", "train"), "'stream' or 'train'"),
        (
            "data.max_unk_freq",
            data.max_unk_freq,
            _is_int(data.max_unk_freq) and data.max_unk_freq >= 0,
            "an integer >= 0",
        ),
        (
            "data.eval_batch_size",
            data.eval_batch_size,
            _is_int(data.eval_batch_size) and data.eval_batch_size >= 1,
            "an integer >= 1",
        ),
        ("seed", cfg.seed, _is_int(cfg.seed), "an integer"),
    ]
    rules += [
        (f"data.split.{name}", data.split[name], _is_int(data.split[name]) and data.split[name] > 0, "an integer > 0")
        for name in ("train", "valid")
    ]
    rules.append(
        (
            "data.split.test",
            data.split.test,
            data.split.test is None or (_is_int(data.split.test) and data.split.test > 0),
            "null (the rest) or an integer > 0",
        )
    )
    if is_neural(cfg):
        rules += [
            ("model.m", model.m, _is_int(model.m) and model.m >= 1, "an integer >= 1"),
            ("model.h", model.h, _is_int(model.h) and model.h >= 0, "an integer >= 0"),
            ("model.direct", model.direct, isinstance(model.direct, bool), "true or false"),
            ("model.mix", model.mix, model.mix in MIX_MODES, " or ".join(MIX_MODES)),
            ("optim.recipe", optim.recipe, optim.recipe in ("paper", "fast"), "'paper' or 'fast'"),
            ("optim.lr", optim.lr, _is_number(optim.lr) and optim.lr > 0, "a number > 0"),
            (
                "optim.weight_decay",
                optim.weight_decay,
                _is_number(optim.weight_decay) and optim.weight_decay >= 0,
                "a number >= 0",
            ),
            (
                "optim.batch_size",
                optim.batch_size,
                _is_int(optim.batch_size) and optim.batch_size >= 1,
                "an integer >= 1",
            ),
        ]
        if optim.recipe == "paper":
            rules.append(
                (
                    "optim.decay_rate",
                    optim.decay_rate,
                    _is_number(optim.decay_rate) and optim.decay_rate >= 0,
                    "a number >= 0",
                )
            )
    for key, value, ok, expected in rules:
        if not ok:
            raise NplmError(f"{key}={value!r} is invalid: expected {expected}")
    if is_neural(cfg) and model.h == 0 and not model.direct:
        raise NplmError("model.h=0 needs model.direct=true (without hidden units, W is the only path to the output)")


def _one_line(error: BaseException) -> str:
    """Hydra/OmegaConf messages span lines; keep the first line of the error and of its cause."""
    parts = [str(error).strip().splitlines()[0].rstrip(".")]
    if error.__cause__ is not None and str(error.__cause__).strip():
        parts.append(str(error.__cause__).strip().splitlines()[0])
    return ": ".join(parts)


def _fail(error: BaseException) -> NoReturn:
    print(f"{os.path.basename(sys.argv[0])}: error: {_one_line(error)}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


@contextlib.contextmanager
def bad_input_exits() -> Iterator[None]:
    """Inside a Hydra job: NplmError becomes one line and exit 2 (SystemExit bypasses Hydra's own report)."""
    try:
        yield
    except NplmError as error:
        _fail(error)


def cli(main: Callable[[], Any]) -> Callable[[], None]:
    """Wrap a @hydra.main function: a bad key or value prints `prog: error: ...` and exits 2.

    Hydra prints its own multi-line report unless HYDRA_FULL_ERROR is set; we set it so the error reaches
    us, and keep Hydra's full traceback when the user set it.
    """
    user_wants_traceback = bool(os.environ.get("HYDRA_FULL_ERROR"))

    @functools.wraps(main)
    def run() -> None:
        os.environ["HYDRA_FULL_ERROR"] = "1"
        try:
            main()
        except (HydraException, OmegaConfBaseException) as error:
            if user_wants_traceback:
                raise
            _fail(error)

    return run
