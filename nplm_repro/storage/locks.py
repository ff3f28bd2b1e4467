"""File locks that let any number of commands share a store and a cache.

`store_lock`: held while MLflow opens (creates, migrates) an embedded SQLite store.
`model_lock`: two jobs of the same trained model (one model_key) in two studies may run at the same time; whichever
comes second waits for the first to finish training, then adopts its run instead of training the same model again.
`config_lock`: held by the job recording a run of a config_key, so a RUNNING run of that key found by the
lock's holder has lost its process (kill -9, out of memory, a lost machine).
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from nplm_repro.cache import cache_dir
from nplm_repro.errors import NplmError
from nplm_repro.migrations import MODEL_LOCK
from nplm_repro.progress import report_status

log = logging.getLogger(__name__)

STORE_LOCK_WAIT = 600.0  # seconds: opening a store takes seconds, so a holder this long is another command's
# Why a lock file cannot be created where the store's folder is read-only to us: then no command of ours can create
# or upgrade the store there either, so the lock has no race to prevent
CANNOT_WRITE = {errno.EROFS, errno.EACCES, errno.EPERM}


@contextlib.contextmanager
def store_lock(path: Path) -> Iterator[None]:
    """Hold `<path>.lock` beside `path`, an embedded SQLite store's database file, while MLflow opens it. MLflow
    creates a new store's tables (and migrates an old one) on first open, and two processes doing it at once both
    fail ("table _alembic_tmp_tags already exists") and leave the store unusable; under this lock one creates, the
    others find it made. Any other store is a server's or a database's, which serialises itself: store.py's
    `open_store` takes this lock for a SQLite file only.

    A lock still held after STORE_LOCK_WAIT, or one that cannot be taken, stops the command in one line saying
    why; only where the store's folder is read-only to us (CANNOT_WRITE) is the existing store opened without it."""
    lock: FileLock | None = FileLock(f"{path}.lock")
    try:
        lock.acquire(timeout=STORE_LOCK_WAIT)
    except Timeout:  # going on without it would open the race the lock is for
        raise NplmError(
            f"tracking store {path}: another process holds its lock {path}.lock (waited {STORE_LOCK_WAIT:.0f} s): "
            "let that command finish, or stop it"
        ) from None
    except OSError as error:
        if error.errno not in CANNOT_WRITE or not path.is_file():
            raise NplmError(f"tracking store {path}: cannot take its lock {path}.lock ({error.strerror})") from None
        log.warning(
            "tracking store %s: cannot take its lock %s.lock (%s); opening it without the lock", path, path, error
        )
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def locks_dir() -> Path:
    """Where the run locks live, created: $NPLM_CACHE/locks (or ~/.cache/nplm_repro/locks)."""
    return cache_dir("locks")


@contextlib.contextmanager
def _hold(name: str, holder: str, timeout: float = -1) -> Iterator[None]:
    """Hold lock file `name` under $NPLM_CACHE/locks (or ~/.cache/nplm_repro/locks), waiting for its `holder`
    (at most `timeout` seconds, then Timeout; -1 = for ever)."""
    lock = FileLock(locks_dir() / f"{name}.lock")
    try:
        lock.acquire(blocking=False)
    except Timeout:
        log.info("another job is %s: waiting for it", holder)
        report_status(state="waiting")
        lock.acquire(timeout=timeout)
        report_status(state="running")
    try:
        yield
    finally:
        lock.release()


def archive_lock(study: str, fingerprint: str) -> contextlib.AbstractContextManager[None]:
    """Hold the lock of a study's archive on this data while a run is added to it (storage/archive.py)."""
    return _hold(f"archive-{study}-{fingerprint}", f"adding a run to the archive of study {study}")


RUN_LOCK = "run-"  # a config_key's lock file: run-<key>.lock


def model_lock(key: str) -> contextlib.AbstractContextManager[None]:
    """Hold the lock of the trained model with this model_key while training or looking for its finished run."""
    return _hold(f"{MODEL_LOCK}{key}", f"training the model with model_key {key}")


def recording(key: str) -> bool:
    """Whether a live job holds the lock of this config_key, recording its run: a RUNNING run of it whose process is
    gone (kill -9) is not being recorded."""
    lock = FileLock(locks_dir() / f"{RUN_LOCK}{key}.lock")
    try:
        lock.acquire(blocking=False)
    except Timeout:
        return True
    lock.release()
    return False


def config_lock(key: str, timeout: float = -1) -> contextlib.AbstractContextManager[None]:
    """Hold the lock of this config_key while looking for its runs and recording one."""
    return _hold(f"{RUN_LOCK}{key}", f"recording a run of config_key {key}", timeout)
