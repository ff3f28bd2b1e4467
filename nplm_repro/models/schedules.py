"""The learning-rate schedules of the training recipes, apart from any one family: eq. (1)'s recipes (the paper's
decay per training word, the fast recipe's drop on a plateau; lightning_module.py's doc), the sequence models' drop
on a plateau and adamw's cosine, to its last step or to its time budget (sequence.py), build their schedulers here,
so that one knob reads the same in every family.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.callbacks import Timer


FLOOR = 0.1  # where adamw's cosine ends, a fraction of optim.lr, unless `optim.cosine_floor` says (absent: 0.1)


def cosine(done: float, floor: float = FLOOR) -> float:
    """adamw's factor when `done` (0 to 1; past 1 counts as 1) of its cosine has passed: from 1 down to `floor`."""
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(done, 1.0)))


def budget_rate(spent: float, warmup: float, floor: float = FLOOR) -> float:
    """adamw's factor when `spent` (0 to 1) of a time budget is spent: a linear rise over its first `warmup`, then
    the cosine, which reaches `floor` when the budget is spent (`optim.anneal_to_time`)."""
    if spent < warmup:
        return spent / warmup
    return cosine((spent - warmup) / (1.0 - warmup), floor)


def to_time_budget(
    optimizer: torch.optim.Optimizer, timer: Timer, warmup: float, floor: float = FLOOR
) -> dict[str, Any]:
    """adamw's rise and cosine along the time budget `timer` keeps (trainer.max_time) instead of along steps: the
    factor at each step is `budget_rate` of the fit's seconds so far over the budget. Those are the Timer's, training
    and validation alike for every family (the report's fit_seconds), and a checkpoint keeps them: a resumed run
    goes on down the cosine where it was stopped, not from its peak."""
    budget = timer.time_elapsed() + timer.time_remaining()  # trainer.max_time in seconds (the Timer keeps it private)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda _: budget_rate(timer.time_elapsed() / budget, warmup, floor)
    )
    return {"scheduler": scheduler, "interval": "step"}


def schedules(
    optimizer: torch.optim.Optimizer,
    decay_rate: float | None,
    plateau_factor: float | None,
    batch: int,
    warmup: int = 0,
) -> list[dict[str, Any]]:
    """The recipes' learning-rate knobs, each on when its key is set: the paper's eps_0 / (1 + r t) (`decay_rate`
    r, t counting training words; optim=paper), a linear rise over the first `warmup` steps (optim=adamw) and the drop
    by `plateau_factor` after an epoch without validation progress (optim=fast, adamw). A recipe may take the other's
    knob (`+optim.plateau_factor=0.2` on paper, `+optim.decay_rate` on fast; `optim.plateau_factor=null` drops
    nothing): sweeps/brown_recipe.yaml moves from one recipe to the other one knob at a time. Each recipe alone keeps
    its scheduler, so its runs step exactly as before the knobs composed.
    """

    def rate(step: int) -> float:
        """The rate's factor at `step` before any drop."""
        rise = min((step + 1) / warmup, 1.0) if warmup else 1.0
        return rise / (1.0 + (decay_rate or 0.0) * step * batch)

    found = []
    if decay_rate is not None or warmup:
        if plateau_factor is None:
            found.append({"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, rate), "interval": "step"})
        else:  # the factor as a ratio per step on the current rate, so that the drops, which scale it, stay in it
            for group in optimizer.param_groups:
                group["lr"] *= rate(0)
            steps = torch.optim.lr_scheduler.MultiplicativeLR(optimizer, lambda step: rate(step) / rate(step - 1))
            found.append({"scheduler": steps, "interval": "step"})
    if plateau_factor is not None:
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=plateau_factor, patience=0)
        found.append({"scheduler": plateau, "monitor": "valid_ppl_epoch"})
    return found
