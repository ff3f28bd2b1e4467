"""Bad input found by trying it (issue 41): each is one line `prog: error: ...` and exit 2, at once, with nothing
left behind (no store, no lock file, no run); and an error, or an interrupt, is the last line of a command's output,
on a line of its own, however the output is kept. Real commands on tests/data/tiny_brown.zip, real stores."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import Done, composed, console_script, data_slice, run_script
from hydra import compose, initialize_config_module

from nplm_repro.bench import check_bench
from nplm_repro.errors import NplmError
from nplm_repro.serving.scoring import RunScorer
from nplm_repro.tracking import ledger

TINY = data_slice(5_000, 1_000, 1_000)  # of tiny_brown.zip's 10,973 tokens
Run = tuple[Path, str, str]  # the folder, the store and the run id
RETRIED = "Operation will be retried"  # MLflow's warning before each of its ten retries to reach a store (~110 s)


@pytest.fixture(scope="module")
def mlp(tiny_brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One short MLP5 run (a validation, so a Model) on the tiny corpus."""
    workdir = tmp_path_factory.mktemp("bad_input")
    uri = f"sqlite:///{workdir}/mlflow.db"
    overrides = [f"data.path={tiny_brown_path}", *TINY, "trainer.max_epochs=1", "trainer.limit_train_batches=5"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)  # MLflow keeps artifacts under ./mlruns
        checkpoints = f"callbacks.model_checkpoint.dirpath={workdir}/c"
        run_id, _ = ledger.run(composed("experiment=mlp5", *overrides, f"tracking.uri={uri}", checkpoints))
    return workdir, uri, run_id


def refused(done: Done | subprocess.CompletedProcess, prog: str = "nplm-ask") -> str:
    """The one line of a command refused as bad input (exit 2), without its `prog: error: `."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), done.stderr[-3000:]
    return lines[0].removeprefix(f"{prog}: error: ")


def test_each_word_is_asked_as_itself_and_labels_its_own_neighbours(mlp: Run, ask: Callable[..., Done]) -> None:
    """The words were joined and read again as one text: a word read as no token or as several shifted every label
    after it. `<unk>` is an entry of the vocabulary like any other."""
    workdir, uri, run_id = mlp
    words = ["of", "<unk>", "the", ".", "<eop>"]
    done = ask(workdir, "neighbours", run_id, *words, "--k", "3", "--tracking-uri", uri)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().split("\n")[1:]
    assert [line.split(": ")[0] for line in lines] == words
    for word, line in zip(words, lines):
        alone = ask(workdir, "neighbours", run_id, word, "--k", "3", "--tracking-uri", uri)
        assert alone.stdout.strip().split("\n")[1] == line


@pytest.mark.parametrize(
    ("words", "error"),
    [
        ([""], "neighbours: '' is no word"),
        (["of", "", "the", "was"], "neighbours: '' is no word"),
        (["of", "  "], "neighbours: '  ' is no word"),
        (["of the"], "neighbours: 'of the' reads as 2 words of the run (of the): name one word each"),
        (["of", "thw"], "'thw' is not in the run's vocabulary"),
    ],
)
def test_an_empty_word_or_one_that_is_not_one_word_is_refused(
    mlp: Run, ask: Callable[..., Done], words: list[str], error: str
) -> None:
    workdir, uri, run_id = mlp
    assert refused(ask(workdir, "neighbours", run_id, *words, "--tracking-uri", uri)).startswith(error)


def test_k_beyond_the_vocabulary_is_refused_naming_its_size(mlp: Run, ask: Callable[..., Done]) -> None:
    workdir, uri, run_id = mlp
    size = len(RunScorer(uri, run_id).corpus.vocab)
    most = ask(workdir, "neighbours", run_id, "the", "--k", str(size - 1), "--tracking-uri", uri)
    assert most.returncode == 0 and len(re.findall(r" -?\d\.\d\d(?=, |$)", most.stdout.split("\n")[1])) == size - 1
    line = refused(ask(workdir, "neighbours", run_id, "the", "--k", "100000", "--tracking-uri", uri))
    assert line == f"--k 100000: the run's vocabulary has {size:,} words, so a word has at most {size - 1:,} neighbours"


@pytest.mark.parametrize("temperature", ["nan", "inf", "-1"])
def test_a_temperature_that_is_not_a_finite_number_at_least_0_is_refused(
    temperature: str, tmp_path: Path, ask: Callable[..., Done]
) -> None:
    """nan was a RuntimeError from torch (exit 1); inf was taken. Checked before any store is read."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = ask(tmp_path, "generate", "0" * 32, "--temperature", temperature, "--tracking-uri", uri)
    assert (
        refused(done) == f"--temperature {float(temperature)}: must be a finite number >= 0 (0: the most probable word)"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_commands_that_read_a_run_name_it_with_the_same_options(
    tmp_path: Path, ask: Callable[..., Done], score: Callable[..., Done]
) -> None:
    """nplm-score and nplm-ask's three subcommands take --row, --study, --seed and --experiment from one declaration
    (cli.py's `run_arguments`): nplm-ask's --seed was the seed of generate's draws, now --draw-seed. Its old
    --run-seed is read (the store is looked for) but not listed; a seed given two ways, or with a run id that names
    the run already, is one line before any store is opened."""
    named = {"--row", "--study", "--seed", "--experiment"}
    commands = [ask(tmp_path, command, "--help") for command in ("generate", "neighbours", "features")]
    for done in (*commands, score(tmp_path, "--help")):
        assert done.returncode == 0 and named <= set(re.findall(r"--[\w-]+", done.stdout)), done.stdout
        assert "--run-seed" not in done.stdout
    assert "--draw-seed" in commands[0].stdout

    none, run_id = f"sqlite:///{tmp_path}/none.db", "0" * 32
    row = ["--row", "MLP1", "--study", "adhoc"]
    cases = {
        ("neighbours", *row, "--seed", "1", "--run-seed", "2", "the"): "--seed 1 and --run-seed 2 name two seeds",
        ("generate", run_id, "--seed", "2"): "--seed 2 picks a seed's run of --row: the draws' seed is --draw-seed",
        ("features", run_id, "--run-seed", "2"): "--run-seed 2 picks a seed's run of --row: a run id names its run",
        ("features", "--row", "MLP1", "--seed", "2"): "--row needs --study: the study whose row it is",
    }
    for args, words in cases.items():
        assert refused(ask(tmp_path, *args, "--tracking-uri", none)).startswith(words)
    done = score(tmp_path, run_id, "--seed", "2", "--tracking-uri", none)
    assert refused(done, "nplm-score") == "--seed 2 picks a seed's run of --row: a run id names its run already"
    assert list(tmp_path.iterdir()) == []  # no store opened
    same = ask(tmp_path, "features", *row, "--seed", "2", "--run-seed", "2", "--tracking-uri", none)
    assert same.stderr.splitlines() == [
        "nplm-ask: warning: --run-seed is deprecated: use --seed (it will be removed in the next release)",
        f"nplm-ask: error: no tracking store at {tmp_path}/none.db: pass --tracking-uri",
    ]


def left_behind(folder: Path) -> list[str]:
    """What a refused command left in `folder` that a store makes: a database, a lock, artifacts."""
    return sorted(str(p) for p in folder.rglob("*") if p.suffix in (".db", ".lock") or p.name == "mlruns")


@pytest.mark.parametrize(
    ("uri", "error"),
    [
        ("sqlite:///", "tracking store 'sqlite:///' names no database file, so the run would be kept in memory"),
        (
            "sqlite:///{tmp}/store",
            "tracking store 'sqlite:///{tmp}/store': {tmp}/store is a folder, not a database file",
        ),
        (
            "postgresql://nplm:secret@127.0.0.1:1/nplm",
            "tracking store 'postgresql://***@127.0.0.1:1/nplm' is unreachable: (psycopg.OperationalError) connection",
        ),
    ],
)
def test_a_store_uri_that_cannot_hold_a_run_is_one_line_at_once(
    uri: str, error: str, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """`sqlite:///` went into an in-memory database, exit 0 and the run lost; a folder, or a database that refuses
    the connection, took MLflow's ten retries: about 110 s and 40 lines of warnings, and a folder left `<folder>.lock`
    beside it. (A database that does not answer at all is bounded by its 10 s connect timeout.)"""
    (tmp_path / "store").mkdir()
    uri, error = uri.format(tmp=tmp_path), error.format(tmp=tmp_path)
    result = run_script(
        "nplm-train",
        "experiment=kn3",
        f"data.path={tiny_brown_path}",
        *TINY,
        f"tracking.uri={uri}",
        f"hydra.run.dir={tmp_path}/out",
        cwd=tmp_path,
        timeout=120,
    )
    assert RETRIED not in result.stderr  # at once: MLflow says so before each of its retries
    assert refused(result, "nplm-train").startswith(error)
    assert left_behind(tmp_path) == [] and list((tmp_path / "store").iterdir()) == []


@pytest.mark.parametrize(
    ("uri", "error"),
    [
        ("sqlite://", "tracking store 'sqlite://' names no database file"),
        ("sqlite:///:memory:", "tracking store 'sqlite:///:memory:' names no database file"),
        (
            "sqlite:///{tmp}/notes.txt",
            "tracking store 'sqlite:///{tmp}/notes.txt' is unusable: {tmp}/notes.txt: file is",
        ),
        (
            "mysql://nplm:secret@127.0.0.1:1/nplm",
            "tracking store 'mysql://***@127.0.0.1:1/nplm': cannot load the database driver of mysql:// (No module",
        ),
    ],
)
def test_other_store_uris_that_cannot_hold_a_run_are_one_line_at_once(
    uri: str, error: str, tmp_path: Path, ask: Callable[..., Done], caplog: pytest.LogCaptureFixture
) -> None:
    """The same checks for every command (nplm-ask here, in this process): a file that is no SQLite database, and a
    database whose driver is not installed (MySQLdb, which no test environment has), stop before MLflow retries."""
    (tmp_path / "notes.txt").write_text("not a database\n")
    uri, error = uri.format(tmp=tmp_path), error.format(tmp=tmp_path)
    retries = logging.getLogger("mlflow.store.db.utils")  # MLflow's retries warn there, before each one
    retries.addHandler(caplog.handler)
    try:
        done = ask(tmp_path, "neighbours", "0" * 32, "the", "--tracking-uri", uri)
    finally:
        retries.removeHandler(caplog.handler)
    assert not [r for r in caplog.records if RETRIED in r.getMessage()]  # at once
    assert refused(done).startswith(error)
    assert left_behind(tmp_path) == [] and (tmp_path / "notes.txt").read_text() == "not a database\n"


@pytest.mark.slow  # a command's start-up and more: seconds each
def test_a_value_hydra_cannot_read_unquoted_says_how_to_quote_it(tmp_path: Path) -> None:
    """Hydra's lexer refuses ü or a dash — in an unquoted value with only `LexerNoViableAltException: note=über`."""
    result = run_script("nplm-train", "note=über", "+x.y=a—b", cwd=tmp_path)
    assert refused(result, "nplm-train") == (
        "LexerNoViableAltException: note=über (a value with characters other than ASCII letters, digits, spaces and "
        "_-./ needs quotes: 'note=\"...\"')"
    )
    quoted = run_script("nplm-train", 'note="über — a test"', "--cfg", "job", cwd=tmp_path)  # as the hint says
    assert quoted.returncode == 0 and "note: über — a test\n" in quoted.stdout, quoted.stderr[-3000:]


@pytest.mark.slow  # a command's start-up: seconds
def test_a_study_that_does_not_exist_lists_the_studies_and_where_ones_own_goes(tmp_path: Path) -> None:
    """It was Hydra's bare "In 'config': Could not find 'study/mystudy'"."""
    line = refused(run_script("nplm-train", "-m", "study=mystudy", cwd=tmp_path), "nplm-train")
    assert line.startswith("In 'config': Could not find 'study/mystudy' (the studies: ap_table2, brown_batch, "), line
    assert "quickstart; a study of your own is one file, <dir>/study/<name>.yaml" in line and "docs/studies.md" in line


def test_a_bench_list_given_one_name_is_that_names_list() -> None:
    """`bench.what=matmul` (a string to Hydra) was read letter by letter: "unknown ['a', 'l', 'm', 't', 'u']"."""
    with initialize_config_module(config_module="nplm_repro.conf", version_base="1.3"):
        cfg = compose("bench", overrides=["bench.what=matmul", "bench.precisions=auto", "bench.ngram_rows=kn3"])
        unknown = compose("bench", overrides=["bench.what=speed"])
    check_bench(cfg.bench)
    assert (list(cfg.bench.what), list(cfg.bench.precisions), list(cfg.bench.ngram_rows)) == (
        ["matmul"],
        ["auto"],
        ["kn3"],
    )
    with pytest.raises(NplmError, match=r"^bench.what: unknown \['speed'\] \(known: matmul, baseline, "):
        check_bench(unknown.bench)


def last_line(output: str) -> str:
    """The last non-empty line of a command's output as a file keeps it: lines end at a newline only, so a line a
    progress bar drew over with a carriage return is one line with it."""
    return [line for line in output.split("\n") if line.strip()][-1]


@pytest.mark.slow  # over 10 s
def test_an_error_is_the_last_line_of_the_output_on_its_own(tiny_brown_path: Path, tmp_path: Path) -> None:
    """stdout and stderr into one file: a diverging MLP's error came glued to the end of its progress bar
    (`...tok/s=33,576]nplm-train: error: ...`), and the bar was drawn once more after it, at exit. Its diverged loss
    (NaN, or past any float64 perplexity) is caught at the step that made it, not by the validation after the epoch
    (a full epoch of NaNs)."""
    train = [console_script("nplm-train"), "experiment=mlp3", "optim.lr=1e6", f"data.path={tiny_brown_path}", *TINY]
    train += [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/out"]
    with open(tmp_path / "output.log", "w") as log:
        result = subprocess.run(train, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, timeout=120)
    output = (tmp_path / "output.log").read_text()
    assert result.returncode == 2 and "Epoch 0: " in output  # a bar was drawn
    last = last_line(output)  # a training step's loss, nan or past float64: caught at that step, not after the epoch
    assert re.match(r"nplm-train: error: training loss is \S+ at epoch 0, step \d+: the model diverged", last), last
    assert last.endswith("the model diverged (try a smaller optim.lr)")
    assert last_line(output).endswith(": the model diverged (try a smaller optim.lr)")


@pytest.mark.slow  # a command's start-up and more: seconds each
def test_an_interrupt_is_the_last_line_of_the_output_on_its_own(tiny_brown_path: Path, tmp_path: Path) -> None:
    """Ctrl-C while an MLP trains, its output in one file: the bar open when the command stopped was drawn again at
    exit, after the `interrupted` line."""
    train = [console_script("nplm-train"), "experiment=mlp3", f"data.path={tiny_brown_path}", *TINY]
    train += ["trainer.max_epochs=500", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/out"]
    output = tmp_path / "output.log"
    with open(output, "wb") as log:
        process = subprocess.Popen(train, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while b"Epoch 1:" not in output.read_bytes():  # a bar is drawn, and training is on
            assert process.poll() is None and time.monotonic() < deadline, output.read_text()[-3000:]
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 130
    assert last_line(output.read_text()) == (
        "nplm-train: interrupted (any run it was recording is now KILLED; the same command resumes it)"
    )


LEAK = """
import os, sys
import multiprocessing
from joblib.externals.loky.backend.context import get_context
from nplm_repro.cli import quiet
if sys.argv[1] == "quiet":
    quiet()
held = multiprocessing.get_context("spawn").Lock(), get_context("loky").Lock()  # each registered with a tracker
print("made", flush=True)
os._exit(0)  # as joblib ends a sweep's workers on Ctrl-C: nothing released
"""


def test_the_resource_trackers_say_nothing_after_a_commands_last_line() -> None:
    """Python's and loky's resource trackers warn, once the process they served is gone, of each semaphore it left:
    after a sweep's `interrupted` line. Every command silences that warning for the processes it starts."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # which `quiet` in this process set
    plain, quieted = (
        subprocess.run([sys.executable, "-c", LEAK, how], capture_output=True, text=True, timeout=60, env=env)
        for how in ("plain", "quiet")
    )
    assert "leaked semaphore objects" in plain.stderr and "leaked semlock objects" in plain.stderr
    assert (quieted.stdout, quieted.stderr) == ("made\n", "")


@pytest.mark.slow  # over 10 s
def test_a_model_key_on_a_mixed_row_says_which_of_its_rows_has_it(tmp_path: Path) -> None:
    """`experiment=mlp2 model.h=16` got Hydra's bare "Key 'h' is not in struct": MLP2 has no h of its own."""
    result = run_script("nplm-train", "experiment=mlp2", "model.h=16", cwd=tmp_path)
    assert refused(result, "nplm-train") == (
        "Could not override 'model.h': Key 'h' is not in struct (MLP2 is a mixture of the rows MLP1 and Del. Int., "
        "which mixes their finished runs: model.h belongs to the run of MLP1 (experiment=mlp1), run by its own command)"
    )
    result = run_script("nplm-train", "experiment=mlp2", "model.hh=16", cwd=tmp_path)
    assert refused(result, "nplm-train").endswith("model.hh is a key of none of their models either)")
    assert list(tmp_path.iterdir()) == []  # no store, no output folder
