"""Real Hydra composition of conf/, and bad keys or values refused with one line and a non-zero exit."""

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import composed, console_script, run_command
from omegaconf import OmegaConf

from nplm_repro.checks import check_resolves
from nplm_repro.errors import NplmError, one_line
from nplm_repro.tracking.config_checks import check_config


@pytest.mark.parametrize(
    "row,n,h,m,direct",
    [
        ("mlp1", 5, 50, 60, True),
        ("mlp3", 5, 0, 60, True),
        ("mlp5", 5, 50, 30, True),
        ("mlp7", 3, 50, 30, True),
        ("mlp9", 5, 100, 30, False),
    ],
)
def test_experiment_files_set_the_papers_rows(row: str, n: int, h: int, m: int, direct: bool) -> None:
    cfg = composed(f"experiment={row}")
    assert (cfg.row, cfg.model.n, cfg.model.h, cfg.model.m, cfg.model.direct) == (row.upper(), n, h, m, direct)
    check_config(cfg)


def test_defaults_are_the_papers_brown_setup() -> None:
    cfg = composed()
    assert cfg.data.split.train == 800_000 and cfg.data.split.valid == 200_000 and cfg.data.split.test is None
    assert cfg.data.max_unk_freq == 3 and cfg.data.vocab_from == "stream"
    assert cfg.optim.weight_decay == 1e-4
    paper = composed("optim=paper").optim
    assert (paper.lr, paper.decay_rate) == (1e-3, 1e-8)


def test_tracking_uri_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert composed().tracking.uri == "sqlite:///mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert composed().tracking.uri == "http://127.0.0.1:5000"
    assert composed("tracking.uri=sqlite:///x.db").tracking.uri == "sqlite:///x.db"


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.n=1", "model.n"),
        ("model.m=0", "model.m"),
        ("model.h=-1", "model.h"),
        ("model.n=2.5", "model.n"),
        ("optim.weight_decay=-1", "optim.weight_decay"),
        ("optim.batch_size=0", "optim.batch_size"),
        ("optim.recipe=magic", "optim.recipe"),
        ("data.vocab_from=test", "data.vocab_from"),
        ("optim.plateau_factor=1.5", "optim.plateau_factor"),
        ("experiment=mlp2 model.mode=half", "model.mode"),
        ("data.split.test=0", "data.split.test"),
        ("trainer.precision=16-mixed", "trainer.precision"),
        ("optim.lr=-1", "optim.lr"),
        ("trainer.max_epochs=0", "trainer.max_epochs"),
        ("trainer.max_steps=0", "trainer.max_steps"),
    ],
)
def test_out_of_range_values_name_the_key(override: str, key: str) -> None:
    with pytest.raises(NplmError, match=rf"^{key}="):
        check_config(composed(*override.split()))


def test_no_limit_is_minus_one() -> None:
    check_config(composed("trainer.max_epochs=-1", "trainer.max_steps=1000"))


def test_h0_without_direct_is_refused() -> None:
    with pytest.raises(NplmError, match="model.h=0 needs model.direct=true"):
        check_config(composed("model.h=0", "model.direct=false"))


# Each case starts nplm-train (about 6 s): two in the default suite, the others with the slow tests.
BAD_CONFIGS = [
    ("model.size=3", "Could not override 'model.size'"),
    ("model.h=0", "model.h=0 needs model.direct=true"),
    ("model.n=1", "model.n=1 is invalid"),
    ("experiment=mlp99", "Could not find 'experiment/mlp99'"),
    ("+experiment=mlp5", "write experiment=<row>, without the +"),  # the form before experiment: null
    ("seed=-1", "seed=-1 is invalid: expected an integer from 0 to 4294967295"),  # numpy's bounds
    ("seed=4294967296", "seed=4294967296 is invalid: expected an integer from 0 to 4294967295"),
    (
        "optim.batch_size=100000000",
        "optim.batch_size=100000000 is larger than the training split (data.split.train=800000)",
    ),
    (
        "note=costs ${oops}",
        (
            r"note='costs ${oops}' cannot be resolved: Interpolation key 'oops' not found; "
            r"a literal ${ is written \${: 'note=costs \${oops}'"
        ),
    ),
    ("hydra.run.dir=/proc/nope", "hydra.run.dir=/proc/nope: cannot create this directory (No such file or"),
]


@pytest.mark.parametrize(
    "override,message",
    [*BAD_CONFIGS[:1], *(pytest.param(*case, marks=pytest.mark.slow) for case in BAD_CONFIGS[1:])],
)
def test_cli_bad_config_is_one_line_and_nonzero_exit(override: str, message: str, tmp_path: Path) -> None:
    extra = ["model.direct=false"] if override == "model.h=0" else []
    command = [sys.executable, "-m", "nplm_repro.train", override, *extra, f"tracking.uri=sqlite:///{tmp_path}/m.db"]
    result = run_command(command, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("train.py: error:")
    assert not (tmp_path / "m.db").exists()  # nothing was written to the store


def test_a_literal_dollar_brace_is_written_as_the_error_says() -> None:
    """The advice of the error above, `\\${`, gives the text as typed; an interpolation that resolves stays one."""
    assert composed(r"note=costs \${oops}").note == "costs ${oops}"
    check_resolves(OmegaConf.create({"note": r"costs \${oops}", "seed": 3, "copy": "${seed}"}))


def test_an_interpolation_that_does_not_resolve_names_its_key_wherever_it_is() -> None:
    cfg = OmegaConf.create({"data": {"drop_lines": ["a", "x ${nowhere}"]}})
    with pytest.raises(NplmError, match=r"^data.drop_lines\[1\]='x \$\{nowhere\}' cannot be resolved: "):
        check_resolves(cfg)


def test_a_batch_of_the_whole_training_split_is_allowed() -> None:
    check_config(composed("debug=default", "optim.batch_size=20000"))


@pytest.mark.slow  # four starts of nplm-train
def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path: Path) -> None:
    """Two nplm-train started together, as from two terminals: to the second, they shared a run folder (and with it
    checkpoints/best.ckpt), and two sweeps a sweep folder (and with it their parent runs' name)."""
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        command = [console_script("nplm-train"), "--cfg", "hydra", "--resolve", "-p", key]
        started = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, text=True) for _ in range(2)]
        folders = {process.communicate(timeout=60)[0].strip() for process in started}
        assert len(folders) == 2, folders


def test_an_mlp_with_a_mixture_says_where_mixtures_are_now() -> None:
    """`model.mix` left the MLP's config: a mixed row is a mixture of rows; an old override is told so."""
    with pytest.raises(NplmError, match=r"^model.mix: an MLP mixed with the interpolated trigram is a row of its own"):
        check_config(composed("experiment=mlp3", "+model.mix=fixed"))


def test_an_error_whose_cause_repeats_it_is_said_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """OmegaConf chains its own message as its error's cause when a tracer runs (a debugger, coverage.py) or
    OC_CAUSE=1: the one line said it twice."""
    monkeypatch.setenv("OC_CAUSE", "1")
    with pytest.raises(Exception) as raised:
        OmegaConf.create({"note": "${oops}"}).note
    assert raised.value.__cause__ is not None
    assert one_line(raised.value) == "Interpolation key 'oops' not found"
