"""A study's archived runs into a tracking store (`nplm-import`), each once, by its archived id: what the store holds
of an archive, and what stops an import (another run of an archived run's job) before anything is written."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param

from nplm_repro.storage.archive import (
    ARCHIVED_FROM,
    ARCHIVED_ID,
    CONFIG,
    FEATURES,
    ID_TAGS,
    TEXT_SUMS,
    Archive,
    metric_value,
)
from nplm_repro.storage.finding import search
from nplm_repro.storage.store import ensure_experiment


@dataclass(frozen=True)
class Imported:
    """What an import did: runs added, and runs the store already had (by archived id)."""

    added: list[str]
    present: list[str]


def held_runs(uri: str, experiment: str) -> set[str]:
    """The archived ids of the runs the store holds: what a report it builds may replace (tracking/archived.py)."""
    return set(imported_ids(uri, experiment))


def imported_ids(uri: str, experiment: str) -> dict[str, str]:
    """The runs of the store's experiment by archived id: an imported run's `archive.run_id`, else its own id."""
    return {run.data.tags.get(ARCHIVED_ID, run.info.run_id): run.info.run_id for run in search(uri, experiment)}


def conflicts(archive: Archive, uri: str, experiment: str, present: dict[str, str]) -> str | None:
    """Why the store cannot take this archive: a run with an archived run's config_key but another id (a different
    run of the same job), or None."""
    for record in archive.runs.values():
        key = record["tags"].get("config_key")
        if not key or record["run_id"] in present or record["status"] != "FINISHED":
            continue
        for run in search(uri, experiment, f"tags.config_key = '{key}'", "attributes.status = 'FINISHED'"):
            mine = run.data.tags.get(ARCHIVED_ID, run.info.run_id)
            if mine != record["run_id"]:
                return (
                    f"the store already has run {run.info.run_id} of config_key {key} (row "
                    f"{record['tags'].get('row', '?')}, seed {record['params'].get('seed', '?')}), a different run "
                    f"from archived run {record['run_id']}: import into another store, or delete that run"
                )
    return None


def import_archive(archive: Archive, path: Path, uri: str) -> Imported:
    """Each archived run the store lacks as a new run of the archive's experiment: its name, status, times, params,
    tags (run ids mapped to the store's), every metric point, its per-text sums (artifact text_sums.json) and its
    word-feature files (features/), tagged `archive.run_id` and `archive.file`. Parents first, so that children
    nest under them in the dashboard. The caller has checked `conflicts`."""
    client = mlflow.MlflowClient(uri)
    experiment_id = ensure_experiment(client, archive.experiment)
    ids = imported_ids(uri, archive.experiment)
    present = [i for i in sorted(archive.runs) if i in ids]
    added = []
    parents = {r["tags"].get("mlflow.parentRunId") for r in archive.runs.values()}
    for record in sorted(archive.runs.values(), key=lambda r: (r["run_id"] not in parents, r["start_time"])):
        if record["run_id"] in ids:
            continue
        ids[record["run_id"]] = _create(client, experiment_id, archive, path, record, ids)
        added.append(record["run_id"])
    return Imported(added, present)


def _create(
    client: mlflow.MlflowClient, experiment_id: str, archive: Archive, path: Path, record: dict, ids: dict[str, str]
) -> str:
    tags = {
        k: (",".join(ids.get(i, i) for i in v.split(",")) if k in ID_TAGS else v) for k, v in record["tags"].items()
    }
    tags |= {ARCHIVED_ID: record["run_id"], ARCHIVED_FROM: path.name}
    run = client.create_run(experiment_id, start_time=record["start_time"], tags=tags, run_name=record["name"])
    run_id = run.info.run_id
    try:
        params = [Param(k, v) for k, v in record["params"].items()]
        points = [
            Metric(name, metric_value(value), int(timestamp), int(step))
            for name, history in record["history"].items()
            for step, timestamp, value in history
        ]
        finals = {
            name: Metric(name, metric_value(value), int(record.get("end_time") or record["start_time"]), 0)
            for name, value in record["metrics"].items()
            if name not in record["history"]
        }
        for start in range(0, max(len(params), 1), 100):  # MLflow takes at most 100 params a batch
            client.log_batch(run_id, params=params[start : start + 100])
        points += finals.values()
        for start in range(0, len(points), 1000):
            client.log_batch(run_id, metrics=points[start : start + 1000])
        if "config" in record:
            client.log_text(run_id, record["config"], CONFIG)
        if "scores" in record:
            sums = {"texts": archive.texts, "scores": record["scores"]}
            client.log_dict(run_id, sums, TEXT_SUMS)
        if "features" in record:
            _log_features(client, run_id, record["features"])
        client.set_terminated(run_id, record["status"], end_time=record.get("end_time"))
    except BaseException:
        client.delete_run(run_id)  # nothing half-imported: a second import tries it again
        raise
    return run_id


def _log_features(client: mlflow.MlflowClient, run_id: str, features: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in ("neighbours", "sentences"):
            said = "\n".join(f"- {line}" for line in features[name])
            (folder / f"{name}.md").write_text(f"# {name} (imported from an archive)\n\n{said}\n", encoding="utf-8")
        (folder / "map.json").write_text(json.dumps(features["map"], sort_keys=True), encoding="utf-8")
        client.log_artifacts(run_id, str(folder), FEATURES)
