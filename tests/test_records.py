"""What a run records beyond its numbers, as MLflow users expect it: no credentials, the experiment's kind, the code
(MLflow's commit tag, the diff of uncommitted code, or the installed version). Real stores, real runs.

The params logged once, the dataset input, the commit tag of this tree and system metrics are checked on the runs
of test_train.py; here the code runs from throwaway checkouts of this project (PYTHONPATH), to make a tree dirty
and to install the package into a checkout's ignored virtualenv folder as `pip install .` does.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
import pytest
from helpers import ROOT, SLICE, TINY_BROWN, data_slice, run_script
from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from nplm_repro.reporting.tables import build
from nplm_repro.tracking.records import RUNS_BESIDE, code_state, log_corpus
from nplm_repro.storage.redaction import redact
from nplm_repro.storage.store import EXPERIMENT_KIND, ensure_experiment

SECRET = "s3cret-Pa55"
CHANGE = f"uri: postgresql+psycopg://nplm:{SECRET}@db-host/nplm\n"  # a credential in a change: masked in the patch


@pytest.mark.parametrize(
    "text,masked",
    [
        (f"postgresql+psycopg://nplm:{SECRET}@db-host:5432/nplm", "postgresql+psycopg://***@db-host:5432/nplm"),
        (f"http://me:{SECRET}@tracking-host:5000", "http://***@tracking-host:5000"),
        (f"https://{SECRET}@github.com/me/repo", "https://***@github.com/me/repo"),
        (f"postgresql://nplm:{SECRET}@x@db-host/nplm", "postgresql://***@db-host/nplm"),  # an unescaped @ in it
        (
            f"postgresql://db-host/nplm?sslmode=require&password={SECRET}",
            "postgresql://db-host/nplm?sslmode=require&password=***",
        ),
        (
            f"-m tracking.uri=mysql://a:{SECRET}@h/db data.path=/home/me@work/brown.zip",
            "-m tracking.uri=mysql://***@h/db data.path=/home/me@work/brown.zip",
        ),
        ("sqlite:////home/me@work/mlflow.db", "sqlite:////home/me@work/mlflow.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ],
)
def test_redact_masks_the_credentials_of_every_uri_and_nothing_else(text: str, masked: str) -> None:
    assert redact(text) == masked


def test_experiments_are_model_training_experiments_unless_a_kind_was_chosen(tmp_path: Path) -> None:
    """MLflow 3's UI opens an experiment without a kind in its GenAI view; ours are made (or marked) model-training."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    older = client.create_experiment("older")  # as nplm-train made them before, or another tool
    chat = client.create_experiment("chat", tags={"mlflow.experimentKind": "genai_development"})
    created = ensure_experiment(client, "brown")
    assert (ensure_experiment(client, "brown"), ensure_experiment(client, "older")) == (created, older)
    assert ensure_experiment(client, "chat") == chat
    kinds = {e.name: e.tags.get("mlflow.experimentKind") for e in client.search_experiments()}
    kind = EXPERIMENT_KIND["mlflow.experimentKind"]
    assert kinds == {"Default": None, "brown": kind, "older": kind, "chat": "genai_development"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def commit_all(repo: Path) -> str:
    git(repo, "add", "--", ".")
    git(repo, "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "base")
    return git(repo, "rev-parse", "HEAD").strip()


def throwaway_repo(path: Path) -> str:
    """A repository with one commit (its hash returned) holding the package `pkg/` and its configs `conf/`; its file
    `conf/local.yaml` changed afterwards makes it dirty."""
    (path / "pkg").mkdir(parents=True)
    (path / "conf").mkdir()
    git(path, "init", "-q")
    (path / "pkg" / "__init__.py").write_text('"""the code"""\n')
    (path / "conf" / "local.yaml").write_text("uri: sqlite:///mlflow.db\n")
    return commit_all(path)


PROJECT = (
    "nplm_repro",
    "hydra_plugins",
    "conf",
    "sweeps",
    "pyproject.toml",
    "README.md",
)  # what `pip install .` builds


def needs_git_checkout() -> None:
    """Skip the test outside a git checkout of this project (unpacked from `git archive`): it has no tracked files."""
    top = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0 or Path(top.stdout.strip()) != ROOT:
        pytest.skip(f"{ROOT} is not a git checkout (a source archive?): its tracked files are what this test uses")


def checkout(path: Path) -> str:
    """A checkout of this project's code as it is now (the tracked files of PROJECT, as the work tree has them), with
    a tracked `conf/local.yaml` (no config names it) and `.venv/` ignored, as a checkout's virtualenv is; its commit
    returned."""
    needs_git_checkout()
    path.mkdir()
    git(path, "init", "-q")
    for name in git(ROOT, "ls-files", "--", *PROJECT).splitlines():
        if (ROOT / name).is_file() or (ROOT / name).is_symlink():  # conf/study links to sweeps/
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, path / name, follow_symlinks=False)
    (path / ".gitignore").write_text(".venv/\n")
    (path / "conf" / "local.yaml").write_text("uri: sqlite:///mlflow.db\n")
    return commit_all(path)


def pip_install(project: Path, target: Path) -> Path:
    """`pip install .` of `project` (not editable) into `target`, as into a virtualenv's site-packages; the package."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target"]
    subprocess.run([*command, str(target), str(project)], check=True, capture_output=True, text=True)
    return target / "nplm_repro"


def test_code_state_is_the_commit_and_what_a_dirty_tree_adds_to_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit = throwaway_repo(repo)
    assert code_state(repo / "pkg") == (commit, "")
    (repo / "conf" / "local.yaml").write_text(CHANGE)
    state, diff = code_state(repo / "pkg")
    assert state == f"{commit}+dirty" and f"+{CHANGE}" in diff and diff == git(repo, "diff", "HEAD", "--binary")
    (repo / "untracked.txt").write_text("not code\n")  # untracked files are not part of the code, as before
    assert code_state(repo / "pkg") == (state, diff)
    elsewhere = tmp_path / "elsewhere" / "nplm_repro"  # no git, and no installed distribution holds it
    elsewhere.mkdir(parents=True)
    assert code_state(elsewhere) == ("unknown", "")


def changed_files(diff: str) -> set[str]:
    """The files a `git diff` changes, as paths from the repository's top."""
    return {line.split(" b/", 1)[1] for line in diff.splitlines() if line.startswith("diff --git a/")}


def test_the_code_is_the_package_its_configs_and_studies_not_the_reports_it_writes(tmp_path: Path) -> None:
    """The README's quickstart rewrites the tracked reports/quickstart.*: its later runs are of the same code, so not
    '+dirty'. A change to the package, hydra_plugins/, conf/, sweeps/ or pyproject.toml is, and the diff holds only
    those files."""
    needs_git_checkout()
    repo = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(ROOT), str(repo))
    commit, package = git(repo, "rev-parse", "HEAD").strip(), repo / "nplm_repro"
    (repo / "reports" / "quickstart.md").write_text("# rewritten by the quickstart\n")
    (repo / "reports" / "quickstart_claims.png").write_bytes(bytes(range(256)))
    (repo / "README.md").write_text("edited\n")
    assert code_state(package) == (commit, "")
    hydra_plugins = "hydra_plugins/nplm_repro_search/__init__.py"  # every nplm-train imports it
    codes = ("nplm_repro/__init__.py", hydra_plugins, "conf/config.yaml", "sweeps/quickstart.yaml", "pyproject.toml")
    for code in codes:
        with open(repo / code, "a") as f:
            f.write("# changed\n")
        state, diff = code_state(package)
        assert state == f"{commit}+dirty" and changed_files(diff) == {code}, diff[:2000]
        git(repo, "checkout", "--", code)
    (package / "new_module.py").write_text("untracked = True\n")  # untracked files are not part of the code
    assert code_state(package) == (commit, "")


def test_every_package_pyproject_installs_is_code() -> None:
    """What an installed nplm-train imports is every package pyproject.toml lists: each one's folder is the package
    (nplm_repro/, git's "." in `code_state`), or is under a path of RUNS_BESIDE (hydra_plugins/ was not)."""
    text = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools]")[1].split("\n[")[0]
    listed = re.findall(r'^\s+"([\w.]+)",', text.split("packages = [")[1].split("]")[0], re.MULTILINE)
    mapped = dict(re.findall(r'"([\w.]+)" = "([\w/]+)"', text.split("package-dir")[1]))
    beside = {spec.removeprefix(":(top)") for spec in RUNS_BESIDE}
    assert "hydra_plugins.nplm_repro_search" in listed and mapped == {"nplm_repro.conf": "conf"}
    for package in listed:
        folder = mapped.get(package) or package.replace(".", "/")
        assert folder.split("/")[0] == "nplm_repro" or folder.split("/")[0] in beside, package


def test_a_package_installed_inside_a_checkout_is_its_version_not_the_checkouts_commit(tmp_path: Path) -> None:
    """`pip install .` into a virtualenv inside a checkout: git, run in the installed package's folder, finds the
    checkout around it (ignored folder and all), but its HEAD and diff are not the code that runs. The run records
    the installed version, where pip installed it from (PEP 610's direct_url.json), never '+dirty'."""
    project = tmp_path / "checkout"
    commit = checkout(project)
    package = pip_install(project, project / ".venv" / "lib" / "site-packages")
    (project / "conf" / "local.yaml").write_text(CHANGE)  # the checkout is dirty
    assert git(package, "rev-parse", "HEAD").strip() == commit  # the trap: git sees the checkout from there
    version = importlib.metadata.version("nplm-repro")
    assert code_state(package) == (f"nplm-repro {version} (installed from {project.as_uri()})", "")


@pytest.mark.slow  # about 8-16 s: outside the default suite's 5 minutes
def test_a_run_from_a_dirty_tree_keeps_its_diff(brown_path: Path, tmp_path: Path) -> None:
    project = tmp_path / "checkout"
    commit = checkout(project)
    (project / "conf" / "local.yaml").write_text(CHANGE)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"PYTHONPATH": str(project)}
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [f"data.path={brown_path}", *SLICE, "experiment=kn3", f"tracking.uri={uri}"]
    result = run_script("nplm-train", *args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
    assert run.data.tags["git_commit"] == f"{commit}+dirty" and run.data.tags["mlflow.source.git.commit"] == commit
    patch = Path(
        mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="git_diff.patch", tracking_uri=uri)
    )
    assert patch.read_text() == redact(git(project, "diff", "HEAD", "--binary")) and SECRET not in patch.read_text()
    assert "+uri: postgresql+psycopg://***@db-host/nplm" in patch.read_text()


@pytest.mark.slow
def test_a_run_of_the_installed_package_in_a_dirty_checkout_records_its_version(tmp_path: Path) -> None:
    """The README's recipe for a wheel (`pip install .`) with the virtualenv inside a dirty checkout: the run records
    the installed version, no commit of MLflow's, no diff, so `nplm-report --require-clean` keeps it."""
    project = tmp_path / "checkout"
    checkout(project)
    site = pip_install(project, project / ".venv" / "lib" / "site-packages").parent
    (project / "conf" / "local.yaml").write_text(CHANGE)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"PYTHONPATH": str(site)}
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [f"data.path={TINY_BROWN}", *data_slice(5_000, 1_000, 1_000), "experiment=kn3", f"tracking.uri={uri}"]
    result = run_script("nplm-train", *args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
    version = importlib.metadata.version("nplm-repro")
    assert run.data.tags["git_commit"] == f"nplm-repro {version} (installed from {project.as_uri()})"
    assert "mlflow.source.git.commit" not in run.data.tags
    assert "git_diff.patch" not in [a.path for a in client.list_artifacts(run.info.run_id)]
    table = build(uri, "brown", "brown_table1", require_clean=True).table
    assert list(table.loc[table["status"] == "finished", "run_ids"]) == [run.info.run_id]  # kept, as clean


@pytest.mark.slow
@pytest.mark.postgres
def test_a_password_in_the_store_uri_reaches_neither_the_store_nor_the_logs(brown_path: Path, tmp_path: Path) -> None:
    """A run and a sweep recorded straight into PostgreSQL, the URI carrying the password (the throwaway cluster
    trusts every login, so any password works): no param, tag, artifact or log line of ours holds it."""
    from test_scaling import postgres

    with postgres() as bare:
        uri = bare.replace("nplm@", f"nplm:{SECRET}@")
        common = [f"data.path={brown_path}", *SLICE, "experiment=kn3", f"tracking.uri={uri}"]
        single = run_script("nplm-train", *common, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
        assert single.returncode == 0, single.stderr[-3000:]
        sweep = run_script("nplm-train", "-m", *common, f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
        assert sweep.returncode == 0, sweep.stderr[-3000:]
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
        job = next(r for r in runs if "sweep" not in r.data.tags)
        assert job.data.params["tracking.uri"] == uri.replace(f"nplm:{SECRET}@", "***@")
        config = mlflow.artifacts.load_text(f"{job.info.artifact_uri}/config.yaml")
        recorded = [config, (tmp_path / "run" / "train.log").read_text(), single.stdout, single.stderr]
        for run in runs:  # the job's and the sweep's parent
            recorded += [*run.data.params.values(), *run.data.tags.values()]
    assert len(runs) == 2 and not [text for text in recorded if SECRET in text]


def test_runs_that_log_one_corpus_at_once_all_link_to_it(tmp_path: Path) -> None:
    """A sweep's jobs start together and log the same corpus. MLflow's store checks, then inserts the dataset, so
    without a retry most of eight simultaneous runs fail on its unique key (the CI failure on PostgreSQL)."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("brown")
    runs = [client.create_run(experiment).info.run_id for _ in range(8)]
    source = Dataset("brown", "fingerprint", "local", '{"uri": "brown.zip"}')
    corpus = DatasetInput(source, tags=[InputTag(MLFLOW_DATASET_CONTEXT, "training")])
    together = threading.Barrier(len(runs))

    def log(run_id: str) -> None:
        together.wait()
        log_corpus(client, run_id, corpus)

    with ThreadPoolExecutor(len(runs)) as pool:
        list(pool.map(log, runs))
    linked = [[i.dataset.digest for i in client.get_run(run).inputs.dataset_inputs] for run in runs]
    assert linked == [["fingerprint"]] * len(runs)
