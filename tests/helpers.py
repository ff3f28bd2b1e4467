"""What the tests share: the project's folders, where the real corpora are, Hydra composition of conf/, the data
slices that keep real runs short, and the installed console scripts run as a user runs them.

`from helpers import ...` works in every test module and in conftest.py: pyproject.toml puts tests/ on pytest's
`pythonpath`. The real corpora are optional: conftest.py's fixtures skip the tests that need them when they are
absent; tests/data/tiny_brown.zip (written by tests/data/make_tiny_brown.py) is always there.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig
from warm import WARMED

from nplm_repro.reporting.intervals import Evidence, TextSums

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SWEEPS = ROOT / "sweeps"
PAPER = ROOT / "nplm_repro" / "paper"  # the paper's tables, as the report reads them

# The real corpora, in the NLTK data format: NPLM_SHARED names the folder whose data/ holds them (../shared from
# the project's root unless set). Never downloaded by the tests.
SHARED = Path(os.environ.get("NPLM_SHARED") or ROOT.parent / "shared").expanduser()
BROWN = SHARED / "data" / "brown.zip"  # Brown Corpus, Form C (tagged), 500 texts
TREEBANK = SHARED / "data" / "treebank.zip"  # Penn Treebank sample (WSJ), raw and tagged
TINY_BROWN = Path(__file__).resolve().parent / "data" / "tiny_brown.zip"  # synthetic, in brown.zip's layout


def data_slice(train: int, valid: int, test: int) -> list[str]:
    """The overrides that cut the corpus to these split sizes (tokens)."""
    return [f"data.split.train={train}", f"data.split.valid={valid}", f"data.split.test={test}"]


SLICE = data_slice(20_000, 4_000, 4_000)  # the usual slice of Brown: 28k tokens, texts ca01..ca13
SLICE_5K = data_slice(20_000, 5_000, 5_000)  # the sweeps' slice


def slice_texts(brown_path: Path, into: Path) -> Path:
    """SLICE's texts (ca01..ca13) unzipped into the folder `into`/brown, so that a run reads those and not all 500."""
    folder = into / "brown"
    folder.mkdir()
    with zipfile.ZipFile(brown_path) as archive:
        for text in (f"ca{i:02}" for i in range(1, 14)):
            (folder / text).write_bytes(archive.read(f"brown/{text}"))
    return folder


def composed(*overrides: str, hydra_config: bool = False) -> DictConfig:
    """conf/config.yaml composed by Hydra with these overrides, as nplm-train composes it: from the installed package
    nplm_repro.conf (conf/ itself in an editable install). With `hydra_config`, Hydra's own config too (`hydra`)."""
    with initialize_config_module(config_module="nplm_repro.conf", version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_config)


def composed_study(study: str, *overrides: str) -> DictConfig:
    """A study, sweeps/<study>.yaml, composed as `nplm-train -m study=<study>` composes it, Hydra's config included."""
    return composed(f"study={study}", *overrides, hydra_config=True)


def console_script(name: str) -> str:
    """The installed console script `name` (nplm-train, nplm-report, nplm-bench) of this interpreter's venv."""
    return str(Path(sys.executable).parent / name)


def run_script(
    name: str, *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run an installed console script as a user runs it, in a process of its own; its output is captured as text
    and its exit code left to the caller. Without `env` it gets this process's environment less MLFLOW_TRACKING_URI
    (which mlflow.set_tracking_uri in a test exports): pass tracking.uri / --tracking-uri to choose the store. The
    project's own commands are forked from a warm interpreter that has imported them (warm.py)."""
    return run_command([console_script(name), *args], cwd=cwd, timeout=timeout, env=env)


def run_command(
    command: list[str], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`run_script` for a command given whole (`[console_script(name), *args]`)."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    if WARMED.runs(command) and not WARMED.fresh(env):  # its own process, its imports done (warm.py)
        return WARMED.run(command, cwd, env, timeout)
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False)


STACKS = {"PYTHONFAULTHANDLER": "1"}  # a command started with these prints every thread's stack on SIGABRT


def ends_within(process: subprocess.Popen, seconds: float, log: Path) -> int:
    """`process`'s exit code if it ends within `seconds`. Else the test fails showing where it and the processes it
    started are stuck: started with STACKS in its environment and its output (and theirs) going to `log`, each is
    sent SIGABRT, on which Python writes the stack of every thread (faulthandler); the failure message gives the
    log's last lines before the stacks and each thread's most recent calls (`stacks`)."""
    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        tree = [psutil.Process(process.pid)]
        with contextlib.suppress(psutil.Error):
            tree += tree[0].children(recursive=True)
        for each in tree:
            with contextlib.suppress(psutil.Error):
                each.send_signal(signal.SIGABRT)
        psutil.wait_procs(tree, timeout=30)
        command = Path(process.args[0]).name
        stuck = f"{command} still running {seconds:.0f} s on; its processes' stacks:\n{stacks(log.read_text())}"
    pytest.fail(stuck, pytrace=False)  # out of the except: no traceback of the timeout before the stacks


def stacks(output: str, frames: int = 6) -> str:
    """faulthandler's dumps in `output`, each thread's `frames` most recent calls, after the last 12 lines before
    them that are not progress bars."""
    start = output.find("Fatal Python error")
    shown = (re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line) for line in output[: max(start, 0)].splitlines())
    before = [line for line in shown if line.strip() and "it/s" not in line][-12:]  # no progress bars
    kept, depth = [], 0
    for line in output[start:].splitlines() if start >= 0 else []:
        if re.match(r"(Fatal Python error|Thread 0x|Current thread 0x)", line):
            kept.append(line)
            depth = 0
        elif line.startswith("  File ") and depth < frames:
            kept.append(line)
            depth += 1
    return "\n".join([*before, *kept])


def check_loaded_model(uri: str, run_id: str, context: str, cwd: Path) -> None:
    """The run's MLflow Model, loaded in a fresh Python process as a user loads it, answers for `context` what the
    run rebuilt in this process computes: ln P(the) and the 3 most probable next words."""
    import json

    import torch

    from nplm_repro.serving.scoring import RunScorer

    code = (
        "import json, mlflow, pandas as pd\n"
        f"mlflow.set_tracking_uri({uri!r})\n"
        f"model = mlflow.pyfunc.load_model('runs:/{run_id}/model')\n"
        f"out = model.predict(pd.DataFrame({{'context': [{context!r}], 'next_word': ['the']}}), params={{'k': 3}})\n"
        "print(json.dumps({'words': list(out['words'][0]), 'logprob': float(out['logprob'][0])}))\n"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, check=True)
    answer = json.loads(found.stdout.strip().splitlines()[-1])
    scorer = RunScorer(uri, run_id)
    with torch.no_grad():
        logp = scorer.model().next_logprobs([scorer.words(context)])[0].double()
    assert answer["logprob"] == pytest.approx(float(logp[scorer.corpus.vocab.index("the")]), rel=1e-5)
    assert answer["words"] == [scorer.corpus.vocab[i] for i in logp.topk(3).indices]


def sweep_output(result: subprocess.CompletedProcess, workdir: Path) -> str:
    """What a sweep run in `workdir` said: its own output, then its jobs' (joblib's jobs write to their output.log)."""
    newest = max(workdir.glob("multirun/*/*"), default=None)
    jobs = sorted(newest.glob("*/output.log")) if newest else []
    return result.stdout + result.stderr + "".join(p.read_text() for p in jobs)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a server a test starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def evidence_of(
    table: pd.DataFrame, noise: float = 0.0, spread: float = 0.05, texts: int = 100, seed: int = 0
) -> Evidence:
    """Kept scores for the finished rows of a report's `table`, made up so that each row's test perplexity over all
    texts is exactly its `test_ppl`: texts of 1,000 tokens, each text harder or easier for every row alike by a
    factor of relative std `spread` (as real texts are), plus per row and text an independent `noise` (a relative
    change of its log-probability)."""
    rng = np.random.default_rng(seed)
    tokens = np.full(texts, 1000.0)
    shared = 1 + spread * rng.standard_normal(texts)
    sums = {}
    for row in table[table["status"] == "finished"].itertuples():
        factor = shared * (1 + noise * rng.standard_normal(texts))
        factor /= factor.mean()  # equal token counts: the row's perplexity over all texts is then its own
        logprob = -np.log(row.test_ppl) * tokens * factor
        sums[row.label] = {"test": [TextSums(tuple(range(texts)), logprob, tokens)], "valid": []}
    return Evidence(sums, {})


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def in_process(
    main: Callable[[], None], name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> Callable[..., Done]:
    """A console script run in this process (its import costs seconds): its exit code, stdout and stderr."""

    def run(workdir: Path, *args: str) -> Done:
        monkeypatch.setenv("HYDRA_FULL_ERROR", "")  # restored after the test: the CLI wrapper sets it
        monkeypatch.chdir(workdir)
        monkeypatch.setattr(sys, "argv", [name, *args])
        code = 0
        try:
            main()
        except SystemExit as exit_:
            code = exit_.code
        out = capsys.readouterr()
        return Done(code, out.out, out.err)

    return run
