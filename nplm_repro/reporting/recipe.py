"""A recipe study's findings (`reporting.recipe` of its sweeps file; sweeps/brown_recipe.yaml's): the paper's own
recipe (optim=paper) run to convergence beside the paper's numbers and another study's optim=fast rows in the same
store (brown_table1's), one row moved from optim=paper to optim=fast one knob at a time (which knob moves
perplexity most), and that study's claims re-checked on the paper-recipe rows.

A run's step is read from what it computed, its optim params, never from a label: a run whose optimiser is no
step's (e.g. a sweep widened on the command line) stays in the study's table and in no step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from nplm_repro.paper import label, paper_table
from nplm_repro.reporting.claims import Claim, check_claims
from nplm_repro.reporting.formats import mean_std, pct
from nplm_repro.reporting.intervals import Evidence
from nplm_repro.storage.archive import ArchiveSource
from nplm_repro.studies import declaration
from nplm_repro.tracking.best import finished_rows
from nplm_repro.tracking.keys import IMPLIED
from nplm_repro.tracking.runs import present

Optim = dict[str, float | str | None]  # param -> value; None: the run has no such param (the knob is off)


@dataclass(frozen=True)
class Step:
    """One step from optim=paper to optim=fast: its name, the knob it changes, the optimiser that identifies it."""

    name: str
    change: str
    optim: Optim


@dataclass(frozen=True)
class Recipe:
    """A recipe study's declaration (`reporting.recipe` of its sweeps file): the paper table its rows sit beside,
    the study whose optim=fast rows it sets beside them, its target rows and margin, the row it ablates and the
    steps it ablates through, each step's optimiser the previous one's with what the step changes."""

    paper: str
    against: str
    rows: tuple[str, ...]
    targets: tuple[str, ...]
    within: float
    ablate: str
    steps: tuple[Step, ...]

    @classmethod
    def declared(cls, spec: dict[str, Any]) -> Recipe:
        steps, optim = [], {}
        for step in spec["steps"]:
            optim = optim | {f"optim.{k}": v for k, v in step["optim"].items()}
            steps.append(Step(step["name"], step["change"], optim))
        return cls(
            paper=spec["paper"],
            against=spec["against"],
            rows=tuple(spec["rows"]),
            targets=tuple(spec["targets"]),
            within=float(spec["within"]),
            ablate=spec["ablate"],
            steps=tuple(steps),
        )


def _is(config: dict[str, str], optim: Optim) -> bool:
    """Whether a configuration (params as MLflow keeps them, strings) has exactly this optimiser."""
    for key, value in optim.items():
        have = config.get(key, IMPLIED.get(key))  # a key its run leaves out has its implied value (exact training)
        if value is None or isinstance(value, str):
            if have != value:
                return False
        elif have is None or float(have) != value:
            return False
    return True


def step_of(config: str, steps: tuple[Step, ...]) -> Step | None:
    """The step whose optimiser a configuration (its JSON) has, if any."""
    parsed = json.loads(config)
    return next((step for step in steps if _is(parsed, step.optim)), None)


def labelled(plan: Recipe, table: pd.DataFrame) -> pd.DataFrame:
    """The study's table with each row named by its paper row and step (MLP5 paper, MLP5 rate x5), for the text and
    the figure's legend; rows of no step keep their label."""
    steps = table["config"].map(lambda config: step_of(config, plan.steps))
    named = [f"{row} {step.name}" if step else label for row, step, label in zip(table["row"], steps, table["label"])]
    return table.assign(label=named)


def _of(plan: Recipe, table: pd.DataFrame, step: Step) -> pd.Series:
    """Which rows of the study's table ran with this step's optimiser."""
    return table["config"].map(lambda config: step_of(config, plan.steps)) == step


def _rows(plan: Recipe, table: pd.DataFrame, step: Step) -> pd.DataFrame:
    """The finished rows of the study's table run with this step's optimiser, by paper row (MLP5, MLP6, ...)."""
    finished = table[(table["status"] == "finished") & _of(plan, table, step)]
    return finished.drop_duplicates("row").set_index("row")


def _unfinished(plan: Recipe, table: pd.DataFrame, step: Step, row: str) -> str:
    """What a paper row of a step shows until it has a finished run: running, or not run."""
    ours = table[_of(plan, table, step) & (table["row"] == row)]
    return "running" if (ours["running"] > 0).any() else "not run"


def _ppl(value: float) -> str:
    return f"{value:.1f}" if present(value) else ""


def _minutes(row: pd.Series) -> str:
    """Minutes in fit where the run has them (a resumed run's wall time spans the time it was down)."""
    minutes = row["fit_minutes"] if present(row["fit_minutes"]) else row["minutes"]
    return f"{minutes:.1f}" if present(minutes) else ""


def _epochs(row: pd.Series) -> str:
    return f"{row['epochs']:.0f}" if present(row["epochs"]) else ""


def _fast(table1: pd.DataFrame | None, row: str) -> tuple[str, str, str]:
    """Table 1's optim=fast row: valid and test (mean ± std over seeds) and the seeds, or why there is none."""
    if table1 is None:
        return "absent", "absent", "0"
    found = table1[(table1["label"] == row) & (table1["status"] == "finished")]
    if found.empty:
        return "not run", "not run", "0"
    fast = found.iloc[0]
    cells = [mean_std(fast[f"{s}_ppl"], fast[f"{s}_ppl_std"]) for s in ("valid", "test")]
    return cells[0], cells[1], str(fast["seeds"])


def beside(plan: Recipe, table: pd.DataFrame, table1: pd.DataFrame | None) -> pd.DataFrame:
    """The paper-recipe rows: ours, the paper's and the difference per split, epochs and minutes in fit, and the
    same row with optim=fast from study `against` (mean over its seeds) when this store has it."""
    first = plan.steps[0]
    ours, paper = _rows(plan, table, first), paper_table(plan.paper).set_index("row")
    records = []
    for row in plan.rows:
        run = ours.loc[row] if row in ours.index else None
        record: dict[str, str] = {"row": row}
        for split in ("valid", "test"):
            theirs = paper.loc[row, f"paper_{split}_ppl"]
            mine = run[f"{split}_ppl"] if run is not None else np.nan
            record |= {
                f"{split}, paper recipe": _ppl(mine) or _unfinished(plan, table, first, row),
                f"{split}, paper": f"{theirs:g}",
                f"{split} diff": pct(mine / theirs - 1),
            }
        mixed = run is not None and run["mix"] != "no"
        record["epochs"] = "" if run is None or mixed else _epochs(run)
        record["fit min"] = "" if run is None else _minutes(run)
        fast = _fast(table1, row)
        record |= {"valid, fast": fast[0], "test, fast": fast[1], "fast seeds": fast[2]}
        records.append(record)
    return pd.DataFrame.from_records(records)


def ablation(plan: Recipe, table: pd.DataFrame) -> pd.DataFrame:
    """The ablated row (MLP5) at each step, in order (optim=paper to optim=fast), each against the previous step
    that ran."""
    records, before = [], None
    for i, step in enumerate(plan.steps):
        rows = _rows(plan, table, step)
        run = rows.loc[plan.ablate] if plan.ablate in rows.index else None
        record = {"step": f"{i}. {step.name}", "change": step.change}
        if run is None:
            state = _unfinished(plan, table, step, plan.ablate)
            records.append(record | {"valid": state, "test": state})
            continue
        against = before[0] if before is not None else ""
        for split in ("valid", "test"):
            change = run[f"{split}_ppl"] / before[1][f"{split}_ppl"] - 1 if before is not None else np.nan
            record |= {split: _ppl(run[f"{split}_ppl"]), f"{split} change": pct(change)}
        record |= {"against": against, "epochs": _epochs(run), "fit min": _minutes(run)}
        records.append(record)
        before = (step.name, run)
    columns = ["step", "change", "valid", "valid change", "test", "test change", "against", "epochs", "fit min"]
    return pd.DataFrame.from_records(records).reindex(columns=columns).fillna("")


def moved_most(steps: pd.DataFrame) -> list[str]:
    """Which step moved validation and test perplexity most (the largest relative change, either way)."""
    lines = []
    for split in ("valid", "test"):
        changes = steps[steps[f"{split} change"] != ""]
        if changes.empty:
            lines.append(f"{split}: fewer than two steps have run, so no step's change is measured")
            continue
        sizes = changes[f"{split} change"].str.rstrip("%").astype(float).abs()
        top = changes.loc[sizes.idxmax()]
        lines.append(
            f"{split}: step {top['step']} ({top['change']}) moved perplexity most, "
            f"{top[f'{split} change']} against {top['against']}"
        )
    return lines


def targets(plan: Recipe, table: pd.DataFrame, history: dict[str, list[tuple[str, list[float]]]]) -> list[str]:
    """The target rows (MLP5, MLP9) with the paper's recipe against the paper's valid and test, within the declared
    margin or by how much they miss, and how their training ended: the validation curve's best epoch and its last
    epochs."""
    first = plan.steps[0]
    ours, paper = _rows(plan, table, first), paper_table(plan.paper).set_index("row")
    lines, within = [], plan.within
    for row in plan.targets:
        if row not in ours.index:
            lines.append(f"{row}, optim=paper: {_unfinished(plan, table, first, row)}")
            continue
        run = ours.loc[row]
        diffs = {s: run[f"{s}_ppl"] / paper.loc[row, f"paper_{s}_ppl"] - 1 for s in ("valid", "test")}
        numbers = ", ".join(
            f"{s} {run[f'{s}_ppl']:.1f} (paper {paper.loc[row, f'paper_{s}_ppl']:g}, {pct(d)})"
            for s, d in diffs.items()
        )
        missed = [f"{s} by {abs(d) - within:.1%} beyond the {within:.0%}" for s, d in diffs.items() if abs(d) > within]
        verdict = f"misses on {' and '.join(missed)}" if missed else f"within {within:.0%} on both"
        lines.append(f"{row}, optim=paper: {numbers}: {verdict}; {_ending(run, history.get(run['label'], []))}")
    return lines


def _ratio(rows: pd.DataFrame | pd.Series, of: str = "") -> pd.Series | float:
    """Test over valid perplexity of rows (of="paper_": the paper's)."""
    return rows[f"{of}test_ppl"] / rows[f"{of}valid_ppl"]


def test_over_valid(plan: Recipe, table: pd.DataFrame, table1: pd.DataFrame | None) -> str:
    """Test over valid perplexity, ours and the paper's, of the paper-recipe MLPs and of `against`'s counted rows
    (n-gram, which no training recipe changes): how our test split relates to our valid split whatever the model,
    the yardstick for a target missed on test alone."""
    ours, paper = _rows(plan, table, plan.steps[0]), paper_table(plan.paper).set_index("row")
    mlps = [
        f"{row} {_ratio(ours.loc[row]):.3f} (paper {_ratio(paper.loc[row], 'paper_'):.3f})"
        for row in plan.targets
        if row in ours.index
    ]
    line = f"Test over valid perplexity, optim=paper: {', '.join(mlps) or 'not run'}"
    counted = None if table1 is None else finished_rows(table1, "counted")
    if counted is None or counted.empty:
        return f"{line}; no counted n-gram row of {plan.against} in this store to compare with"
    mine, theirs = _ratio(counted).mean(), _ratio(counted, "paper_").mean()
    return (
        f"{line}; {plan.against}'s n-gram rows, which no recipe changes: {mine:.3f} (paper {theirs:.3f}, mean of "
        f"{len(counted)} rows): their test too sits {1 - mine / theirs:.1%} lower against valid here than in the paper"
    )


def _ending(run: pd.Series, seeds: list[tuple[str, list[float]]]) -> str:
    """How a run's training ended, from its validation curve and its epoch limit."""
    limit = json.loads(run["config"]).get("trainer.max_epochs", "")
    curve = next((values for _, values in seeds if values), [])
    if not curve:
        return f"{_epochs(run) or '?'} epochs (no validation curve recorded)"
    best = int(np.argmin(curve)) + 1
    how = "the epoch limit" if str(len(curve)) == limit else "early stopping"
    last = ", ".join(f"{v:.1f}" for v in curve[-4:])
    return f"{len(curve)} epochs, ended by {how} (trainer.max_epochs={limit}), best at epoch {best}; last epochs {last}"


def claims(plan: Recipe, source: ArchiveSource, table: pd.DataFrame, table1: pd.DataFrame | None) -> list[Claim]:
    """The claims of study `against` (Table 1's) with the MLP rows taken from the paper-recipe runs only (the other
    MLP rows are not measured with that recipe) and the n-gram rows from `against`'s (no recipe: they are
    counted)."""
    ours = _rows(plan, table, plan.steps[0])
    counted = table1[table1["kind"] == "counted"].set_index("label") if table1 is not None else pd.DataFrame()
    rows = []
    for _, paper in paper_table(plan.paper).iterrows():
        name = label(paper)
        row = {"label": name, "family": paper["family"], "status": "missing", "valid_ppl": np.nan, "test_ppl": np.nan}
        row["run_ids"] = ""
        row |= {"paper_valid_ppl": paper["paper_valid_ppl"], "paper_test_ppl": paper["paper_test_ppl"]}
        if name in ours.index:  # the recipe's runs are MLPs: an n-gram row is never among them
            row |= ours.loc[name, ["status", "valid_ppl", "test_ppl", "run_ids"]].to_dict()
        elif name in counted.index:
            row |= counted.loc[name, ["status", "valid_ppl", "test_ppl", "run_ids"]].to_dict()
        rows.append(row)
    found = pd.DataFrame.from_records(rows)
    return check_claims(declaration(plan.against).get("claims") or [], found, Evidence.read(source, found))


@dataclass(frozen=True)
class Findings:
    """What a recipe study's report says beyond its table and the claims."""

    plan: Recipe
    fast_from: str
    beside: pd.DataFrame
    targets: list[str]  # the target rows, then test_over_valid
    ablation: pd.DataFrame
    moved: list[str]
    paper_valid: dict[str, float]  # the paper's validation perplexity of the target rows, for the curves' figure

    @property
    def claims_note(self) -> str:
        """What the claims were checked on."""
        return (
            f"Checked on the paper-recipe rows (optim=paper: {', '.join(self.plan.rows)}; the other MLP rows are not "
            f"measured with that recipe) and on {self.plan.against}'s n-gram rows in this store, which no recipe "
            "changes."
        )


def findings(
    plan: Recipe, table: pd.DataFrame, table1: pd.DataFrame | None, history: dict[str, list[tuple[str, list[float]]]]
) -> Findings:
    """The paper-recipe rows beside the paper and optim=fast, the targets, and the ablation with its largest step."""
    if table1 is None:
        fast_from = (
            f"optim=fast rows: absent, this store has no finished {plan.against} run of this data; run "
            f"`nplm-train -m study={plan.against} data.path=...` into it and rebuild this report."
        )
    else:
        fast_from = (
            f"optim=fast rows: {plan.against}'s in this store (same data fingerprint, exact softmax), mean over its "
            "seeds; its n-gram rows serve the claims."
        )
    steps = ablation(plan, table)
    paper = paper_table(plan.paper).set_index("row")["paper_valid_ppl"]
    paper_valid = {row: float(paper[row]) for row in plan.targets}
    aims = [*targets(plan, table, history), test_over_valid(plan, table, table1)]
    return Findings(plan, fast_from, beside(plan, table, table1), aims, steps, moved_most(steps), paper_valid)
