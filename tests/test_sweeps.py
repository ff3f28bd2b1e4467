"""Sweeps (`nplm-train -m study=<name>`, any `-m`) for real: Hydra multirun, joblib and submitit launchers, one MLflow
parent run per sweep with every job nested under it and the study's report on it, and re-runs that finish only what
is missing."""

import os
import re
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import requests
import yaml
from helpers import CONF, SLICE_5K, composed, composed_study, console_script, data_slice, free_port, run_script
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from nplm_repro.errors import NplmError
from nplm_repro.paper import paper_table
from nplm_repro.reporting.tables import build
from nplm_repro.storage.locks import model_lock
from nplm_repro.sweeping.sweep import sweep_key, swept
from nplm_repro.tracking.config_checks import check_config

TINY_MLP = ["trainer.max_epochs=1", "trainer.limit_train_batches=5"]
STAMP = "%Y-%m-%d %H:%M:%S,%f"
ROWS = "experiment=mlp3,kn3,del_int,mlp4"  # MLP4 mixes MLP3's model with the trigram


def nplm_sweep(workdir: Path, study: str | None, *overrides: str, env: dict[str, str] | None = None) -> str:
    """The documented command (`-m study=<study>`, or `-m` alone for `study` None), run as a user runs it; returns
    its output (stdout and stderr) and, after it, what its jobs wrote to their own logs (joblib's jobs write there,
    not to the terminal)."""
    before = set(workdir.glob("multirun/*/*"))
    chosen = [f"study={study}"] if study is not None else []
    result = run_script("nplm-train", "-m", *chosen, *overrides, cwd=workdir, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    new = sorted(set(workdir.glob("multirun/*/*")) - before)
    return result.stdout + result.stderr + "".join(p.read_text() for d in new for p in sorted(d.glob("*/output.log")))


def runs_of(uri: str) -> pd.DataFrame:
    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=["brown"])


def split(runs: pd.DataFrame) -> tuple[pd.Series, pd.DataFrame]:
    """The one parent run (tag sweep=true) and the jobs' runs."""
    is_parent = runs["tags.sweep"] == "true"
    assert is_parent.sum() == 1
    return runs[is_parent].iloc[0], runs[~is_parent]


def job_logs(workdir: Path, first_sweep_only: bool = False) -> list[str]:
    """The jobs' log files (Hydra's job logging), of every sweep run in `workdir` or of the first one."""
    sweeps = sorted(workdir.glob("multirun/*/*"))[: 1 if first_sweep_only else None]
    return [p.read_text() for d in sweeps for p in sorted(d.glob("*/train.log"))]


@pytest.fixture(scope="module")
def table(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[str]]:
    """brown_table1 narrowed to four rows (a tiny MLP3, MLP4, Kneser-Ney n=3, Del. Int.), two jobs at a time."""
    workdir = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{workdir}/mlflow.db"
    overrides = [ROWS, f"data.path={brown_path}", *SLICE_5K, *TINY_MLP, f"tracking.uri={uri}"]
    result = run_script("nplm-train", "-m", "study=brown_table1", *overrides, cwd=workdir, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    (workdir / "terminal.txt").write_text(result.stdout + result.stderr)  # what the user saw
    return workdir, uri, overrides


@pytest.mark.slow
def test_parallel_jobs_print_to_their_own_logs_and_the_sweep_draws_one_progress_display(
    table: tuple[Path, str, list[str]],
) -> None:
    """No job's progress bar reaches the terminal (two jobs' bars overwrote each other on one line); the sweep's
    lines count the jobs, and each job's whole output is in output.log in its directory."""
    workdir, _, _ = table
    terminal = (workdir / "terminal.txt").read_text()
    assert "Epoch" not in terminal and "it/s" not in terminal
    progress = [line for line in terminal.splitlines() if line.startswith("brown_table1: ")]
    assert progress[-1].startswith("brown_table1: 4/4 done, 0 running, 0 failed | ")
    assert len(progress) <= 9  # not a terminal: a line when a job starts or ends, not a redraw per second
    assert "sweep: its runs in MLflow's dashboard: mlflow ui --backend-store-uri sqlite:///" in terminal
    (sweep,) = sorted(workdir.glob("multirun/*/*"))[:1]
    logs = {p.parent.name: p.read_text() for p in sweep.glob("*/output.log")}
    assert len(logs) == 4 and all("perplexity of every token, exact softmax" in log for log in logs.values())
    assert sum("Epoch 0" in log for log in logs.values()) == 1  # the MLP3 job's bar, in its own log


@pytest.mark.slow  # about 15 s
def test_a_failed_parallel_job_says_why_and_where_its_output_is(tiny_brown_path: Path, tmp_path: Path) -> None:
    """The first job succeeds; the second asks for more training tokens than the corpus has, which only reading
    the corpus finds, in its job (a sweep refuses a value any job would refuse before it starts)."""
    overrides = ["hydra/launcher=parallel", "experiment=kn3", f"data.path={tiny_brown_path}", *TINY_SLICE[1:]]
    overrides += ["data.split.train=5000,20000", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    result = run_script("nplm-train", "-m", *overrides, cwd=tmp_path)
    assert result.returncode == 2
    why = (
        "the corpus has 10,973 tokens, too few for the requested splits data.split.train=20,000, "
        "data.split.valid=1,000, data.split.test=1,000"
    )
    (log,) = tmp_path.glob("multirun/*/*/1/output.log")
    assert f"job 1 (Kneser-Ney back-off) failed: {why}; its output: {log}" in result.stderr.splitlines()
    assert why in log.read_text()
    assert result.stderr.strip().splitlines()[-1] == f"nplm-train: error: {why}"
    assert [line for line in result.stderr.splitlines() if line.startswith("sweep: ")][-1].startswith(
        "sweep: 1/2 done, 0 running, 1 failed"
    )


@pytest.mark.slow  # commands in subprocesses: about 7-10 s
def test_every_failed_job_of_the_basic_launcher_is_named_as_the_parallel_ones_are(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    """A row that fails only once it runs (Kneser-Ney of order 12 on 5,000 words), then a mixture of that row:
    Hydra's basic launcher said only the first error, for the sweep, and nothing of the mixture's."""
    experiments = tmp_path / "own" / "experiment"
    experiments.mkdir(parents=True)
    (experiments / "kn12.yaml").write_text("# @package _global_\ndefaults:\n  - /experiment/kn3\nmodel:\n  n: 12\n")
    (experiments / "kn12_trigram.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /model: mixture\nrow: KN12 + trigram\n"
        "model:\n  components: [Kneser-Ney back-off, Del. Int.]\n"
    )
    overrides = ["hydra/launcher=basic", f"hydra.searchpath=[file://{tmp_path / 'own'}]"]
    overrides += [
        f"data.path={tiny_brown_path}",
        *TINY_SLICE,
        "experiment=kn12,del_int,kn12_trigram",
        f"tracking.uri=sqlite:///{tmp_path}/m.db",
    ]
    result = run_script("nplm-train", "-m", *overrides, cwd=tmp_path)
    (sweep,) = tmp_path.glob("multirun/*/*")
    why = "Kneser-Ney order 12: count-of-counts n1..n4 = "
    lines = result.stderr.splitlines()
    named = [line for line in lines if line.startswith("job ")]
    assert len(named) == 2, result.stderr[-3000:]
    assert named[0].startswith(f"job 0 (Kneser-Ney back-off) failed: {why}"), named
    assert named[0].endswith(f"; its log: {sweep / '0' / 'train.log'}")
    failed = (
        "model.components: no finished run of row 'Kneser-Ney back-off' with seed 1 in study (none) on this data: "
        "its run failed, so this mixture fails with it"
    )
    assert named[1] == f"job 2 (KN12 + trigram) failed: {failed}; its log: {sweep / '2' / 'train.log'}"
    assert result.returncode == 2 and lines[-1].startswith(f"nplm-train: error: {why}")
    # the mixture has a FAILED run of its own, so reports list its row as failed, not as missing
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    found = client.search_runs([client.get_experiment_by_name("brown").experiment_id], "tags.row = 'KN12 + trigram'")
    assert [(r.info.status, r.data.tags["error"]) for r in found] == [("FAILED", failed)]


@pytest.mark.slow
def test_one_parent_run_per_sweep_with_every_job_nested(table: tuple[Path, str, list[str]]) -> None:
    workdir, uri, _ = table
    parent, jobs = split(runs_of(uri))
    assert parent["status"] == "FINISHED" and parent["tags.study"] == "brown_table1"
    assert ROWS in parent["params.sweep.overrides"]
    assert parent["params.sweep.params.experiment"] == ROWS.removeprefix("experiment=")  # the file's rows, narrowed
    sweep_dir = Path(parent["tags.sweep_dir"])
    assert sweep_dir.parent.parent == workdir / "multirun"
    assert (sweep_dir / "mlflow_parent_run_id").read_text().strip() == parent["run_id"]
    assert sorted(jobs["tags.row"]) == ["Del. Int.", "Kneser-Ney back-off", "MLP3", "MLP4"]
    assert (jobs["tags.mlflow.parentRunId"] == parent["run_id"]).all()
    assert (jobs["tags.study"] == "brown_table1").all() and (jobs["status"] == "FINISHED").all()
    assert jobs["tags.config_key"].str.fullmatch("[0-9a-f]{16}").all() and jobs["tags.config_key"].is_unique


@pytest.mark.slow
def test_finished_sweep_keeps_its_report_and_headline_numbers_on_the_parent(table: tuple[Path, str, list[str]]) -> None:
    """The report's files as the parent's artifacts; as its metrics, the test perplexities of the best MLP and the
    best n-gram (each chosen on validation) and the margins the report's claims check, as the csv has them."""
    workdir, uri, _ = table
    parent, _ = split(runs_of(uri))
    client = MlflowClient(uri)
    kept = {Path(a.path).name for a in client.list_artifacts(parent["run_id"], "report")}
    assert kept == {p.name for p in (workdir / "reports").iterdir()}
    assert {f"brown_table1.{ext}" for ext in ("md", "html", "csv", "tex")} < kept and any(".png" in n for n in kept)
    rows = pd.read_csv(workdir / "reports" / "brown_table1.csv")
    rows = rows[rows["status"] == "finished"].sort_values("valid_ppl")
    mlp, ngram, del_int = (
        rows[chosen].iloc[0]["test_ppl"]
        for chosen in (rows["family"] == "mlp", rows["family"] != "mlp", rows["family"] == "deleted_interpolation")
    )
    assert client.get_run(parent["run_id"]).data.metrics == pytest.approx(
        {
            "best_mlp_test_ppl": mlp,
            "best_ngram_test_ppl": ngram,
            "mlp_margin_over_best_ngram": ngram / mlp - 1,
            "mlp_margin_over_del_int": del_int / mlp - 1,
        }
    )


@pytest.mark.slow
def test_a_finished_sweep_registers_its_best_mlp_and_mlflow_serves_it(table: tuple[Path, str, list[str]]) -> None:
    """The study's best run (here its only trained one, MLP3) is version 1 of nplm-brown-brown_table1, its
    `champion`, and `mlflow models serve` of the champion (as docs/models.md serves it) answers it over HTTP: the
    next words, a 4xx for a context too short, and the server still answers after it."""
    workdir, uri, _ = table
    client = MlflowClient(uri)
    (version,) = client.search_model_versions("name = 'nplm-brown-brown_table1'")
    mlp3 = runs_of(uri).set_index("tags.row").loc["MLP3"]
    assert int(version.version) == 1 and version.run_id == mlp3["run_id"]
    assert version.tags["row"] == "MLP3" and float(version.tags["valid_ppl"]) == pytest.approx(
        mlp3["metrics.valid_ppl"]
    )
    assert version.tags["data_fingerprint"] == mlp3["tags.data_fingerprint"]
    port = free_port()
    assert client.get_model_version_by_alias("nplm-brown-brown_table1", "champion").version == version.version
    serve = [console_script("mlflow"), "models", "serve", "-m", "models:/nplm-brown-brown_table1@champion"]
    serve += ["--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"MLFLOW_TRACKING_URI": uri}
    env["PATH"] = f"{Path(console_script('mlflow')).parent}{os.pathsep}{env['PATH']}"  # it starts `uvicorn` by name
    server = subprocess.Popen(serve, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while not ready(f"{url}/ping"):
            assert server.poll() is None, server.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "mlflow models serve did not answer /ping in 180 s"
            time.sleep(1)
        ask = {"dataframe_records": [{"context": "The Fulton County Grand Jury said"}], "params": {"k": 3}}
        answer = requests.post(f"{url}/invocations", json=ask, timeout=60)
        assert answer.status_code == 200, answer.text
        (prediction,) = answer.json()["predictions"]
        assert len(prediction["words"]) == 3 and sorted(prediction["probs"], reverse=True) == prediction["probs"]
        short = requests.post(f"{url}/invocations", json={"dataframe_records": [{"context": "the"}]}, timeout=60)
        assert 400 <= short.status_code < 500 and "has 1 tokens" in short.text, short.text
        assert requests.post(f"{url}/invocations", json=ask, timeout=60).json() == answer.json()
    finally:
        server.terminate()
        server.wait(timeout=30)


def ready(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


@pytest.mark.slow
def test_plain_multirun_has_a_parent_run_with_the_values_it_sweeps_and_a_second_run_skips_its_jobs(
    brown_path: Path, tmp_path: Path
) -> None:
    """`-m` without a study: the jobs (two n-gram rows one after the other, Hydra's basic launcher) are nested under
    a parent run all the same (no callback warning); the same command again skips both."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = ["-m", "experiment=kn3,del_int", f"data.path={brown_path}", *SLICE_5K, f"tracking.uri={uri}"]
    result = run_script("nplm-train", *command, cwd=tmp_path, timeout=600)
    assert result.returncode == 0 and "MlflowSweep" not in result.stderr, result.stderr[-4000:]
    parent, jobs = split(runs_of(uri))
    assert parent["status"] == "FINISHED" and parent["params.sweep.params.experiment"] == "kn3,del_int"
    assert parent["tags.sweeper"].endswith("RowsFirst") and parent["tags.study"] == ""  # the basic one, ordered
    assert sorted(jobs["tags.row"]) == ["Del. Int.", "Kneser-Ney back-off"]
    assert (jobs["tags.mlflow.parentRunId"] == parent["run_id"]).all() and (jobs["status"] == "FINISHED").all()
    output = nplm_sweep(tmp_path, None, *command[1:])
    assert output.count("skipped: run") == 2 and len(runs_of(uri)) == 3


def test_the_parent_records_what_the_command_line_makes_of_the_swept_values() -> None:
    """As Hydra's and Optuna's sweepers read them: the config's params, each as the command line last sets it, and
    the command line's own sweeps; other overrides are not swept values."""
    grid = OmegaConf.to_container(composed_study("grid").hydra.sweeper.params)
    overrides = ["study=grid", "model.h=50", "seed=1,2", "+trainer.gradient_clip_val=0.5,1", "trainer.max_epochs=5"]
    assert swept(grid, overrides) == grid | {"model.h": "50", "seed": "1,2", "trainer.gradient_clip_val": "0.5,1"}
    table1 = OmegaConf.to_container(composed_study("brown_table1").hydra.sweeper.params)
    assert swept(table1, ["study=brown_table1", "experiment=mlp1,kn3"]) == {"experiment": "mlp1,kn3"}
    assert swept({}, ["experiment=kn3,del_int", "data.path=brown.zip"]) == {"experiment": "kn3,del_int"}


@pytest.mark.parametrize("study,key", [("brown_table1", "78670458e90db8c9")])
def test_a_study_resumes_the_parent_runs_of_its_sweep_file(study: str, key: str) -> None:
    """Parents made by `-cd sweeps -cn <study> data.path=...` (keys of main at d572f06) are the parents of
    `-m study=<study> data.path=...`: the same command re-run finds its parent run. (grid's was pinned too, until
    it lost its mixed half: its sweep is another one.)"""
    cfg = composed_study(study, "data.path=../shared/data/brown.zip")
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=True)
    assert sweep_key(cfg.study, list(cfg.hydra.overrides.task), params) == key


@pytest.mark.slow
def test_mixed_row_mixes_the_runs_of_its_rows(table: tuple[Path, str, list[str]]) -> None:
    """MLP4 mixes the runs of MLP3's and Del. Int.'s jobs in the same sweep, waited for while they ran."""
    _, uri, _ = table
    _, jobs = split(runs_of(uri))
    rows = jobs.sort_values("start_time").drop_duplicates("tags.row").set_index("tags.row")  # the first sweep's
    assert rows.loc["MLP4", "tags.base_run_id"] == f"{rows.loc['MLP3', 'run_id']},{rows.loc['Del. Int.', 'run_id']}"


@pytest.mark.slow
def test_joblib_runs_two_jobs_at_a_time_with_one_thread_each(table: tuple[Path, str, list[str]]) -> None:
    workdir, uri, _ = table
    parent, _ = split(runs_of(uri))
    assert parent["tags.launcher"].endswith("JoblibLauncher")
    logs = job_logs(workdir, first_sweep_only=True)
    assert len(logs) == 4 and all("torch threads 1" in log for log in logs)
    stamps = [re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]", log, re.MULTILINE) for log in logs]
    spans = [(datetime.strptime(s[0], STAMP), datetime.strptime(s[-1], STAMP)) for s in stamps]
    most = max(sum(start <= t <= end for start, end in spans) for t, _ in spans)
    assert most == 2  # some job started while another ran; never three at once


@pytest.mark.slow
def test_rerun_finishes_only_what_is_missing(table: tuple[Path, str, list[str]]) -> None:
    """Kill one job's run (as a sweep killed half-way leaves it): the same command re-runs that job only."""
    workdir, uri, overrides = table
    parent, before = split(runs_of(uri))
    killed = before[before["tags.row"] == "Kneser-Ney back-off"].iloc[0]
    MlflowClient(uri).set_terminated(killed["run_id"], "KILLED")
    output = nplm_sweep(workdir, "brown_table1", *overrides)
    assert output.count("skipped: run") == 3
    again, after = split(runs_of(uri))
    assert again["run_id"] == parent["run_id"] and again["status"] == "FINISHED"  # the same parent, resumed
    new = after[~after["run_id"].isin(before["run_id"])]
    assert list(new["tags.row"]) == ["Kneser-Ney back-off"] and new.iloc[0]["status"] == "FINISHED"
    assert new.iloc[0]["tags.config_key"] == killed["tags.config_key"]
    assert new.iloc[0]["tags.mlflow.parentRunId"] == parent["run_id"]

    nplm_sweep(workdir, "brown_table1", *overrides)  # everything is there now: no new run
    assert len(split(runs_of(uri))[1]) == len(after)


@pytest.mark.slow
def test_rerun_true_runs_every_job_again(table: tuple[Path, str, list[str]]) -> None:
    workdir, uri, overrides = table
    before = runs_of(uri)
    output = nplm_sweep(workdir, "brown_table1", *overrides, "rerun=true")
    assert "skipped: run" not in output
    after = runs_of(uri)
    new = after[~after["run_id"].isin(before["run_id"])]
    assert sorted(new["tags.row"]) == ["Del. Int.", "Kneser-Ney back-off", "MLP3", "MLP4"]
    mixed, mlp, trigram = (new[new["tags.row"] == row].iloc[0] for row in ("MLP4", "MLP3", "Del. Int."))
    assert mixed["tags.base_run_id"] == f"{mlp['run_id']},{trigram['run_id']}"  # it waited for the new runs


@pytest.mark.slow
def test_submitit_local_executor_nests_and_resumes(brown_path: Path, tmp_path: Path) -> None:
    """The SLURM launcher's code path (hydra-submitit-launcher) with submitit's local executor: two n-gram rows of
    a study, nested under its parent run, the study's report written when they end; the same command again skips
    them."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    overrides = ["hydra/launcher=slurm_local", "experiment=kn3,del_int", f"data.path={brown_path}", *SLICE_5K]
    nplm_sweep(tmp_path, "brown_table1", *overrides, f"tracking.uri={uri}")
    parent, jobs = split(runs_of(uri))
    assert parent["tags.launcher"].endswith("submitit_launcher.LocalLauncher") and parent["status"] == "FINISHED"
    assert parent["tags.study"] == "brown_table1" and (jobs["tags.study"] == "brown_table1").all()
    assert sorted(jobs["tags.row"]) == ["Del. Int.", "Kneser-Ney back-off"]
    assert (jobs["tags.mlflow.parentRunId"] == parent["run_id"]).all() and (jobs["status"] == "FINISHED").all()
    report = (tmp_path / "reports" / "brown_table1.md").read_text()  # the sweep ends by writing its report
    for row in ("Del. Int.", "Kneser-Ney back-off"):  # " (+dirty)" after the row when run from a changed work tree
        assert re.search(rf"\| {re.escape(row)}( \(\+dirty\))? +\| +3 \|", report), report
    assert list(Path(parent["tags.sweep_dir"]).glob(".submitit/*"))  # the jobs went through submitit
    assert len(logs := job_logs(tmp_path)) == 2 and all("torch threads 1" in log for log in logs)  # cpus_per_task: 1
    nplm_sweep(tmp_path, "brown_table1", *overrides, f"tracking.uri={uri}")
    assert len(runs_of(uri)) == 3  # the second sweep found both jobs done
    assert sum(log.count("skipped: run") for log in job_logs(tmp_path)) == 2


@pytest.mark.slow
def test_default_sqlite_store_loses_nothing_with_parallel_jobs(brown_path: Path, tmp_path: Path) -> None:
    """8 short trainings of MLP3, 2 at a time (joblib), into the default embedded store ./mlflow.db: every run,
    param and metric lands, no job meets "database is locked", and the report afterwards sees all 8 seeds."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    overrides = ["experiment=mlp3", "seed=range(1,9)", f"data.path={brown_path}", *SLICE_5K, *TINY_MLP]
    output = nplm_sweep(tmp_path, "brown_table1", *overrides, env=env)
    assert (tmp_path / "mlflow.db").exists() and "database is locked" not in output + "".join(job_logs(tmp_path))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    _, jobs = split(runs_of(uri))
    assert sorted(jobs["params.seed"].astype(int)) == list(range(1, 9)) and (jobs["status"] == "FINISHED").all()
    params = jobs.filter(like="params.").drop(columns=jobs.filter(like="params.sweep.").columns)  # the parent's
    assert len(params.columns) > 40 and params.notna().all(axis=None)  # every job logged every param
    client = MlflowClient(uri)
    for run_id in jobs["run_id"]:
        metrics = client.get_run(run_id).data.metrics
        assert {"train_ppl", "valid_ppl", "test_ppl", "valid_ppl_epoch", "train_tokens_per_s"} <= set(metrics)
        assert len(client.get_metric_history(run_id, "valid_ppl_epoch")) == 1
    report = build(uri, "brown", "brown_table1")
    mlp3 = report.table.set_index("row").loc["MLP3"]
    assert mlp3["status"] == "finished" and mlp3["seeds"] == 8
    assert sorted(mlp3["run_ids"].split()) == sorted(jobs["run_id"])  # the mean and std are over every run
    assert report.running.empty and report.failed.empty


@pytest.mark.slow  # about 8-16 s: outside the default suite's 5 minutes
def test_bad_value_in_a_sweep_is_one_line_before_anything_is_made(tiny_brown_path: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = ["-m", "study=brown_table1"]
    command += [
        "hydra/launcher=basic",
        "experiment=kn3",
        "model.n=1",
        f"data.path={tiny_brown_path}",
        f"tracking.uri={uri}",
    ]
    result = run_script("nplm-train", *command, cwd=tmp_path)
    said = "model.n=1 is invalid: expected an integer >= 2, in 1 job (nothing was run)"
    assert (result.returncode, result.stderr.strip().splitlines()[-1]) == (2, f"nplm-train: error: {said}")
    assert not (tmp_path / "mlflow.db").exists()  # refused before the store and its parent run are made


TINY_SLICE = data_slice(5_000, 1_000, 1_000)  # of tests/data/tiny_brown.zip's 10,973 tokens


@pytest.mark.slow  # about 8-16 s: outside the default suite's 5 minutes
def test_an_error_of_a_job_exits_as_in_a_single_run(tiny_brown_path: Path, tmp_path: Path) -> None:
    """Hydra's InstantiationException from a job (here a model given a keyword it does not take) is unexpected:
    exit 1 with its type in a single run, and it was exit 2 without it in a sweep. One rule for both."""
    job = [f"data.path={tiny_brown_path}", *TINY_SLICE, "experiment=kn3", "+model.foo=1"]
    job.append(f"tracking.uri=sqlite:///{tmp_path}/m.db")
    said = (
        "nplm-train: error: InstantiationException: Error in call to target 'nplm_repro.baselines.ngram.KneserNey':: "
        "KneserNey.__init__() got an unexpected keyword argument 'foo' (HYDRA_FULL_ERROR=1 shows the traceback)"
    )
    for mode in ([], ["-m", "hydra/launcher=basic"]):
        result = run_script("nplm-train", *mode, *job, cwd=tmp_path)
        assert (result.returncode, result.stderr.strip().splitlines()[-1]) == (1, said)


@pytest.mark.parametrize("override,key", [("threads=0", "threads"), ("rerun=2", "rerun")])
def test_bad_sweep_keys_are_refused(override: str, key: str) -> None:
    cfg = composed(override)
    with pytest.raises(NplmError, match=rf"^{key}="):
        check_config(cfg)


def test_a_blank_study_name_is_refused() -> None:
    """A study file sets the name (study=<name> on the command line chooses the file): one's own may leave it blank."""
    cfg = composed()
    cfg.study = " "
    with pytest.raises(NplmError, match=r"^study="):
        check_config(cfg)


def test_model_lock_waits_for_the_job_that_holds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path))
    entered = threading.Event()

    def mixed_job() -> None:
        with model_lock("k"):
            entered.set()

    with model_lock("k"):  # the model's own job, training
        waiting = threading.Thread(target=mixed_job)
        waiting.start()
        assert not entered.wait(0.5)
    assert entered.wait(10)
    waiting.join()


def jobs_of(study: str) -> list[list[str]]:
    """The jobs a sweep file launches, in launch order: the swept values as Hydra's basic sweeper expands them."""
    cfg = composed_study(study)
    assert cfg.study == study and cfg.hydra.mode.name == "MULTIRUN"
    assert cfg.hydra.launcher.n_jobs == 2 and "mlflow_sweep" in cfg.hydra.callbacks
    params = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()]
    return BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)[0]


def test_brown_table1_runs_every_row_of_table1_mlps_first() -> None:
    jobs = [job[0].removeprefix("experiment=") for job in jobs_of("brown_table1")]
    rows = set(paper_table("brown_table1")["row"])  # the experiments of Table 1's rows, not AP's nor the LSTM's
    table1 = [p for p in (CONF / "experiment").glob("*.yaml") if not p.stem.startswith("ap_")]
    assert sorted(jobs) == sorted(p.stem for p in table1 if yaml.safe_load(p.read_text()).get("row") in rows)
    last_unmixed = max(jobs.index(f"mlp{i}") for i in (1, 3, 5, 7, 9))
    assert all(jobs.index(f"mlp{i}") > last_unmixed for i in (2, 4, 6, 8, 10))


def test_ap_table2_runs_the_rows_of_table2() -> None:
    jobs = [job[0] for job in jobs_of("ap_table2")]
    assert jobs == [f"experiment={e}" for e in ("ap_mlp", "del_int", "kn3", "kn4", "kn5", "ap_mlp10")]
    mlp, mixed = composed("experiment=ap_mlp"), composed("experiment=ap_mlp10")
    assert (mlp.model.n, mlp.model.h, mlp.model.m, mlp.model.direct, mlp.optim.weight_decay) == (6, 60, 100, True, 1e-5)
    assert (mixed.row, list(mixed.model.components), mixed.model.mode) == ("MLP10", [mlp.row, "Del. Int."], "fixed")


def test_grid_sweeps_the_four_knobs_with_seeds() -> None:
    jobs = [dict(o.split("=", 1) for o in job) for job in jobs_of("grid")]
    assert {"model.n", "model.m", "model.h", "model.direct", "seed"} == set(jobs[0])
    assert len(jobs) == 32 and len({tuple(j.items()) for j in jobs}) == 32


@pytest.mark.slow
def test_brown_sampled_trains_each_mlp_both_ways_and_its_report_pairs_them(brown_path: Path, tmp_path: Path) -> None:
    """sweeps/brown_sampled (MLP9) narrowed to seed 1 on a slice: one exact and one sampled job, same seed and data;
    the report's section gives both exact perplexities, epochs, minutes in fit and the speed-up."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    overrides = ["seed=1", f"data.path={brown_path}", *SLICE_5K, "trainer.max_epochs=1", "optim.samples=100"]
    nplm_sweep(tmp_path, "brown_sampled", *overrides, f"tracking.uri={uri}")
    _, jobs = split(runs_of(uri))
    assert sorted(jobs["params.optim.output"].fillna("exact")) == ["exact", "sampled"]
    assert (jobs["status"] == "FINISHED").all() and (jobs["tags.study"] == "brown_sampled").all()
    report = (tmp_path / "reports" / "brown_sampled.md").read_text()
    assert "## Sampled against exact training" in report
    number = r"[0-9.]+"
    assert re.search(
        rf"MLP9: exact \((32-true|bf16-mixed)\) valid {number}, test {number}, 1 epochs, {number} min; "
        rf"sampled \(k=100, bigram proposal, importance\) valid {number} \([+-]{number}%\), "
        rf"test {number} \([+-]{number}%\), 1 epochs, {number} min in fit: {number}x faster",
        report,
    ), report


@pytest.mark.slow
def test_brown_recipe_runs_its_steps_and_its_report_orders_them(brown_path: Path, tmp_path: Path) -> None:
    """sweeps/brown_recipe narrowed to two tiny steps of MLP5 on a slice (optim=paper, and the paper's decay with
    fast's batch, rate and drop: both schedules in one run), two epochs each so that the drop's check runs."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    steps = "experiment=brown_recipe/mlp5_paper,brown_recipe/mlp5_drop"
    tiny = ["trainer.max_epochs=2", "trainer.limit_train_batches=5"]  # MLP5 as it is: the steps are MLP5's
    nplm_sweep(tmp_path, "brown_recipe", steps, f"data.path={brown_path}", *SLICE_5K, *tiny, f"tracking.uri={uri}")
    _, jobs = split(runs_of(uri))
    assert (jobs["status"] == "FINISHED").all() and (jobs["tags.study"] == "brown_recipe").all()
    assert sorted(jobs["params.optim.plateau_factor"].fillna("unset")) == ["0.2", "unset"]
    assert (jobs["params.optim.decay_rate"] == "1e-08").all() and (jobs["metrics.epochs"] == 2).all()
    report = (tmp_path / "reports" / "brown_recipe.md").read_text()
    assert "## From optim=paper to optim=fast, one knob at a time" in report
    number = r"[0-9.]+"
    drop = rf"\| 3\. drop on plateau +\|[^|]+\| *{number} *\| *[+-]{number}% *\|[^|]+\|[^|]+\| paper +\| +2 \|"
    assert re.search(drop, report), report
    assert re.search(r"\| 1\. batch 256 +\| .+ \| not run +\|", report), report
    assert "MLP5, optim=paper: valid" in report and "brown_recipe_valid_by_epoch.png" in report
