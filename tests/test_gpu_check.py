"""scripts/gpu_check.sh, the GPU check, on a machine without a GPU: one line saying so and exit 0, before it installs
anything (what it does with a GPU needs one: the script is its own test there)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def run_gpu_check(tmp_path: Path, path: str) -> subprocess.CompletedProcess:
    # no corpus there: a script that missed the GPU's absence would stop at it (exit 2), before installing anything
    env = {**os.environ, "PATH": path, "NPLM_SHARED": str(tmp_path / "no_shared")}
    return subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def assert_said_no_gpu(result: subprocess.CompletedProcess, why: str) -> None:
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert json.loads(line) == {"check": "gpu", "ok": True, "skipped": f"no NVIDIA GPU here ({why}): nothing to check"}


def test_gpu_check_without_nvidia_smi_says_so_and_passes(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi is installed here")
    assert_said_no_gpu(run_gpu_check(tmp_path, os.environ["PATH"]), "nvidia-smi is not installed")


def test_gpu_check_when_nvidia_smi_finds_no_gpu_says_so_and_passes(tmp_path: Path) -> None:
    """A driver without a device (or a container without one): nvidia-smi is there and fails."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
    )
    fake.chmod(0o755)
    assert_said_no_gpu(run_gpu_check(tmp_path, f"{fake.parent}:{os.environ['PATH']}"), "nvidia-smi finds none")
