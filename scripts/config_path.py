"""The path one training run's config takes through the code: run `nplm-train` with the given overrides under a
profiler, and list every call of this project's code that receives a whole job config (a DictConfig with the groups
data, model, optim and trainer: the composed config or a copy of it), in the order made.

    python scripts/config_path.py data.path=tests/data/tiny_brown.zip trainer.max_epochs=1 ...

It prints the stops (file:function), then the counts the issue tracker reads: the stops, the files they pass through,
and the returns to a file already left (a stop in a file the path had left before). A function handed a part of the
config (cfg.model, cfg.optim) is not a stop: receiving the parts it uses is the aim. The last line counts those too
(any node of a job config), for comparison.
"""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any

from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parent.parent
OURS = (str(ROOT / "nplm_repro") + "/", str(ROOT / "hydra_plugins") + "/")
WHOLE = {"data", "model", "optim", "trainer"}


def whole(value: Any) -> bool:
    """A whole job config: the composed DictConfig (or a copy), not one of its groups."""
    try:
        return isinstance(value, DictConfig) and WHOLE <= set(value.keys())
    except Exception:  # noqa: BLE001 (a config being built may not answer keys() yet)
        return False


def part(value: Any) -> bool:
    """A node of a job config: a group such as cfg.model, or the whole."""
    try:
        return isinstance(value, DictConfig) and whole(value._get_root())
    except Exception:  # noqa: BLE001
        return False


def counted(stops: list[tuple[str, str]]) -> str:
    """Stops, the files they pass through, and returns to a file already left."""
    left: set[str] = set()
    returns = 0
    for (before, _), (now, _) in pairwise(stops):
        if now != before:
            left.add(before)
            returns += now in left
    return f"{len(stops)} stops in {len({f for f, _ in stops})} files, {returns} returns to a file already left"


def main(argv: list[str]) -> None:
    stops: list[tuple[str, str]] = []
    parts: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(OURS):
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        given = [frame.f_locals.get(name) for name in names]
        stop = (str(Path(code.co_filename).relative_to(ROOT)), code.co_name)
        if any(whole(value) for value in given):
            stops.append(stop)
        if any(part(value) for value in given):
            parts.append(stop)

    from nplm_repro.train import main as train

    sys.argv = ["nplm-train", *argv]
    sys.setprofile(profile)
    try:
        train()
    except SystemExit as end:
        if end.code:
            raise
    finally:
        sys.setprofile(None)
    print("\nThe whole config's path:")
    for file, function in stops:
        print(f"  {file}:{function}")
    print(f"whole config: {counted(stops)}")
    print(f"any part of it: {counted(parts)}")


if __name__ == "__main__":
    main(sys.argv[1:])
