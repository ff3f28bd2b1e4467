"""How the reports write a number: a relative difference, a mean with its std over seeds."""

from __future__ import annotations

from nplm_repro.tracking.runs import present


TINY = 0.0005  # a relative difference that one decimal of a percent would print as +0.0% or -0.0%


def pct(value: float) -> str:
    """A relative difference with its sign, one decimal of a percent (+12.3%); `< 0.1%` when it is smaller than
    0.05% either way (never +0.0% or -0.0%, which read as a measured nothing); '' when there is none."""
    if not present(value):
        return ""
    return "< 0.1%" if abs(value) < TINY else f"{value:+.1%}"


def mean_std(mean: float, std: float, spec: str = ".1f", alone: str | None = None) -> str:
    """A mean over seeds with its std ("246.1 ± 2.4"), the mean alone (`alone`'s format) with one seed; '' without."""
    if not present(mean):
        return ""
    return f"{mean:{spec}} ± {std:{spec}}" if present(std) else f"{mean:{alone or spec}}"
