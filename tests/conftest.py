"""Shared fixtures: the real corpora from $NPLM_SHARED/data (../shared/data unless set; never downloaded), each
test that needs one skipped with the reason when it is absent, and the tiny synthetic Brown always there.

The suite runs on pytest-xdist's workers, one per core (pyproject.toml: `-n auto --dist loadgroup`); `-n 0` runs
it in one process (a debugger, one test). Each worker, and every command a test starts, trains on one thread:
two workers of two threads each on two cores ran several times slower than one each. A test that asks for a
fixture shared wider than itself (module or session scope, other than the corpora's paths) runs on the worker of
every other test that asks for it, so that the fixture is made once (`pytest_collection_modifyitems`).
"""

import inspect
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import BROWN, TINY_BROWN, TREEBANK, Done, in_process

from nplm_repro import ask as nplm_ask
from nplm_repro import score as nplm_score
from nplm_repro.data.brown import prepare_brown
from nplm_repro.data.corpus import Corpus

if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"  # for the commands the tests start: torch's default is one per core
    torch.set_num_threads(1)

# The MLflow servers the tests start (`mlflow ui`, `mlflow server`) run without MLflow's job execution: its job runner
# and huey consumers (8 processes a server, each importing MLflow) serve GenAI jobs this project never submits.
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # Started in the background (`nohup pytest &`), pytest ignores Ctrl-C and so would the commands it starts,
    # which the recovery tests interrupt with it; a handler of our own is reset to the default in each child.
    signal.signal(signal.SIGINT, signal.default_int_handler)


TESTS = Path(__file__).resolve().parent
CHEAP = {"brown_path", "treebank", "tiny_brown_path"}  # shared fixtures that cost nothing to make again


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test that asks for a fixture of module or session scope (not CHEAP) joins that fixture's xdist group:
    its module's for a module fixture, the fixture's own for a session one; --dist loadgroup runs a group on one
    worker, so the fixture is made once."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        for name in info.names_closure if info else ():
            definitions = info.name2fixturedefs.get(name)
            ours = definitions and Path(inspect.getfile(definitions[-1].func)).is_relative_to(TESTS)
            if not ours or name in CHEAP or definitions[-1].scope not in ("module", "package", "session"):
                continue  # pytest's own (tmp_path_factory), a cheap one, or one made for each test
            scope = definitions[-1].scope
            group = item.module.__name__ if scope == "module" else name
            item.add_marker(pytest.mark.xdist_group(group))
            break


def shared_corpus(path: Path, what: str) -> Path:
    """`path` if the file is there, else skip the test that needs it, saying where it was looked for."""
    if not path.is_file():
        pytest.skip(f"{what} not found at {path}: set NPLM_SHARED to the folder whose data/ holds {path.name}")
    return path


@pytest.fixture(scope="session")
def brown_path() -> Path:
    """The real Brown zip (NLTK's brown.zip)."""
    return shared_corpus(BROWN, "the Brown corpus")


@pytest.fixture(scope="session")
def treebank() -> Path:
    """The real WSJ sample (NLTK's treebank.zip)."""
    return shared_corpus(TREEBANK, "the Penn Treebank sample")


@pytest.fixture(scope="session")
def tiny_brown_path() -> Path:
    """A synthetic corpus of about 11k tokens in brown.zip's layout, committed with the tests: for tests that need
    some Brown-format corpus, not Brown's numbers."""
    assert TINY_BROWN.is_file(), f"{TINY_BROWN} is missing: python tests/data/make_tiny_brown.py writes it"
    return TINY_BROWN


@pytest.fixture(scope="session")
def brown(brown_path: Path) -> Corpus:
    """The full Brown stream as the paper cuts it."""
    return prepare_brown(str(brown_path))


@pytest.fixture(autouse=True)
def _no_tracking_uri_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI; put it back as it was after each test."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # records the value before the test, restored after it
    monkeypatch.delenv("MLFLOW_TRACKING_URI")


@pytest.fixture
def score(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> Callable[..., Done]:
    """`nplm-score` run in this process: `score(workdir, *args)` gives its exit code, stdout and stderr."""
    return in_process(nplm_score.main, "nplm-score", monkeypatch, capsys)


@pytest.fixture
def ask(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> Callable[..., Done]:
    """`nplm-ask` run in this process, as `score`."""
    return in_process(nplm_ask.main, "nplm-ask", monkeypatch, capsys)
