"""Independent commands started at the same instant on one embedded store, or in one directory: all finish, nothing
is lost or shared."""

import subprocess
import sys
from pathlib import Path

import alembic.command
import mlflow
import pytest
import sqlalchemy
from helpers import ROOT, SLICE, console_script, run_script
from mlflow.store.db.utils import _get_alembic_config
from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

from nplm_repro.errors import NplmError
from nplm_repro.serving.served import model_of
from nplm_repro.storage import locks
from nplm_repro.storage.store import check_store
from nplm_repro.tracking.ledger import own_dir

ROWS = ["del_int", "kn3", "kn4", "kn5"]


def start(name: str, *args: str, cwd: Path) -> subprocess.Popen:
    command = [console_script(name), *args]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def at_once(commands: list[list[str]], cwd: Path) -> list[tuple[int, str]]:
    """Start every command before waiting for any; (exit code, stderr) of each."""
    running = [start(*command, cwd=cwd) for command in commands]
    return [(p.wait(timeout=600), p.stderr.read()) for p in running]


@pytest.mark.slow
def test_four_rows_at_once_on_a_new_then_a_used_store_all_finish(brown_path: Path, tmp_path: Path) -> None:
    """Four different rows at the same instant on a store that does not exist yet (MLflow's table creation used
    to race: 1 of 4 finished and the store stayed unusable), then four more, and a report, on the same store."""
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()

    def rows(seed: int) -> list[list[str]]:
        common = [f"data.path={brown_path}", *SLICE, f"seed={seed}", f"tracking.uri={uri}"]
        return [["nplm-train", f"experiment={row}", *common, f"hydra.run.dir={tmp_path}/{row}-{seed}"] for row in ROWS]

    for code, stderr in at_once(rows(1), tmp_path):
        assert code == 0, stderr[-2000:]
    report = ["nplm-report", "--study", "brown_table1", "--tracking-uri", uri, "--out", str(tmp_path / "reports")]
    results = at_once([*rows(2), report], tmp_path)
    for code, stderr in results[:-1]:
        assert code == 0, stderr[-2000:]
    assert results[-1][0] in (0, 2), results[-1][1][-2000:]  # a report of what has finished so far, or "none yet"
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
    assert {r.info.status for r in runs} == {"FINISHED"} and all("valid_ppl" in r.data.metrics for r in runs)
    assert (
        len({(r.data.params["model._target_"], r.data.params.get("model.n"), r.data.params["seed"]) for r in runs}) == 8
    )


@pytest.mark.slow
def test_two_mlps_started_in_the_same_second_in_one_directory_keep_their_own_checkpoints(
    brown_path: Path, tmp_path: Path
) -> None:
    """Hydra names a run's directory by the second: two commands started in the same second from one directory get
    the same one (forced here with one `hydra.run.dir`). Their runs shared `checkpoints/` (Lightning wrote the second
    one's as best-v1.ckpt and last-v1.ckpt, so a resume of it would load the other run's last.ckpt, and its Model
    would miss the best.ckpt it is made of)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = [f"data.path={brown_path}", *SLICE, "experiment=mlp3", "model.m=8", "trainer.max_epochs=1", "threads=1"]
    common += [f"tracking.uri={uri}", f"hydra.run.dir={tmp_path}/same-second", "trainer.enable_progress_bar=false"]
    for code, stderr in at_once([["nplm-train", *common, f"seed={seed}"] for seed in (1, 2)], tmp_path):
        assert code == 0, stderr[-2000:]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
    dirs = {Path(r.data.tags["checkpoint_dir"]) for r in runs}
    assert {d.name for d in dirs} == {"checkpoints", "checkpoints-2"}
    for run in runs:
        own = Path(run.data.tags["checkpoint_dir"])
        assert sorted(p.name for p in own.iterdir()) == ["best.ckpt", "last.ckpt"]
        assert run.data.params["callbacks.model_checkpoint.dirpath"] == str(own)
        assert model_of(client, run.info.run_id) is not None  # its own best.ckpt became its Model


def test_a_checkpoint_directory_is_never_given_twice(tmp_path: Path) -> None:
    wanted = tmp_path / "run" / "checkpoints"
    given = [own_dir(wanted) for _ in range(3)]
    assert [d.name for d in given] == ["checkpoints", "checkpoints-2", "checkpoints-3"]
    assert all(d.is_dir() and not any(d.iterdir()) for d in given)


def store_left_mid_upgrade(path: Path) -> None:
    """A store as two processes opening a new file at once left it (seen with MLflow 3.17, before the lock): the
    schema at revision a8c4a736bde6, the copy `_alembic_tmp_latest_metrics` that its next step had begun, and
    (added here) a user's run with a param. Every later open failed on "table ... already exists"."""
    url = f"sqlite:///{path}"
    engine = sqlalchemy.create_engine(url)
    InitialBase.metadata.create_all(engine)
    config = _get_alembic_config(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        alembic.command.upgrade(config, "a8c4a736bde6")
    with engine.begin() as db:
        db.exec_driver_sql("INSERT INTO experiments VALUES (1, 'brown', 'mlruns/1', 'active')")
        db.exec_driver_sql(
            "INSERT INTO runs (run_uuid, name, user_id, source_type, status, lifecycle_stage, experiment_id,"
            " start_time, artifact_uri) VALUES ('r0', 'older', 'me', 'LOCAL', 'FINISHED', 'active', 1, 0, 'mlruns/1/r0')"
        )
        db.exec_driver_sql("INSERT INTO params VALUES ('seed', '11', 'r0')")
        db.exec_driver_sql("CREATE TABLE _alembic_tmp_latest_metrics AS SELECT * FROM latest_metrics WHERE 0")
    engine.dispose()


@pytest.mark.slow
def test_a_store_left_mid_upgrade_is_repaired_and_keeps_its_runs(brown_path: Path, tmp_path: Path) -> None:
    store_left_mid_upgrade(tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = [f"data.path={brown_path}", *SLICE, "experiment=del_int", f"tracking.uri={uri}"]
    result = run_script("nplm-train", *command, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    said = (tmp_path / "run" / "train.log").read_text()
    assert "dropped _alembic_tmp_latest_metrics, left by an interrupted MLflow upgrade" in said
    client = mlflow.MlflowClient(uri)
    runs = {r.info.run_name: r for r in client.search_runs(["1"])}
    assert runs["older"].data.params == {"seed": "11"} and runs["older"].info.status == "FINISHED"
    assert runs["Del. Int. seed=1"].info.status == "FINISHED" and "valid_ppl" in runs["Del. Int. seed=1"].data.metrics


def test_a_store_whose_table_exists_only_as_its_copy_is_refused_unchanged(tmp_path: Path) -> None:
    """Alembic had dropped latest_metrics but not yet renamed the copy: the copy has the only rows."""
    path = tmp_path / "mlflow.db"
    store_left_mid_upgrade(path)
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    with engine.begin() as db:
        db.exec_driver_sql("DROP TABLE latest_metrics")
    engine.dispose()
    before = path.read_bytes()
    with pytest.raises(NplmError) as error:
        check_store(f"sqlite:///{path}")
    assert str(error.value) == (
        f"tracking store {path} was left mid-upgrade by MLflow: table latest_metrics exists only as "
        f"_alembic_tmp_latest_metrics; back up the file, run sqlite3 {path} 'ALTER TABLE _alembic_tmp_latest_metrics"
        " RENAME TO latest_metrics', then run again"
    )
    assert path.read_bytes() == before


@pytest.mark.slow  # about 8-16 s: outside the default suite's 5 minutes
def test_a_store_in_a_folder_that_does_not_exist_is_refused_and_the_folder_not_made(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    """A typo in tracking.uri used to create its folders (the store lock's file did) and start a new store there. A
    sweep checks the store before its first job (Hydra only warned of the error and ran the jobs against it)."""
    uri = f"sqlite:///{tmp_path}/typo/dir/m.db"
    said = f"tracking store '{uri}': no folder {tmp_path}/typo/dir (a new store's file is created, never its folder)"
    for sweep in ([], ["-m"]):
        split = ["data.split.train=5000", "data.split.valid=1000", "data.split.test=1000"]  # a corpus that reads
        command = [*sweep, f"data.path={tiny_brown_path}", *split, "experiment=kn3", f"tracking.uri={uri}"]
        result = run_script("nplm-train", *command, cwd=tmp_path)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [
            f"nplm-train: error: {said}: create the folder, or correct the path"
        ]
        assert not (tmp_path / "typo").exists()


def test_a_store_lock_another_process_holds_stops_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock held past the wait used to be dropped with a warning, opening the store in the race it prevents."""
    path = tmp_path / "m.db"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import filelock, sys; held = filelock.FileLock('{path}.lock'); held.acquire(); print(flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        holder.stdout.readline()  # the lock is held
        monkeypatch.setattr(locks, "STORE_LOCK_WAIT", 1.0)
        with pytest.raises(NplmError) as error:
            check_store(f"sqlite:///{path}")
    finally:
        holder.communicate("")
    assert str(error.value) == (
        f"tracking store {path}: another process holds its lock {path}.lock (waited 1 s): "
        "let that command finish, or stop it"
    )
    assert not path.exists()


def test_a_store_lock_that_cannot_be_taken_says_why(tmp_path: Path) -> None:
    """An OSError taking the lock used to be ignored: the store was opened without it."""
    path = tmp_path / "m.db"
    Path(f"{path}.lock").mkdir()
    with pytest.raises(NplmError) as error:
        check_store(f"sqlite:///{path}")
    assert str(error.value) == f"tracking store {path}: cannot take its lock {path}.lock (Is a directory)"
    assert not path.exists()


def test_a_store_leaves_only_git_ignored_files_in_the_checkout(tmp_path: Path) -> None:
    """The README's quickstart left an untracked mlflow.db.lock beside the store: a file git showed as new. The lock
    stays (deleting a lock file another process may be opening would let two hold it), and git ignores it."""
    check_store(f"sqlite:///{tmp_path}/mlflow.db")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["mlflow.db", "mlflow.db.lock"]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *left], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert ignored.stdout.split() == left, ignored.stderr
