"""Finding runs in the store: one `search` of an experiment's runs, newest first, for each look-up."""

from __future__ import annotations

import mlflow
from mlflow.entities import Run

NEWEST_FIRST = ["attributes.start_time DESC"]


def search(uri: str, experiment: str, *conditions: str, max_results: int = 1000) -> list[Run]:
    """The runs of `experiment` that meet every condition (MLflow's filter syntax), newest first; none if the
    experiment does not exist (yet)."""
    client = mlflow.MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    query = " and ".join(conditions)
    return list(client.search_runs([found.experiment_id], query, max_results=max_results, order_by=NEWEST_FIRST))


def find_finished(uri: str, experiment: str, **tags: str) -> str | None:
    """The newest FINISHED run of the experiment with these tag values, or None."""
    conditions = [f"tags.{k} = '{v}'" for k, v in tags.items()]
    runs = search(uri, experiment, *conditions, "attributes.status = 'FINISHED'", max_results=1)
    return runs[0].info.run_id if runs else None
