"""A study's runs as plain text beside its report (`reports/<study>.runs.jsonl`): what the report was built from, so
that it is rebuilt, re-checked and extended on any machine with no store (docs/archive.md gives the format).

JSON Lines, UTF-8: the first line is the study's header (its name, experiment and the names of the corpus's texts,
once), then one run per line, sorted by run id, each with sorted keys: a git diff shows what a new run changed.
A run holds its info (id, name, status, start and end), params, tags, its configuration (config.yaml), final metrics,
the per-epoch history of every metric (not the per-step ones, nor MLflow's system metrics, nor a sweep parent's), per text of valid and test the sum of its tokens'
log-probabilities and its token count, and for a trained model what its word-feature figure draws. No weights.

Read and written here: `export` (a store's runs as archive records) and `Archive` (the file, read and checked: one
line naming the file and line for anything malformed); storage/importing.py puts the records into a store. `ArchiveSource` is what a report reads: a report of a store's runs is built from
their archive too, so a report and its archive never disagree. Torch-free: the report reads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException

from nplm_repro.errors import NplmError
from nplm_repro.scores import ARTIFACT, KEPT_SPLITS
from nplm_repro.storage.kept import artifacts, download, kept_scores
from nplm_repro.storage.redaction import redact
from nplm_repro.storage.store import store_error

FORMAT, VERSION = "nplm-repro runs", 1
SUFFIX = ".runs.jsonl"
ARCHIVED_ID = "archive.run_id"  # an imported run's tag: its id in the archive (and in the store that made it)
ARCHIVED_FROM = "archive.file"  # an imported run's tag: the archive it came from
TEXT_SUMS = "text_sums.json"  # an imported run's artifact: its per-text sums, as the archive has them
# Tags whose values are run ids: mapped to the store's ids on import, back to the archive's on export
ID_TAGS = ("mlflow.parentRunId", "base_run_id", "adopted_from")
# Tags not about the run: a store's logged-model history (it grows with every Model), the folder of the machine a
# sweep last ran on (it changes with every resumption, on every machine)
STORE_TAGS = ("mlflow.log-model.history", "sweep_dir")
CONFIG = "config.yaml"  # a run's artifact: its whole configuration, resolved, as the job composed it
FEATURES = "features"  # a trained run's artifact folder (serving/features.py)
FEATURE_FILES = ("neighbours.md", "sentences.md", "map.json")
TERMINAL = ("FINISHED", "FAILED", "KILLED")  # a running run is archived once it ends


def path_of(report_dir: Path, study: str) -> Path:
    """Where the archive of `study`'s report in `report_dir` is."""
    return Path(report_dir) / f"{study}{SUFFIX}"


def per_epoch(name: str) -> bool:
    """Whether the archive keeps this metric's history: not MLflow's system metrics, not a per-step value
    (`*_step`, Lightning's `epoch` counter logged at every step); its final value is kept either way."""
    return not name.startswith("system/") and not name.endswith("_step") and name != "epoch"


def _number(value: float) -> float | str:
    """A metric as JSON has it: a finite float as itself, else 'nan', 'inf' or '-inf' (JSON has no NaN)."""
    return value if math.isfinite(value) else str(value)


def metric_value(value: Any) -> float:
    """A metric as the archive has it (a number, or 'nan', 'inf', '-inf') as a float."""
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"{value!r} is not a number")


def code_fingerprint(commit: str, diff: str) -> str:
    """The code that ran, in 16 hex digits: its commit and its uncommitted changes (git_diff.patch) together."""
    return hashlib.sha256(f"{commit}\n{diff}".encode()).hexdigest()[:16]


# --- from a store --------------------------------------------------------------------------------------------------


def _text_sums(client: mlflow.MlflowClient, run_id: str, names: list[str]) -> dict[str, list[list[float]]] | None:
    """Per kept split, [text index into `names`, sum of ln P, tokens] of each text present: from the run's kept
    scores (scores.npz), else from the sums an import left (text_sums.json), else None."""
    present = artifacts(client, run_id)
    if ARTIFACT in present:
        scores = kept_scores(client, run_id)
        index = _indexer(names, scores.texts)
        sums = {}
        for split in KEPT_SPLITS:
            if split in scores.splits:
                kept = scores.splits[split]
                logprob, tokens = kept.by_text(len(scores.texts))
                sums[split] = [
                    [index[t], float(logprob[t]), int(tokens[t])] for t in np.unique(kept.text).tolist()
                ]
        return sums
    if TEXT_SUMS in present:
        with tempfile.TemporaryDirectory() as into:
            found = json.loads(Path(download(client, run_id, TEXT_SUMS, into)).read_text(encoding="utf-8"))
        index = _indexer(names, tuple(found["texts"]))
        return {s: [[index[int(t)], float(lp), int(n)] for t, lp, n in rows] for s, rows in found["scores"].items()}
    return None


def _indexer(names: list[str], texts: tuple[str, ...]) -> dict[int, int]:
    """A run's text indices as indices into the study's `names`, which grow by any text first seen here."""
    known = {name: i for i, name in enumerate(names)}
    for text in texts:
        if text not in known:
            known[text] = len(names)
            names.append(text)
    return {i: known[text] for i, text in enumerate(texts)}


def _artifact_text(client: mlflow.MlflowClient, run_id: str, name: str) -> str | None:
    """A text artifact of the run, or None if it has none of that name."""
    if name not in artifacts(client, run_id):
        return None
    with tempfile.TemporaryDirectory() as into:
        return Path(download(client, run_id, name, into)).read_text(encoding="utf-8")


def _features(client: mlflow.MlflowClient, run_id: str) -> dict[str, Any] | None:
    """What a trained run's word-feature figure and lists show (features/: neighbours, sentences, the map's points),
    or None for a run that has not all of them."""
    if not set(f"{FEATURES}/{name}" for name in FEATURE_FILES) <= artifacts(client, run_id, FEATURES):
        return None
    with tempfile.TemporaryDirectory() as into:
        folder = Path(download(client, run_id, FEATURES, into))
        lists = {
            name.removesuffix(".md"): [
                line[2:] for line in (folder / name).read_text(encoding="utf-8").splitlines() if line.startswith("- ")
            ]
            for name in ("neighbours.md", "sentences.md")
        }
        return lists | {"map": json.loads((folder / "map.json").read_text(encoding="utf-8"))}


def export(uri: str, run_ids: Iterable[str], names: list[str]) -> list[dict[str, Any]]:
    """The archive's records of these runs of the store at `uri` (and of the sweeps' parent runs they name), each run
    under its archived id (an imported run's `archive.run_id`, else its own), run ids in its tags mapped alike.
    `names`: the study's text names, extended by any text a run's scores name first."""
    client = mlflow.MlflowClient(uri)
    try:
        runs = {run_id: client.get_run(run_id) for run_id in run_ids}
        parents = {r.data.tags.get("mlflow.parentRunId") for r in runs.values()} - set(runs) - {None}
        for parent in sorted(parents):
            try:
                runs[parent] = client.get_run(parent)
            except MlflowException:  # a parent deleted from the store: its children are archived without it
                continue
        ids = {run_id: run.data.tags.get(ARCHIVED_ID, run_id) for run_id, run in runs.items()}
        records = [_record(client, run, ids, names) for run in runs.values()]
        for record in records:  # an adopted run's curve is timed from the start of the run that trained it
            source = record["tags"].get("adopted_from")
            if source and source not in ids.values():
                with contextlib.suppress(MlflowException):
                    record["adopted_start"] = client.get_run(_store_id(client, runs, source)).info.start_time
        return records
    except MlflowException as error:
        raise NplmError(f"the store did not give the runs to archive: {redact(store_error(error))}") from None


def _store_id(client: mlflow.MlflowClient, runs: dict[str, mlflow.entities.Run], archived: str) -> str:
    """The store's id of a run named by its archived id (an adopted run's source, mapped on export)."""
    return next((i for i, r in runs.items() if r.data.tags.get(ARCHIVED_ID) == archived), archived)


def _record(client: mlflow.MlflowClient, run: mlflow.entities.Run, ids: dict[str, str], names: list[str]) -> dict:
    run_id, info = run.info.run_id, run.info
    tags = {
        k: (",".join(ids.get(i, i) for i in v.split(",")) if k in ID_TAGS else v)
        for k, v in run.data.tags.items()
        if k not in STORE_TAGS and k not in (ARCHIVED_ID, ARCHIVED_FROM)
    }
    history, parent = {}, run.data.tags.get("sweep") == "true"
    for name in sorted(run.data.metrics):
        if per_epoch(name) and not parent:  # a sweep's parent logs its report's headline numbers, no epochs
            points = sorted(client.get_metric_history(run_id, name), key=lambda m: (m.step, m.timestamp))
            history[name] = [[m.step, m.timestamp, _number(m.value)] for m in points]
    record = {
        "run_id": ids[run_id],
        "name": info.run_name or "",
        "status": info.status,
        "start_time": info.start_time,
        "end_time": info.end_time,
        "params": dict(run.data.params),
        "tags": tags,
        "metrics": {k: _number(v) for k, v in run.data.metrics.items()},
        "history": history,
    }
    if not parent:  # a sweep's parent has no configuration, scores or features
        config = _artifact_text(client, run_id, CONFIG)
        if config is not None:
            record["config"] = config
        sums = _text_sums(client, run_id, names)
        if sums is not None:
            record["scores"] = sums
        features = _features(client, run_id)
        if features is not None:
            record["features"] = features
    return record


# --- the file ------------------------------------------------------------------------------------------------------


def dumps(record: dict[str, Any]) -> str:
    """One line of the archive: sorted keys, UTF-8 as itself, no spaces."""
    return json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass
class Archive:
    """A study's archived runs: its header (study, experiment, the texts' names) and its runs by archived id."""

    study: str
    experiment: str
    fingerprint: str  # the data the study's report is of (tracking/runs.py `choose_fingerprint`)
    texts: list[str] = field(default_factory=list)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        header = {"format": FORMAT, "version": VERSION, "study": self.study, "experiment": self.experiment}
        header |= {"fingerprint": self.fingerprint, "texts": self.texts}
        return [dumps(header)] + [dumps(self.runs[i]) for i in sorted(self.runs)]

    def add(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            self.runs[record["run_id"]] = record

    def write(self, path: Path) -> Path:
        """Write it whole or not at all (a temporary file beside it, renamed over it)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text("\n".join(self.lines()) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, path: Path) -> Archive:
        """The archive at `path`; NplmError naming the file and line of anything malformed."""
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise NplmError(f"{path}: not a readable archive of runs ({type(error).__name__}: {error})") from None
        if not lines:
            raise NplmError(f"{path}:1: empty: an archive of runs starts with its header line")
        header = _line(path, 1, lines[0], HEADER)
        if header.get("format") != FORMAT or header.get("version") != VERSION:
            raise NplmError(f"{path}:1: not an archive of runs (format {FORMAT!r}, version {VERSION} expected)")
        archive = cls(header["study"], header["experiment"], header["fingerprint"], list(header["texts"]))
        for number, text in enumerate(lines[1:], start=2):
            record = _line(path, number, text, RUN)
            _check_run(path, number, record, len(archive.texts))
            if record["run_id"] in archive.runs:
                raise NplmError(f"{path}:{number}: run {record['run_id']} is archived twice")
            archive.runs[record["run_id"]] = record
        return archive

    def frame(self, experiment: str) -> pd.DataFrame:
        """Its runs as `mlflow.search_runs` gives a store's: one row each, newest first; empty for another experiment."""
        if experiment != self.experiment:
            return pd.DataFrame()
        rows = []
        for record in self.runs.values():
            row = {
                "run_id": record["run_id"],
                "experiment_id": "0",
                "status": record["status"],
                "artifact_uri": "",
                "start_time": record["start_time"],
                "end_time": record["end_time"],
            }
            row |= {f"metrics.{k}": metric_value(v) for k, v in record["metrics"].items()}
            row |= {f"params.{k}": v for k, v in record["params"].items()}
            row |= {f"tags.{k}": v for k, v in record["tags"].items()}
            rows.append(row)
        frame = pd.DataFrame.from_records(rows)
        for column in ("start_time", "end_time"):
            frame[column] = pd.to_datetime(frame[column], unit="ms", utc=True)
        frame = frame.sort_values(["start_time", "run_id"], ascending=[False, True], kind="stable")
        return frame.reset_index(drop=True)


HEADER = {"format": str, "version": int, "study": str, "experiment": str, "fingerprint": str, "texts": list}
RUN = {
    "run_id": str,
    "name": str,
    "status": str,
    "start_time": int,
    "params": dict,
    "tags": dict,
    "metrics": dict,
    "history": dict,
}


def _line(path: Path, number: int, text: str, fields: dict[str, type]) -> dict[str, Any]:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise NplmError(f"{path}:{number}: not JSON ({error.msg} at column {error.colno}): truncated or edited") from None
    if not isinstance(record, dict):
        raise NplmError(f"{path}:{number}: not a JSON object")
    for name, kind in fields.items():
        if not isinstance(record.get(name), kind) or isinstance(record.get(name), bool):
            raise NplmError(f"{path}:{number}: field {name!r} missing or not a {kind.__name__}")
    return record


def _check_run(path: Path, number: int, record: dict[str, Any], texts: int) -> None:
    """The values a reader does arithmetic on are numbers, each text index one of the header's."""
    where = f"{path}:{number}: run {record['run_id']}"
    if record["status"] not in TERMINAL and record.get("tags", {}).get("sweep") != "true":
        raise NplmError(f"{where}: status {record['status']!r} is not one an archived run ends in")
    if not all(isinstance(v, str) for v in (*record["params"].values(), *record["tags"].values())):
        raise NplmError(f"{where}: params and tags are strings")
    try:
        for value in record["metrics"].values():
            metric_value(value)
        for name, points in record["history"].items():
            for step, timestamp, value in points:
                int(step), int(timestamp), metric_value(value)
        for split, rows in record.get("scores", {}).items():
            for text, logprob, tokens in rows:
                if not (isinstance(text, int) and 0 <= text < texts):
                    raise ValueError(f"text {text!r} of {split} is not one of the header's {texts} texts")
                metric_value(logprob), int(tokens)
    except (TypeError, ValueError) as error:
        raise NplmError(f"{where}: {error}") from None


# --- what a report reads -------------------------------------------------------------------------------------------


class ArchiveSource:
    """What a report reads of runs (every run of the experiment as `mlflow.search_runs` gives them, a metric's
    points, per-text sums, word features, start times), from an archive alone."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive

    def frame(self, experiment: str) -> pd.DataFrame:
        return self.archive.frame(experiment)

    def history(self, run_id: str, metric: str) -> list[tuple[int, int, float]]:
        points = self.archive.runs[run_id]["history"].get(metric, [])
        return [(int(s), int(t), metric_value(v)) for s, t, v in points]

    def text_sums(self, run_id: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        scores = self.archive.runs[run_id].get("scores")
        if scores is None:
            return None
        found = {}
        for split, rows in scores.items():
            table = sorted(rows)
            found[split] = (
                np.array([r[0] for r in table], dtype=np.int64),
                np.array([metric_value(r[1]) for r in table], dtype=np.float64),
                np.array([r[2] for r in table], dtype=np.float64),
            )
        return found

    def features(self, run_id: str) -> dict[str, Any] | None:
        return self.archive.runs[run_id].get("features")

    def start_time(self, run_id: str) -> float | None:
        """When the run started (ms): an archived run's own start, else that of the run an archived run was adopted
        from (`adopted_start`); None if neither is known."""
        record = self.archive.runs.get(run_id)
        if record is not None:
            return record["start_time"]
        adopted = (r for r in self.archive.runs.values() if r["tags"].get("adopted_from") == run_id)
        return next((r["adopted_start"] for r in adopted if "adopted_start" in r), None)
