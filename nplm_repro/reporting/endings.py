"""How each seed of a row ended its training, from its validation curve (reporting/runs.py `history`) and what its run
recorded stopped its fit (tracking/stops.py): the epoch of its best validation, whether it was still improving, what
stopped it, and the rows that have not converged: a seed stopped at its ceiling, trainer.max_epochs, still improving.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from nplm_repro.tracking.stops import STOPS

Curves = dict[str, list[tuple[str, list[float]]]]  # per row label: (run id, validation perplexity per epoch) a seed


def best_epochs(curves: Curves, seeds: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per row label, per seed: the epoch (from 1) of the run's lowest validation perplexity, the checkpoint it
    reports; a row whose runs never validated has none."""
    return {
        label: {seeds[run_id]: float(np.argmin(values) + 1) for run_id, values in runs if values}
        for label, runs in curves.items()
        if any(values for _, values in runs)
    }


def still_improving(values: list[float]) -> bool:
    """Whether a seed's last validation was its best: it stopped still improving (by max_epochs, max_time or a
    search's budget, never by early stopping)."""
    return int(np.argmin(values)) == len(values) - 1


def improving(curves: Curves, label: str) -> str:
    """How many of a row's seeds were still improving when they stopped, `2 of 3`; '' for a row never validated."""
    runs = [values for _, values in curves.get(label, []) if values]
    return f"{sum(map(still_improving, runs))} of {len(runs)}" if runs else ""


def seed_epochs(curves: Curves, seeds: dict[str, str], label: str) -> str:
    """Each seed's epoch of its best validation, by seed, `*` where that was its last validation (it stopped still
    improving), `14 (1), 30* (2)`; '' for a row never validated."""
    runs = sorted((seeds.get(run_id, ""), values) for run_id, values in curves.get(label, []) if values)
    return ", ".join(f"{int(np.argmin(v)) + 1}{'*' if still_improving(v) else ''} ({seed})" for seed, v in runs)


def stopped(run_ids: str, stops: dict[str, str], seeds: dict[str, str]) -> str:
    """What ended each seed's fit, by seed, `early stopping (1), max_epochs (2)` (STOPS: also max_time, max_steps,
    pruned, budget); '' for a row whose runs fitted nothing (counted, mixed)."""
    found = sorted((seeds.get(run_id, ""), stops[run_id]) for run_id in run_ids.split() if stops.get(run_id))
    return ", ".join(f"{STOPS[why]} ({seed})" for seed, why in found)


def unconverged(table: pd.DataFrame, curves: Curves, stops: dict[str, str], seeds: dict[str, str]) -> list[str]:
    """One line per row with a seed that stopped at trainer.max_epochs still improving: it has not converged, and
    its number is the ceiling's, not the model's."""
    lines = []
    for _, row in table.iterrows():
        late = sorted(
            seeds.get(run_id, "")
            for run_id, values in curves.get(row["label"], [])
            if values and stops.get(run_id) == "max_epochs" and still_improving(values)
        )
        if late:
            ceiling = json.loads(row["config"]).get("trainer.max_epochs", "?")
            lines.append(
                f"{row['label']}: seed{'s' * (len(late) > 1)} {', '.join(late)} stopped at trainer.max_epochs="
                f"{ceiling} still improving (the last validation the best): raise trainer.max_epochs, or give early "
                "stopping a min_delta (callbacks.early_stopping.min_delta) that ends it sooner"
            )
    return lines
