"""The clock of `nplm-bench`: a rate that one quiet second cannot make up. A unit of work (a training step, a set of
products, a whole pass) is timed in rounds that each last at least a given time, and a rate is the median round's
with the slowest and the fastest beside it (bench.py says why: single timings moved twofold between runs).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


class Clock:
    """Times a unit of work done over and over (a training step, a set of products, a whole pass over a split):
    `warmup` units untimed, then `repeats` rounds, each of as many units as it takes to last `min_seconds`.

    Each unit counts from the end of the one before (so a step's data loading is in), or from `resume()` after a gap
    that is not the work's (an epoch's end and its validation). `sync` waits for queued device work: called before a
    round ends, so a GPU round counts what it computed, not only what the host launched; never per unit, which would
    slow the steps it measures."""

    def __init__(self, warmup: int, min_seconds: float, repeats: int, sync: Callable[[], None] = lambda: None) -> None:
        self.min_seconds, self.repeats, self.sync = min_seconds, repeats, sync
        self.rounds: list[tuple[float, int, int]] = []  # (seconds, tokens, units) of each round
        self._warmup_left, self._seconds, self._tokens, self._units = warmup, 0.0, 0, 0
        self._mark = time.perf_counter()

    def resume(self) -> None:
        """The next unit counts from now: the time since the last one was not the work's."""
        self._mark = time.perf_counter()

    def tick(self, tokens: int) -> bool:
        """One unit of `tokens` tokens done; True once the last round is."""
        now = time.perf_counter()
        if self._warmup_left:
            self._warmup_left -= 1
            if not self._warmup_left:  # the warm-up's queued device work is not the first round's
                self.sync()
                now = time.perf_counter()
        else:
            self._seconds += now - self._mark
            self._tokens += tokens
            self._units += 1
            if self._seconds >= self.min_seconds:
                self.sync()
                end = time.perf_counter()
                self.rounds.append((self._seconds + end - now, self._tokens, self._units))
                self._seconds, self._tokens, self._units, now = 0.0, 0, 0, end
        self._mark = now
        return len(self.rounds) == self.repeats

    def round_rates(self, per_token: float = 1.0) -> list[float]:
        """Each round's tokens/s (times `per_token`), in the order the rounds ran."""
        return [tokens / seconds * per_token for seconds, tokens, _ in self.rounds]

    def report(self, unit: str, rate: str = "tokens_per_s", per_token: float = 1.0) -> dict[str, Any]:
        """The median round's rate (tokens/s, times `per_token` as `rate`), the slowest and fastest round's, and what
        they rest on: seconds timed, rounds and units (`unit`: steps or passes), all rounds together."""
        rates = sorted(self.round_rates(per_token))
        return {
            rate: statistics.median(rates),
            f"{rate}_range": [rates[0], rates[-1]],
            "seconds": sum(seconds for seconds, _, _ in self.rounds),
            "repeats": len(self.rounds),
            unit: sum(units for _, _, units in self.rounds),
        }
