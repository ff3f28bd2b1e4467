"""The learning-rate schedules of the training recipes, apart from any one family: eq. (1)'s recipes (the paper's
decay per training word, the fast recipe's drop on a plateau; lightning_module.py's doc) and the LSTM's drop on a
plateau (sequence.py) build their schedulers here, so that one knob reads the same in every family.
"""

from __future__ import annotations

from typing import Any

import torch


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
