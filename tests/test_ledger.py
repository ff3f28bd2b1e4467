"""The run ledger's look-ups in a real MLflow store: which run a job resumes, finds finished, or marks KILLED, also
at the end of a stopped sweep."""

from pathlib import Path

import pytest
from helpers import composed
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from nplm_repro.errors import NplmError
from nplm_repro.tracking import ledger
from nplm_repro.tracking.ledger import ORPHANED, end_orphans, find_finished, find_resumable, search
from nplm_repro.storage.locks import config_lock
from nplm_repro.sweeping import sweep as sweep_module
from nplm_repro.sweeping.sweep import MlflowSweep


def killed_run(client: MlflowClient, experiment: str, key: str, checkpoints: Path, start: int, last: bool) -> str:
    """A run of config `key` stopped by a kill (KILLED) at time `start`, its checkpoint directory holding last.ckpt
    or not (killed before its first epoch ended)."""
    checkpoints.mkdir()
    if last:
        (checkpoints / "last.ckpt").write_bytes(b"the weights of its last epoch")
    tags = {"config_key": key, "checkpoint_dir": str(checkpoints)}
    run = client.create_run(experiment, start_time=start, tags=tags).info.run_id
    client.set_terminated(run, "KILLED")
    return run


def test_a_config_resumes_its_newest_run_or_none(tmp_path: Path) -> None:
    """An older KILLED run's checkpoint is an older state of the config: once a newer run started (say with
    rerun=true) and was killed before its first checkpoint, nothing is resumed; the newest run is, once it has one."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("brown")
    older = killed_run(client, experiment, "k", tmp_path / "checkpoints", start=1_000, last=True)
    assert find_resumable(uri, "brown", "k") == (older, tmp_path / "checkpoints" / "last.ckpt")
    newer = killed_run(client, experiment, "k", tmp_path / "checkpoints-2", start=2_000, last=False)
    assert find_resumable(uri, "brown", "k") is None
    (tmp_path / "checkpoints-2" / "last.ckpt").write_bytes(b"its first epoch")
    assert find_resumable(uri, "brown", "k") == (newer, tmp_path / "checkpoints-2" / "last.ckpt")
    failed = client.create_run(experiment, start_time=3_000, tags={"config_key": "k"}).info.run_id
    client.set_terminated(failed, "FAILED")
    assert find_resumable(uri, "brown", "k") is None  # a failed run starts again from scratch
    assert find_resumable(uri, "ap", "k") is None and find_finished(uri, "ap", config_key="k") is None


def test_look_ups_read_one_experiment_newest_first(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    brown, other = client.create_experiment("brown"), client.create_experiment("other")
    runs = [client.create_run(brown, start_time=t, tags={"config_key": "k"}).info.run_id for t in (1, 3, 2)]
    elsewhere = client.create_run(other, start_time=4, tags={"config_key": "k"}).info.run_id
    assert [r.info.run_id for r in search(uri, "brown", "tags.config_key = 'k'")] == [runs[1], runs[2], runs[0]]
    assert search(uri, "nowhere", "tags.config_key = 'k'") == []
    for run in runs[1:]:
        client.set_terminated(run)
    assert find_finished(uri, "brown", config_key="k") == runs[1]
    end_orphans(uri, "brown", "k")  # the one still RUNNING: its process is gone (the caller holds the lock)
    orphan = client.get_run(runs[0])
    assert orphan.info.status == "KILLED" and orphan.data.tags["killed_because"] == ORPHANED
    assert client.get_run(runs[1]).info.status == "FINISHED" and client.get_run(elsewhere).info.status == "RUNNING"


def test_a_corpus_found_bad_only_when_read_leaves_no_store(tmp_path: Path) -> None:
    """A NUL byte is found by reading the text: the corpus is read before the store is opened."""
    (tmp_path / "news").mkdir()
    (tmp_path / "news" / "a.txt").write_bytes(b"fine words here .\n" * 50)
    (tmp_path / "news" / "b.txt").write_bytes(b"bad\x00 .\n")
    cfg = composed(
        "data=text", f"data.path={tmp_path / 'news'}", "experiment=kn3", f"tracking.uri=sqlite:///{tmp_path}/m.db"
    )
    with pytest.raises(NplmError, match="has a NUL character"):
        ledger.run(cfg)
    assert not (tmp_path / "m.db").exists()


def test_a_batch_larger_than_a_proportional_training_split_is_refused_before_the_store(tmp_path: Path) -> None:
    """A text corpus split by proportions has its training size only once read: checked then, before the store."""
    (tmp_path / "t.txt").write_bytes(b"some words and more words .\n" * 40)
    cfg = composed(
        "data=text",
        f"data.path={tmp_path / 't.txt'}",
        "experiment=mlp5",
        "optim.batch_size=100000",
        f"tracking.uri=sqlite:///{tmp_path}/m.db",
        f"callbacks.model_checkpoint.dirpath={tmp_path}",
    )
    with pytest.raises(NplmError, match=r"optim.batch_size=100000 is larger than the training split \("):
        ledger.run(cfg)
    assert not (tmp_path / "m.db").exists()


def test_a_stopped_sweep_waits_for_its_jobs_locks_once_in_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs a stopped sweep left RUNNING whose jobs still hold their locks: `end_killed_jobs` waits its `wait` for
    all of them together, not once per run, and leaves them RUNNING; a run whose lock is free it marks KILLED."""
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("brown")
    parent = client.create_run(experiment).info.run_id
    tags = {MLFLOW_PARENT_RUN_ID: parent}
    runs = {k: client.create_run(experiment, tags={"config_key": k, **tags}).info.run_id for k in ("a", "b", "c")}
    sweep = MlflowSweep()
    sweep.uri, sweep.experiment, sweep.parent_run_id = uri, "brown", parent
    waits = {}

    def timed_lock(key: str, timeout: float) -> object:  # the real lock; the wait each acquisition is given
        waits[key] = timeout
        return config_lock(key, timeout=timeout)

    monkeypatch.setattr(sweep_module, "config_lock", timed_lock)
    with config_lock("a"), config_lock("b"):  # their jobs, still ending their runs
        sweep.end_killed_jobs(wait=2.0)
    # the first held lock is waited for until the deadline, so the second has none left: 2 s each would be 4
    assert sorted(waits) == ["a", "b", "c"] and sorted([waits["a"], waits["b"]])[0] == 0.0
    assert 0 < max(waits.values()) <= 2.0
    ended = {key: client.get_run(run).info.status for key, run in runs.items()}
    assert ended == {"a": "RUNNING", "b": "RUNNING", "c": "KILLED"}
