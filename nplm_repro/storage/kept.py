"""A run's kept scores in the store (artifact scores.npz, nplm_repro/scores.py): read and attached. Torch-free: the
report reads them."""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException

from nplm_repro.errors import NplmError
from nplm_repro.scores import ARTIFACT, Scores
from nplm_repro.storage.redaction import redact
from nplm_repro.storage.store import store_error


def artifacts(client: mlflow.MlflowClient, run_id: str, folder: str = "") -> set[str]:
    """The paths of a run's artifacts in `folder`; a store that does not answer is an error of its own."""
    try:
        return {f.path for f in client.list_artifacts(run_id, folder or None)}
    except MlflowException as error:
        raise NplmError(f"the store did not list the artifacts of run {run_id}: {redact(store_error(error))}") from None


def download(client: mlflow.MlflowClient, run_id: str, path: str, into: str) -> str:
    try:
        return client.download_artifacts(run_id, path, into)
    except (MlflowException, OSError) as error:
        raise NplmError(f"the store did not give {path} of run {run_id}: {redact(store_error(error))}") from None


def kept_scores(client: mlflow.MlflowClient, run_id: str) -> Scores | None:
    """The run's kept scores (artifact scores.npz), or None when it kept none (made before runs kept them)."""
    if ARTIFACT not in artifacts(client, run_id):
        return None
    with tempfile.TemporaryDirectory() as into:
        try:
            return Scores.load(download(client, run_id, ARTIFACT, into))
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as error:
            raise NplmError(
                f"the kept scores of run {run_id} ({ARTIFACT}) are unreadable ({type(error).__name__}: {error}): "
                "delete that artifact and they are scored again from the run's checkpoint"
            ) from None


def log_scores(client: mlflow.MlflowClient, run_id: str, scores: Scores) -> None:
    """Attach `scores` to the run as its artifact scores.npz."""
    with tempfile.TemporaryDirectory() as folder:
        client.log_artifact(run_id, str(scores.save(Path(folder) / ARTIFACT)))
