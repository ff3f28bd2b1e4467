"""Shared fixtures: the real Brown zip from ../shared/data (never downloaded)."""

from pathlib import Path

import pytest

from nplm_repro.data.corpus import Corpus, prepare_brown

BROWN = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "brown.zip"


@pytest.fixture(scope="session")
def brown_path() -> Path:
    assert BROWN.exists(), f"the tests need the real Brown zip at {BROWN}"
    return BROWN


@pytest.fixture(scope="session")
def brown(brown_path: Path) -> Corpus:
    """The full Brown stream as the paper cuts it."""
    return prepare_brown(str(brown_path))


@pytest.fixture(autouse=True)
def _no_tracking_uri_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI; put it back as it was after each test."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # records the value before the test, restored after it
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
