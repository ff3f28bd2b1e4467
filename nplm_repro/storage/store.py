"""MLflow stores: which URI is a SQLite file, checking a store before any work, opening it (under locks.py's
`store_lock`), repairing an interrupted upgrade, experiments of the right kind, a store's error in one line.

A URI is masked in every message here by redaction.py's `redact`, the one home of redaction."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import mlflow
import requests
from mlflow.store.db.db_types import DATABASE_ENGINES
from mlflow.tracking._tracking_service.utils import _tracking_store_registry  # the schemes MLflow can open
from sqlalchemy import create_engine
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from nplm_repro.errors import NplmError
from nplm_repro.storage.locks import store_lock
from nplm_repro.storage.redaction import redact

log = logging.getLogger(__name__)

# MLflow 3's kind of an experiment, GenAI or model training (custom_model_development): ours train models
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def sqlite_file(uri: str) -> Path | None:
    """The database file of an embedded SQLite store URI, else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?")[0]
    return Path(path) if path not in ("", ":memory:") else None


def repair_interrupted_upgrade(path: Path) -> None:
    """Finish what an interrupted MLflow schema upgrade left in a SQLite store, or refuse it in one line.

    Alembic changes a SQLite table by copying it into `_alembic_tmp_<table>`, dropping the table and renaming the
    copy. A process stopped in between (or two upgrading at once, before `store_lock`) leaves the copy behind,
    and every later upgrade fails on "table _alembic_tmp_<table> already exists". While `<table>` still exists
    the copy holds nothing it lacks: it is dropped and the upgrade runs again. Without `<table>`, the copy has
    the only rows: nothing is changed, and the error says how to put it back.
    """
    if not path.is_file():
        return
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        copies = sorted(name for name in tables if name.startswith("_alembic_tmp_"))
        for copy in copies:
            table = copy.removeprefix("_alembic_tmp_")
            if table not in tables:
                raise NplmError(
                    f"tracking store {path} was left mid-upgrade by MLflow: table {table} exists only as {copy}; "
                    f"back up the file, run sqlite3 {path} 'ALTER TABLE {copy} RENAME TO {table}', then run again"
                )
        for copy in copies:
            db.execute(f'DROP TABLE "{copy}"')
            log.warning("tracking store %s: dropped %s, left by an interrupted MLflow upgrade", path, copy)


def ensure_experiment(client: mlflow.MlflowClient, name: str) -> str:
    """The id of experiment `name`, created if missing (another process creating it at the same moment is fine),
    tagged as MLflow 3 tells a model-training experiment from a GenAI one (EXPERIMENT_KIND)."""
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name, tags=EXPERIMENT_KIND)
        except mlflow.exceptions.MlflowException:
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    for key, value in EXPERIMENT_KIND.items():
        if key not in found.tags:  # one made before, or by another tool: a kind already chosen is kept
            client.set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


def store_error(error: Exception) -> str:
    """What went wrong in a store, in one line: the database's own message where MLflow and SQLAlchemy wrap it
    ("(sqlite3.OperationalError) attempt to write a readonly database"), else the error's first line."""
    text = str(error).strip()
    found = re.findall(r"\((?:\w+\.)*\w+(?:Error|Exception)\) [^\n]+", text)
    return found[-1] if found else (text.splitlines() or [type(error).__name__])[0]


def reach_store(uri: str) -> None:
    """The checks of a store that write nothing, in one line each, made before a corpus is read: an HTTP store
    must answer /health within 10 s (MLflow's client would retry for minutes), a scheme must be one MLflow
    knows, a SQLite URI must name a file (an in-memory store would lose the run), a new SQLite file goes only into
    a folder that exists (a mistyped path must not start a store in a new folder), and a database must answer at
    once (`reach_database`)."""
    if uri.startswith(("http://", "https://")):
        try:
            requests.get(uri.rstrip("/") + "/health", timeout=10).raise_for_status()
        except requests.RequestException as error:
            raise NplmError(
                f"tracking store {redact(uri)!r} is unreachable: {type(error).__name__} on /health"
            ) from None
    try:
        _tracking_store_registry.get_store_builder(uri)
    except Exception as error:  # noqa: BLE001  an unknown scheme; MLflow's message lists the known ones
        raise NplmError(f"tracking store {redact(uri)!r} is unusable: {redact(store_error(error))}") from None
    path = sqlite_file(uri)
    if uri.startswith("sqlite:") and path is None:
        raise NplmError(
            f"tracking store {redact(uri)!r} names no database file, so the run would be kept in memory and lost: "
            "write sqlite:///mlflow.db (a path relative to here) or sqlite:////absolute/path/mlflow.db"
        )
    if path is not None and path.is_dir():
        raise NplmError(
            f"tracking store {redact(uri)!r}: {path} is a folder, not a database file: name a file in it "
            f"(sqlite:///{path / 'mlflow.db'})"
        )
    if path is not None and not path.parent.is_dir():
        raise NplmError(
            f"tracking store {redact(uri)!r}: no folder {path.parent} (a new store's file is created, never its "
            "folder): create the folder, or correct the path"
        )
    reach_database(uri)


DATABASE_TIMEOUT = 10  # seconds to connect to a database store, as an HTTP store gets to answer /health


def reach_database(uri: str) -> None:
    """One connection to a database store (PostgreSQL, MySQL, SQL Server), within DATABASE_TIMEOUT seconds where
    its driver takes a timeout, or an existing SQLite file opened read-only: MLflow retries a store it cannot open
    ten times, a warning each, for about two minutes, and says only then that its driver is not installed."""
    path = sqlite_file(uri)
    if path is not None:
        if path.is_file():
            try:
                read_only = f"{path.resolve().as_uri()}?mode=ro"
                with contextlib.closing(sqlite3.connect(read_only, uri=True, timeout=DATABASE_TIMEOUT)) as db:
                    db.execute("SELECT count(*) FROM sqlite_master")
            except sqlite3.Error as error:
                raise NplmError(f"tracking store {redact(uri)!r} is unusable: {path}: {error}") from None
        return
    scheme = uri.partition(":")[0]
    if scheme.split("+")[0] not in DATABASE_ENGINES:
        return  # a server's (checked above) or MLflow's own files
    timeout = {"connect_timeout": DATABASE_TIMEOUT} if scheme.startswith(("postgresql", "mysql")) else {}
    try:
        engine = create_engine(uri, connect_args=timeout, poolclass=NullPool)
    except (ImportError, ArgumentError) as error:  # ArgumentError: a driver SQLAlchemy does not know
        raise NplmError(
            f"tracking store {redact(uri)!r}: cannot load the database driver of {scheme}:// "
            f"({redact(str(error))}): install it, or name an installed one in the URI's scheme"
        ) from None
    try:
        with engine.connect():
            pass
    except Exception as error:  # noqa: BLE001  each driver raises its own types; all mean the same here
        raise NplmError(f"tracking store {redact(uri)!r} is unreachable: {redact(store_error(error))}") from None
    finally:
        engine.dispose()


def check_store(uri: str, create: bool = True, experiment: str | None = None) -> None:
    """Fail at once, in one line, on a store that cannot be used (before a run is opened): `reach_store`, then
    `open_store`."""
    reach_store(uri)
    open_store(uri, create, experiment)


def open_store(uri: str, create: bool = True, experiment: str | None = None) -> None:
    """Open and list a store `reach_store` passed, in one line if it fails: an embedded SQLite one under
    `store_lock` and after `repair_interrupted_upgrade` (a new SQLite file is created, unless `create=False`);
    `experiment` is created in it if given and missing."""
    path = sqlite_file(uri)
    if create or path is not None:
        try:
            with store_lock(path) if path is not None else contextlib.nullcontext():  # a server serialises itself
                if path is not None:
                    repair_interrupted_upgrade(path)
                client = mlflow.MlflowClient(uri)
                client.search_experiments(max_results=1)
                if experiment:
                    ensure_experiment(client, experiment)
        except NplmError:
            raise
        except Exception as error:  # noqa: BLE001  MLflow raises many types for a bad store; all mean the same
            raise NplmError(f"tracking store {redact(uri)!r} is unusable: {redact(store_error(error))}") from None


@contextlib.contextmanager
def tracking_at(uri: str) -> Iterator[None]:
    """MLflow's global tracking URI set to `uri` for the block, then as it was (environment variable included)."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)


def existing_store(uri: str) -> None:
    """The store a reading command names exists and answers (an SQLite file is never created here)."""
    path = sqlite_file(uri)
    if path is not None and not path.is_file():
        raise NplmError(f"no tracking store at {path}: pass --tracking-uri")
    check_store(uri, create=False)
