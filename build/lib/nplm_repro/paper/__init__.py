"""What the paper says, as data: its tables (brown_table1.csv is Table 1, p. 1149; ap_table2.csv is Table 2,
p. 1150), their columns and row names, and the corpora they were measured on (§4, p. 1147).

Nothing here reads our runs: the report sets these facts beside them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from importlib import resources

import pandas as pd

COLUMNS = ("n", "c", "h", "m", "direct", "mix")  # the columns of Tables 1 and 2 that say what a row's model is
# The paper's model in the knobs its tables have no column for: a configuration with another value is named after
# the row its columns match, but the paper has no number for it (fixed word features, say)
PAPER_SETUP = {"model.features": "learned", "model.output": "standard"}
# The paper's tables (their copies here, <table>.csv) and the corpus each was measured on. A study declares the table
# its rows fill (`reporting.paper`); runs with a table's row tag but no study tag count in the study of its name.
PAPER_TABLES = {"brown_table1": "brown", "ap_table2": "ap"}
PAPER_TITLES = {"brown_table1": "Table 1 (Brown corpus)", "ap_table2": "Table 2 (AP News)"}
PAPER_CORPORA = {"brown": "Brown", "ap": "AP News 1995-96"}  # what the paper's numbers were measured on
PAPER_DATA = {  # §4, p. 1147: |V| and split sizes
    "brown": {"vocab_size": 16_383, "train": 800_000, "valid": 200_000, "test": 181_041},
    "ap": {"vocab_size": 17_964, "train": 13_994_528, "valid": 963_138, "test": 963_071},
}
ROW_NAMES = {"Back-off KN": "Kneser-Ney back-off"}  # Table 2's name for Table 1's row
# the families of eq. (1) and of the interpolated trigram, the two the paper's headline margins compare
PAPER_MODEL, PAPER_TRIGRAM = "mlp", "deleted_interpolation"
FAMILY_NAMES = {  # the tables' names of the model families, in the order of Table 1
    "mlp": "MLP",
    "deleted_interpolation": "Del. Int.",
    "kneser_ney": "Kneser-Ney back-off",
    "class_based": "class-based back-off",
}


def paper_table(study: str) -> pd.DataFrame:
    """The paper's table for `study` (a copy kept in this package), in the paper's order, with the row's family.

    The CSV is read once a process; each call returns its own copy, which the caller may change (add a column, say)."""
    return _read_table(study).copy()


@functools.cache
def _read_table(study: str) -> pd.DataFrame:
    """The table `paper_table` copies, read once: nobody changes this one."""
    with resources.files(__name__).joinpath(f"{study}.csv").open() as f:
        paper = pd.read_csv(f, dtype=str, keep_default_na=False)
    paper = paper.rename(columns={"name": "row", "model": "family"})
    paper["row"] = paper["row"].replace(ROW_NAMES)
    for column in [c for c in paper.columns if c.endswith("_ppl")]:  # train, valid, test
        paper[f"paper_{column}"] = pd.to_numeric(paper.pop(column)).astype(float)
    return paper


@functools.cache
def paper_row_names() -> frozenset[str]:
    """Every row name of the paper's tables (MLP1 ... MLP10, Del. Int., ...)."""
    return frozenset(name for study in PAPER_TABLES for name in _read_table(study)["row"])


def own_name(row_tag: str) -> str | None:
    """The name a configuration of a paper family that is no row of the paper goes by: its row tag when the tag is a
    name of its own (`MLP searched`), None when the tag is a paper row's (an MLP1 with direct=no is no longer MLP1:
    it is named by its columns, `MLP n=5 h=50 ...`)."""
    return row_tag if row_tag and row_tag not in paper_row_names() else None


def row_key(family: str, values: pd.Series | Mapping[str, object]) -> tuple[str, ...]:
    """What makes a model one row of the paper's tables: its family and its columns."""
    return (family, *(str(values[c]) for c in COLUMNS))


def label(row: pd.Series | Mapping[str, object], extra: Sequence[str] = ()) -> str:
    """How text names a row: MLP5, Del. Int., Kneser-Ney back-off n=4, class-based back-off n=3 c=500; rows that
    are no paper row by their columns (MLP n=5 h=50 ...), and by the `extra` keys that tell configurations apart."""
    name = str(row["row"])
    if name == "MLP":
        knobs = [c for c in COLUMNS if row[c] != ""]
    elif name.startswith("MLP") or name == "Del. Int.":
        knobs = []
    else:
        knobs = ["n", "c"] if row["c"] else ["n"]
    return " ".join([name, *(f"{k}={row[k]}" for k in (*knobs, *extra) if row[k] != "")])
