"""Shared fixtures: the real corpora from $NPLM_SHARED/data (../shared/data unless set; never downloaded), each
test that needs one skipped with the reason when it is absent, and the tiny synthetic Brown always there."""

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import BROWN, TINY_BROWN, TREEBANK, Done, in_process

from nplm_repro import ask as nplm_ask
from nplm_repro import score as nplm_score
from nplm_repro.data.brown import prepare_brown
from nplm_repro.data.corpus import Corpus

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # Started in the background (`nohup pytest &`), pytest ignores Ctrl-C and so would the commands it starts,
    # which the recovery tests interrupt with it; a handler of our own is reset to the default in each child.
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
