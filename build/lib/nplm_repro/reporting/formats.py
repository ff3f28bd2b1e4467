"""How the reports write a number: a relative difference, a mean with its std over seeds."""

from __future__ import annotations

from nplm_repro.tracking.runs import present


def pct(value: float) -> str:
    """A relative difference with its sign, one decimal of a percent (+12.3%); '' when there is none."""
    return f"{value:+.1%}" if present(value) else ""


def mean_std(mean: float, std: float, spec: str = ".1f", alone: str | None = None) -> str:
    """A mean over seeds with its std ("246.1 ± 2.4"), the mean alone (`alone`'s format) with one seed; '' without."""
    if not present(mean):
        return ""
    return f"{mean:{spec}} ± {std:{spec}}" if present(std) else f"{mean:{alone or spec}}"
