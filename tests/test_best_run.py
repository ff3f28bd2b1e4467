"""One rule for "the best run" of a study (tracking/best.py): the report, the Model Registry (its `champion`) and
`nplm-score --row` name the same run, on a real store of tiny MLPs on a slice of Brown. The registry finds a
study's untagged (`adhoc`) runs as the report does, and passes over a run without weights."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from helpers import SLICE, Done, composed, run_script, slice_texts
from mlflow.tracking import MlflowClient

from nplm_repro import report as nplm_report
from nplm_repro import score as nplm_score
from nplm_repro.errors import NplmError
from nplm_repro.reporting.tables import build
from nplm_repro.serving.scoring import has_weights
from nplm_repro.sweeping.registry import CHAMPION, register_best
from nplm_repro.tracking import ledger
from nplm_repro.tracking.best import best_row, row_run

# An MLP of seconds: h=16, m=16, one epoch, float32 whatever the CPU (precision auto could pick bf16-mixed)
MLP = ["model.h=16", "model.m=16", "trainer.max_epochs=1", "trainer.precision=32-true"]
STOPPED = ["experiment=mlp9", "trainer.max_steps=30"]  # 30 steps of an epoch of 79: no validation, no weights


def train(workdir: Path, brown: Path, *overrides: str, study: str | None = None) -> str:
    """One run by the ledger, as nplm-train runs it; `study` as a study's sweep sets it (its tag `study`)."""
    where = [f"tracking.uri=sqlite:///{workdir}/mlflow.db", f"callbacks.model_checkpoint.dirpath={workdir}/checkpoints"]
    cfg = composed(f"data.path={brown}", *SLICE, *where, *overrides)
    cfg.study = study
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)  # MLflow keeps artifacts under ./mlruns
        return ledger.run(cfg)[0]


@pytest.fixture(scope="module")
def store(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Without a study tag and with columns of no paper row, so `adhoc`: MLP1 of 20 batches and MLP9 of 5, each
    with seeds 1 and 2, a Kneser-Ney trigram without its row, and last MLP1 again of only 3 batches (the newest run
    of that row, in a worse configuration). In study `stopped`: an MLP9 stopped after 30 steps, before its first
    validation (no weights), and an MLP1 of 5 batches. The slice's 13 texts are unzipped into the folder's brown/, so
    that each run reads those and not all 500. About 10 s."""
    workdir = tmp_path_factory.mktemp("best")
    texts = slice_texts(brown_path, workdir)
    for row, batches in (("mlp1", 20), ("mlp9", 5)):
        for seed in (1, 2):
            train(workdir, texts, f"experiment={row}", *MLP, f"trainer.limit_train_batches={batches}", f"seed={seed}")
    train(workdir, texts, "experiment=kn3", "row=null")
    train(workdir, texts, "experiment=mlp1", *MLP, "trainer.limit_train_batches=3")
    train(workdir, texts, *MLP, *STOPPED, study="stopped")
    train(workdir, texts, "experiment=mlp1", *MLP, "trainer.limit_train_batches=5", study="stopped")
    return workdir, f"sqlite:///{workdir}/mlflow.db"


def runs_of(uri: str, study: str | None) -> pd.DataFrame:
    """The store's finished runs of `study` (None: untagged), straight from MLflow."""
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
    rows = [
        {
            "run_id": r.info.run_id,
            "start": r.info.start_time,
            "row": r.data.tags.get("row", ""),
            "kind": r.data.tags["family_kind"],
            "batches": r.data.params.get("trainer.limit_train_batches", ""),
            "seed": r.data.params["seed"],
            "valid_ppl": r.data.metrics["valid_ppl"],
        }
        for r in runs
        if r.data.tags.get("study") == study and r.info.status == "FINISHED"
    ]
    return pd.DataFrame(rows)


def by_hand(runs: pd.DataFrame) -> str:
    """The rule worked out on MLflow's own numbers: of the trained configurations (row and batches; seed apart), the
    one with the lowest mean valid perplexity; of its seeds, the lowest."""
    trained = runs[runs["kind"] == "trained"]
    means = trained.groupby(["row", "batches"])["valid_ppl"].mean()
    row, batches = means.idxmin()
    mine = trained[(trained["row"] == row) & (trained["batches"] == batches)]
    return str(mine.sort_values("valid_ppl").iloc[0]["run_id"])


@pytest.mark.slow  # over 10 s
def test_the_report_the_registry_and_row_name_the_same_best_run(store: tuple[Path, str]) -> None:
    """Two trained rows of two seeds each (and a counted row with a lower valid perplexity, which is not a trained
    row): the report's best trained row, whose features it shows, the registry's `champion` and `--row` name one
    run, the rule's. `--row MLP1` is not the newest run of MLP1 (a worse configuration of it, run last)."""
    _, uri = store
    runs = runs_of(uri, None)
    best = by_hand(runs)
    counted = runs.loc[runs["kind"] == "counted", "valid_ppl"].iloc[0]
    assert counted < runs.loc[runs["run_id"] == best, "valid_ppl"].iloc[0]  # lower, yet not a trained row's
    report = build(uri, "brown", "adhoc")
    assert report.learned is not None and report.learned.run_id == best
    assert best in best_row(report.table)["run_ids"].split()

    assert register_best(uri, "brown", "adhoc") == "nplm-brown-adhoc/1"
    champion = MlflowClient(uri).get_model_version_by_alias("nplm-brown-adhoc", CHAMPION)
    assert (str(champion.version), champion.run_id) == ("1", best)

    assert row_run(uri, "brown", "adhoc", "MLP1") == best
    newest = runs[runs["row"] == "MLP1"].sort_values("start").iloc[-1]
    assert newest["batches"] == "3" and newest["run_id"] != best
    mlp1 = runs[(runs["row"] == "MLP1") & (runs["batches"] == "20")].set_index("seed")["run_id"]
    assert {row_run(uri, "brown", "adhoc", "MLP1", int(seed)) for seed in "12"} == set(mlp1)
    mlp9 = runs[runs["row"] == "MLP9"].sort_values("valid_ppl")
    assert row_run(uri, "brown", "adhoc", "MLP9") == mlp9.iloc[0]["run_id"]
    with pytest.raises(NplmError, match="row 'MLP1' of study 'adhoc' has no FINISHED run of seed 7 .its seeds: 1, 2"):
        row_run(uri, "brown", "adhoc", "MLP1", 7)
    with pytest.raises(NplmError, match="no FINISHED run of row 'MLP3' in study 'adhoc' .* MLP1, MLP9"):
        row_run(uri, "brown", "adhoc", "MLP3")


def test_nplm_score_row_scores_the_rules_run(
    store: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The command, not only the function it calls: what it scores is the rule's run."""
    workdir, uri = store
    best = by_hand(runs_of(uri, None))
    monkeypatch.setenv("HYDRA_FULL_ERROR", "")  # restored after the test: the CLI wrapper sets it
    monkeypatch.chdir(workdir)
    argv = ["nplm-score", "--row", "MLP1", "--study", "adhoc", "--split", "valid", "--tracking-uri", uri]
    monkeypatch.setattr(sys, "argv", argv)
    nplm_score.main()
    assert f"run {best[:12]} " in capsys.readouterr().out


def test_nplm_ask_and_nplm_score_name_a_rows_seed_alike(
    store: tuple[Path, str], score: Callable[..., Done], ask: Callable[..., Done]
) -> None:
    """--row, --study and --seed are one declaration (cli.py's `run_arguments`): nplm-score and nplm-ask name seed
    2's run of MLP1, not the row's best; nplm-ask's old --run-seed names it too, with one line of warning, and
    generate's draws take --draw-seed."""
    workdir, uri = store
    seed_2 = row_run(uri, "brown", "adhoc", "MLP1", 2)
    assert seed_2 != row_run(uri, "brown", "adhoc", "MLP1", 1)
    row = ["--row", "MLP1", "--study", "adhoc", "--tracking-uri", uri]
    scored = score(workdir, *row, "--seed", "2", "--split", "valid")
    asked = ask(workdir, "neighbours", *row, "--seed", "2", "the", "--k", "1")
    old = ask(workdir, "neighbours", *row, "--run-seed", "2", "the", "--k", "1")
    drawn = ask(workdir, "generate", *row, "--seed", "2", "--words", "3", "--draw-seed", "7")
    for done in (scored, asked, old, drawn):
        assert done.returncode == 0 and done.stdout.startswith(f"run {seed_2[:12]} "), done.stderr
    assert old.stdout == asked.stdout and "deprecated" not in asked.stderr
    warning = "nplm-ask: warning: --run-seed is deprecated: use --seed (it will be removed in the next release)"
    assert [line for line in old.stderr.splitlines() if "deprecated" in line] == [warning]
    assert "3 words, temperature 1, draw seed 7:" in drawn.stdout


def test_nplm_report_registers_the_adhoc_mlp_it_lists(
    store: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Runs without a study tag are the report's `adhoc`; `--register` registered nothing for them ("the study has
    no finished MLP"), reading only runs tagged so."""
    workdir, uri = store
    best = by_hand(runs_of(uri, None))
    monkeypatch.setenv("HYDRA_FULL_ERROR", "")  # restored after the test: the CLI wrapper sets it
    monkeypatch.chdir(workdir)
    argv = ["nplm-report", "--study", "adhoc", "--register", "--tracking-uri", uri, "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    nplm_report.main()
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == "registered: models:/nplm-brown-adhoc/1, served as models:/nplm-brown-adhoc@champion"
    assert best[:8] in (tmp_path / "adhoc.md").read_text()  # the report lists the registered run
    assert MlflowClient(uri).get_model_version_by_alias("nplm-brown-adhoc", CHAMPION).run_id == best


def test_the_registry_passes_over_a_run_without_weights_and_moves_champion_to_a_better_version(
    store: tuple[Path, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The MLP stopped before its first validation has the study's lowest valid perplexity (its numbers come from
    its weights in memory at its end) and no weights: the report shows it as the best row; the registry says so in
    one warning and registers the next run by the rule (it raised MLflow's "Failed to download artifacts"). A
    better run with weights then becomes version 2 and `champion` moves to it; an alias lost is set again on the
    version that holds the best, without a new version."""
    workdir, uri = store
    client = MlflowClient(uri)
    runs = runs_of(uri, "stopped").set_index("row")
    stopped, mlp1 = runs.loc["MLP9", "run_id"], runs.loc["MLP1", "run_id"]
    assert not has_weights(client, stopped) and runs.loc["MLP9", "valid_ppl"] < runs.loc["MLP1", "valid_ppl"]
    assert best_row(build(uri, "brown", "stopped").table)["run_ids"] == stopped
    with caplog.at_level(logging.WARNING, logger="nplm_repro.sweeping.registry"):
        assert register_best(uri, "brown", "stopped") == "nplm-brown-stopped/1"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert re.fullmatch(
        rf"registry: run {stopped} \(MLP9, seed 1, valid [\d.]+\) has no weights .*: not registered", warning
    )
    assert client.get_model_version_by_alias("nplm-brown-stopped", CHAMPION).run_id == mlp1

    # adopts the Model of adhoc's MLP1 of seed 1 (the same MLP): the version's run is that one, its tag run_id this
    better = train(
        workdir, workdir / "brown", "experiment=mlp1", *MLP, "trainer.limit_train_batches=20", study="stopped"
    )
    assert register_best(uri, "brown", "stopped") == "nplm-brown-stopped/2"
    champion = client.get_model_version_by_alias("nplm-brown-stopped", CHAMPION)
    assert (str(champion.version), champion.tags["run_id"]) == ("2", better)
    assert champion.run_id == client.get_run(better).data.tags["adopted_from"]
    client.delete_registered_model_alias("nplm-brown-stopped", CHAMPION)
    assert register_best(uri, "brown", "stopped") == "nplm-brown-stopped/2"
    assert client.get_model_version_by_alias("nplm-brown-stopped", CHAMPION).version == 2
    assert len(client.search_model_versions("name = 'nplm-brown-stopped'")) == 2


@pytest.mark.slow  # a sweep of two jobs: about 10-15 s, outside the default suite
def test_a_sweep_whose_mlp_stopped_before_validating_writes_its_report_and_succeeds(
    brown_path: Path, tmp_path: Path
) -> None:
    """Defect 5 of issue 41: both jobs FINISHED, yet the sweep failed (ReportNotWritten: its registration could not
    download the MLP's checkpoint) and its parent run was FAILED. Now the report is written as nplm-report writes it,
    and the registry says in one line that it passes over the MLP."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    overrides = ["study=brown_table1", "hydra/launcher=basic", "experiment=kn3,mlp9", "trainer.max_steps=30"]
    overrides += [f"data.path={slice_texts(brown_path, tmp_path)}", *SLICE, f"tracking.uri={uri}"]
    result = run_script("nplm-train", "-m", *overrides, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "reports" / "brown_table1.md").is_file()
    client = MlflowClient(uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("brown").experiment_id], "tags.sweep = 'true'")
    assert parent.info.status == "FINISHED" and "error" not in parent.data.tags
    skipped = [line for line in (result.stdout + result.stderr).splitlines() if "has no weights" in line]
    assert len(skipped) == 1 and "(MLP9, seed 1, valid " in skipped[0] and skipped[0].endswith(": not registered")
    assert not client.search_registered_models()  # its only trained run has no weights: nothing registered
