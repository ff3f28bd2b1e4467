"""Studies are the config group `study` (sweeps/, installed as nplm_repro/conf/study): `nplm-train -m study=<name>`
from any directory composes the jobs that `nplm-train -cd sweeps -cn <name>` composed, keys and all."""

import re
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, SWEEPS, composed, composed_study, run_script
from hydra import compose, initialize_config_dir, initialize_config_module
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from nplm_repro.errors import NplmError
from nplm_repro.migrations import former_config, upgrade_argv
from nplm_repro.studies import (
    CLAIM_KINDS,
    KNOWN,
    check_claimed_rows,
    claimed_rows,
    declaration,
    row_name,
    study_file,
)
from nplm_repro.sweeping.sweep import check_declaration
from nplm_repro.tracking.keys import config_key, model_key
from nplm_repro.tracking.study_rows import study_rows

STUDIES = sorted(p.stem for p in SWEEPS.glob("*.yaml"))


def as_primary(study: str, folder: Path) -> Path:
    """sweeps/<study>.yaml as it was before the group: a primary config that starts from `config`."""
    cfg = OmegaConf.load(SWEEPS / f"{study}.yaml")
    cfg.defaults = ["config", *cfg.defaults]
    OmegaConf.save(cfg, folder / f"{study}.yaml")
    return folder


def jobs_and_sweep(cfg: DictConfig) -> tuple[list[list[str]], dict]:
    """The overrides of a sweep's jobs, as Hydra's basic sweeper expands them, and how it sweeps and launches."""
    params = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()]
    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)[0]
    return jobs, OmegaConf.to_container(OmegaConf.masked_copy(cfg.hydra, ["mode", "launcher", "sweeper", "callbacks"]))


def job_config(cfg: DictConfig) -> dict:
    """What a job runs with: its config less Hydra's."""
    return OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))


@pytest.mark.parametrize("study", STUDIES)
def test_a_study_composes_the_jobs_its_file_composed_as_a_primary_config(study: str, tmp_path: Path) -> None:
    with initialize_config_dir(config_dir=str(as_primary(study, tmp_path)), version_base="1.3"):
        search = "hydra.searchpath=[pkg://nplm_repro.conf]"  # as -cd sweeps put it beside the main config path
        jobs, sweep = jobs_and_sweep(compose(study, overrides=[search], return_hydra_config=True))
        olds = [job_config(compose(study, overrides=[search, *job])) for job in (jobs[0], jobs[-1])]
    assert jobs_and_sweep(composed_study(study)) == (jobs, sweep)
    assert [job_config(composed_study(study, *job)) for job in (jobs[0], jobs[-1])] == olds


@pytest.mark.parametrize(
    "study,job,config,model",
    [
        ("brown_table1", "experiment=mlp5", "dead57fef118506b", "8d570b9cfa835952"),
        ("brown_table1", "experiment=class_n3_c500", "b903774b82a2798f", None),
        ("brown_vocab", "experiment=kn3", "26b2f55cc9cfc70d", None),
        ("brown_sampled", "optim=sampled experiment=mlp9", "b6eb830603d84695", "60269c778944f5e7"),
    ],
)
def test_a_studys_jobs_keep_the_keys_of_the_old_command(study: str, job: str, config: str, model: str | None) -> None:
    """Keys of `nplm-train -cd sweeps -cn <study>`'s jobs, computed before the group, float32, a fixed data path."""
    cfg = composed(f"study={study}", *job.split(), "trainer.precision=32-true", "data.path=brown.zip")
    assert config_key(cfg, "0123456789abcdef") == config
    if model:
        assert model_key(cfg, "0123456789abcdef") == model


@pytest.mark.parametrize(
    "study,job,mlp,config,model",
    [
        (
            "ap_table2",
            "experiment=ap_mlp10",
            "study=ap_table2 experiment=ap_mlp",
            "eb6690a28f4b4e8d",
            "978a1806a1c77b3a",
        ),
        (
            "brown_mixtures",
            "experiment=mlp6 model.mode=learned",
            "study=brown_table1 experiment=mlp5",
            "bfab16c8d848c554",
            "8d570b9cfa835952",
        ),
    ],
)
def test_a_mixed_mlp_job_finds_its_stored_run_by_its_former_key(
    study: str, job: str, mlp: str, config: str, model: str
) -> None:
    """A mixed MLP row (MLP10 of Table 2; brown_mixtures' MLP6 with a learned weight, which mixes brown_table1's
    MLP5 and Del. Int.) finds its stored run, keyed before the group as an MLP with model.mix, by its former
    config's key (nplm_repro/migrations.py `former_config`)."""
    fixed = ("trainer.precision=32-true", "data.path=brown.zip")
    mixture = composed(f"study={study}", *job.split(), *fixed)
    former = former_config(composed(*mlp.split(), *fixed), mixture.model.mode, mixture.study)
    assert (config_key(former, "0123456789abcdef"), model_key(former, "0123456789abcdef")) == (config, model)


@pytest.mark.slow  # over 10 s
def test_help_lists_the_studies_from_any_directory(tmp_path: Path) -> None:
    result = run_script("nplm-train", "--help", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"study: {', '.join(STUDIES)}\n" in result.stdout


@pytest.mark.slow  # over 10 s
def test_nplm_bench_finds_its_config_from_any_directory(tmp_path: Path) -> None:
    result = run_script("nplm-bench", "--cfg", "job", "experiment=kn3", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ngram_rows:" in result.stdout and "row: Kneser-Ney back-off" in result.stdout


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["-cd", str(SWEEPS), "-cn", "grid", "seed=3"], ["study=grid", "seed=3"]),
        (["seed=3", f"--config-dir={SWEEPS}", "--config-name", "grid"], ["seed=3", "study=grid"]),
        (["-cn", "grid", "seed=3"], ["-cn", "grid", "seed=3"]),  # no -cd: Hydra's own configs
    ],
)
def test_the_old_command_of_a_study_runs_as_the_study(argv: list[str], expected: list[str]) -> None:
    assert upgrade_argv(argv) == expected


def test_a_config_directory_of_ones_own_is_left_to_hydra(tmp_path: Path) -> None:
    """A sweep file of the old kind (it starts from `config`) is a primary config, and still runs as one."""
    as_primary("grid", tmp_path)
    argv = ["-cd", str(tmp_path), "-cn", "grid"]
    assert upgrade_argv(argv) == argv


@pytest.mark.slow  # over 10 s
def test_a_study_file_not_the_installed_one_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "grid.yaml").write_text((SWEEPS / "grid.yaml").read_text().replace("range(1,3)", "range(1,4)"))
    with pytest.raises(NplmError, match="grid.yaml is not the study grid installed with nplm_repro"):
        upgrade_argv(["-cd", str(tmp_path), "-cn", "grid"])
    result = run_script("nplm-train", "-cd", str(tmp_path), "-cn", "grid", cwd=tmp_path, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1
    assert lines[0].startswith(f"nplm-train: error: {tmp_path / 'grid.yaml'} is not the study grid installed")


def test_the_wheel_lists_every_package() -> None:
    """pyproject.toml lists the packages (its package-dir maps conf/ to nplm_repro.conf, and the search's sweeper sits
    in hydra_plugins/): none may be left out."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("nplm_repro", "hydra_plugins")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert sorted(setuptools["packages"]) == sorted(found | {"nplm_repro.conf"})
    assert setuptools["package-dir"] == {"nplm_repro.conf": "conf"}
    assert (ROOT / "conf" / "study").resolve() == SWEEPS.resolve()


EXAMPLES = ROOT / "docs" / "examples"  # docs/studies.md's own study, "do 100 dimensions beat 60?"
ON_TINY = [  # the example on the tiny corpus: its splits, one epoch, two seeds
    *("data.split.train=7000", "data.split.valid=1500", "data.split.test=1500"),
    *("trainer.max_epochs=1", "seed=1,2"),
]


@pytest.mark.slow  # about 20 s: four one-epoch jobs
def test_a_users_own_study_is_one_file_and_ends_in_its_report(tiny_brown_path: Path, tmp_path: Path) -> None:
    """docs/studies.md's study file, outside sweeps/ (Hydra's search path): its report written when its sweep ends
    and again by `nplm-report --study FILE`, with its rows, their 95% intervals and the verdict of its claim."""
    uri, study = f"sqlite:///{tmp_path}/m.db", EXAMPLES / "study" / "m100.yaml"
    assert f"```yaml\n{study.read_text()}```" in (ROOT / "docs" / "studies.md").read_text()  # as the docs show it
    result = run_script(
        "nplm-train", "-m", f"hydra.searchpath=[file://{EXAMPLES}]", "study=m100", f"data.path={tiny_brown_path}",
        "hydra/launcher=basic", f"tracking.uri={uri}", *ON_TINY, cwd=tmp_path, timeout=600,  # no joblib workers
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    again = run_script(
        "nplm-report", "--study", str(study), "--tracking-uri", uri, "--out", str(tmp_path / "again"),
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    for report in (tmp_path / "reports" / "m100.md", tmp_path / "again" / "m100.md"):
        text = report.read_text()
        rows = re.findall(r"^\| MLP[^|]*\|\s+4 \|\s+50 \|\s+(\d+) \|.*\|\s+(\d+)\s+\|$", text, re.MULTILINE)  # n h m
        assert rows == [("60", "2"), ("100", "2")], text  # both rows, two seeds each
        assert re.search(r"\| +\d+\.\d-\d+\.\d \|", text), "no 95% interval in the table"
        verdict = r"^- \*\*Word features of 100 dimensions beat 60\*\*: (holds|fails|inconclusive)\.$"
        assert re.search(verdict, text, re.MULTILINE) and "95% interval [" in text, text
        assert "## My question" in text and (report.parent / "m100_m.png").is_file()


@pytest.mark.slow  # about 20 s: three small LSTMs, two epochs each
def test_brown_lstm_sampled_compares_the_three_output_layers_trained_alike(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    """sweeps/brown_lstm_sampled.yaml, with a small LSTM on the tiny corpus and one seed: its report names the output
    layer in columns, gives each seed's best epoch, and decides both claims (the arms share precision, validation and
    stopping, so neither is confounded)."""
    study = yaml.safe_load((SWEEPS / "brown_lstm_sampled.yaml").read_text())
    small = {"model.width": 16, "model.layers": 1, "trainer.max_epochs": 2, "optim.samples": 50, "seed": 1}
    study["hydra"]["sweeper"]["params"] |= {key: str(value) for key, value in small.items()}
    study["study"] = "small_lstm_sampled"  # a name of its own: the installed study file would win over the copy's
    (tmp_path / "own" / "study").mkdir(parents=True)
    (tmp_path / "own" / "study" / "small_lstm_sampled.yaml").write_text("# @package _global_\n" + yaml.safe_dump(study))
    result = run_script(
        "nplm-train", "-m", f"hydra.searchpath=[file://{tmp_path / 'own'}]", "study=small_lstm_sampled",
        "hydra/launcher=basic", f"data.path={tiny_brown_path}",  # its jobs one after another, no joblib workers
        "data.split.train=5000", "data.split.valid=1000", "data.split.test=1000",
        f"tracking.uri=sqlite:///{tmp_path}/m.db", cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "reports" / "small_lstm_sampled.md").read_text()
    assert "trainer.max_epochs=2" in text and "optim.samples=50" in text, text  # the small LSTM, not the study's
    header = next(line for line in text.splitlines() if line.startswith("| row"))
    assert "model.output" in header and "optim.output" in header and "best epoch (seed)" in header, header
    row = r"^\| LSTM(?: \(\+dirty\))? +\| +(standard|classes) +\| +(exact|sampled) +\|.*\| +\d\*? \(1\) +\|"
    rows = re.findall(row, text, re.MULTILINE)
    assert sorted(rows) == [("classes", "exact"), ("standard", "exact"), ("standard", "sampled")], text
    verdicts = re.findall(r"^- \*\*(.*)\*\*: (holds|fails|inconclusive)\.$", text, re.MULTILINE)
    assert [claim for claim, _ in verdicts] == [c["claim"] for c in study["reporting"]["claims"]], text


def test_what_a_study_declares_for_its_report_is_no_part_of_a_jobs_keys_or_params() -> None:
    """Rewording a claim, or declaring another figure, makes no finished run look new."""
    from nplm_repro.tracking.records import flat_params

    job = ("study=brown_table1", "experiment=mlp5", "data.path=brown.zip", "callbacks.model_checkpoint.dirpath=c")
    cfg, other = composed(*job), composed(*job, "+reporting.claims_heading=another", "+reporting.knobs=[m]")
    assert cfg.reporting.paper == "brown_table1" and other.reporting.claims_heading == "another"
    assert config_key(cfg, "0123456789abcdef") == config_key(other, "0123456789abcdef")
    assert flat_params(cfg) == flat_params(other) and not any(k.startswith("reporting") for k in flat_params(cfg))


def test_a_declaration_with_a_key_the_engine_does_not_know_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("study: mine\nreporting:\n  claim: []\n")
    with pytest.raises(NplmError, match=r"mine.yaml: `reporting` has unknown keys claim \(known: "):
        study_file(tmp_path / "mine.yaml")
    (tmp_path / "nameless.yaml").write_text("reporting:\n  notes: [setup]\n")
    with pytest.raises(NplmError, match="no `study: NAME` key"):
        study_file(tmp_path / "nameless.yaml")


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_file_declares_what_the_engine_knows(study: str) -> None:
    spec = declaration(study)
    assert set(spec) <= KNOWN and spec["notes"], spec


def test_the_kinds_of_claim_a_study_may_declare_are_those_the_engine_checks() -> None:
    from nplm_repro.reporting.claims import PER_SEED

    assert set(CLAIM_KINDS) == {"better", "equivalent", *PER_SEED}


@pytest.mark.slow  # about 20 s: every job of every study composed twice
@pytest.mark.parametrize("study", [*STUDIES, "m100"])
def test_every_study_claims_only_rows_its_jobs_give(study: str) -> None:
    """The checks a sweep (`check_declaration`) and nplm-report (`study_rows`) make before anything else accept
    every study committed, docs/studies.md's own too, and know the rows of each whose claims name some
    (`{best_of: [...]}` names none)."""
    path = EXAMPLES / "study" / "m100.yaml" if study == "m100" else None
    spec = study_file(path)[1] if path else declaration(study)
    rows = study_rows(study, path, study)
    check_claimed_rows(spec, rows, study)
    if claimed_rows(spec):
        assert rows is not None and {row_name(label) for _, label in claimed_rows(spec)} <= rows
    search = [f"hydra.searchpath=[file://{EXAMPLES}]"] if path else []
    with initialize_config_module(config_module="nplm_repro.conf", version_base="1.3"):
        check_declaration(compose("config", overrides=[*search, f"study={study}"], return_hydra_config=True))


@pytest.mark.parametrize(
    "label,name",
    [
        ("MLP5", "MLP5"),
        ("Del. Int.", "Del. Int."),
        ("LSTM + MLP9 + trigram", "LSTM + MLP9 + trigram"),
        ("Kneser-Ney back-off n=3", "Kneser-Ney back-off"),
        ("MLP n=5 h=50 m=30 direct=no mix=no", "MLP"),
        ("MLP5 model.output=energy trainer.precision=32-true", "MLP5"),
    ],
)
def test_a_claims_label_names_its_row_less_the_knobs_that_tell_its_configurations_apart(label: str, name: str) -> None:
    assert row_name(label) == name


@pytest.mark.parametrize("search", ["lstm", "transformer", "mlp"])
def test_a_searchs_study_is_declared_by_its_search(search: str) -> None:
    """`nplm-report --study lstm_search` rebuilds a search's report with what its search declares (the note `search`,
    the columns), as the sweep wrote it at its end: the declaration is conf/hparams_search/<name>.yaml's."""
    spec = declaration(f"{search}_search")
    assert spec["notes"] == ["search"] and spec["columns"] == ["best_epoch", "improving"]
