"""A sweep's report never replaces a study's report made of other runs (tracking/archived.py): one tiny job of a
committed study, into a scratch store, leaves the committed report's bytes as they were and writes its own beside
them; a report of the same corpus built from every run it was made of replaces it. Real commands, a real store,
the committed report."""

import hashlib
import shutil
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT, data_slice, run_script

from nplm_repro.storage.archive import Archive, path_of
from nplm_repro.tracking.archived import archive_dir, archived_runs
from nplm_repro.tracking.runs import StudyRuns

TINY_JOB = ["experiment=kn3", "study=brown_modern", "seed=1", *data_slice(7_000, 1_000, 1_000), "hydra/launcher=basic"]


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.slow  # one job and a report, about 25 s
def test_one_tiny_job_of_a_committed_study_leaves_its_report_unchanged(tiny_brown_path: Path, tmp_path: Path) -> None:
    """It exited 0 and rewrote reports/brown_modern.{md,csv,tex,html} and figures as a one-row report of the tiny
    corpus. The committed files are copied into the job's report folder, as a clone has them."""
    reports = tmp_path / "reports"
    reports.mkdir()
    for path in ROOT.glob("reports/brown_modern*"):
        if path.is_file():
            shutil.copy2(path, reports / path.name)
    committed = digests(reports)
    assert "brown_modern.md" in committed and "brown_modern.csv" in committed
    job = [*TINY_JOB, f"data.path={tiny_brown_path}", "tracking.uri=sqlite:///scratch.db", f"report={reports}"]
    result = run_script("nplm-train", *job, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert digests(reports) == committed
    (beside,) = [p for p in reports.iterdir() if p.is_dir()]
    assert beside.name.startswith("brown_modern-") and (beside / "brown_modern.md").is_file()
    said = f"report: {reports}/brown_modern.md is made of another corpus (fingerprint b45c28977b58c44b): it is kept"
    assert said in result.stdout and f"this one is written to {beside}/" in result.stdout
    assert (beside / "brown_modern.runs.jsonl").is_file()  # its archive beside it, the committed folder untouched
    # nplm-report on the same scratch store: the same guard (it rewrote the committed report, exit 0)
    again = ["--study", "brown_modern", "--tracking-uri", "sqlite:///scratch.db", "--out", str(reports)]
    result = run_script("nplm-report", *again, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert digests(reports) == committed
    assert said in result.stderr and f"this one is written to {beside}/" in result.stderr


def test_a_report_is_replaced_only_by_one_of_its_corpus_holding_all_its_runs(tmp_path: Path) -> None:
    assert archive_dir(tmp_path, "s", "f1", {"a", "b"}) == tmp_path  # none there
    (tmp_path / "s.md").write_text("Data: corpus `brown`, fingerprint `f1`, |V| = 10\n")
    pd.DataFrame({"run_ids": ["a b", "c"]}).to_csv(tmp_path / "s.csv", index=False)
    assert archive_dir(tmp_path, "s", "f1", {"a", "b", "c", "d"}) == tmp_path  # its runs and more: a new seed
    assert archive_dir(tmp_path, "s", "f1", {"a", "b"}) == tmp_path / "s-f1"  # c: another store's
    assert archive_dir(tmp_path, "s", "f2", {"a", "b", "c"}) == tmp_path / "s-f2"  # another corpus
    assert archive_dir(tmp_path, "t", "f2", {"x"}) == tmp_path  # another study's report is not this one


def test_a_report_with_an_archive_is_replaced_only_by_a_store_holding_every_archived_run(tmp_path: Path) -> None:
    """The archive, not the table, says what a report was made of: it also holds runs no row shows (a failed seed,
    an attempt), so a store without them makes a report of its own beside it."""
    (tmp_path / "s.md").write_text("Data: corpus `brown`, fingerprint `f1`, |V| = 10\n")
    pd.DataFrame({"run_ids": ["a"]}).to_csv(tmp_path / "s.csv", index=False)
    archive = Archive("s", "brown", "f1")
    archive.add({"run_id": i, "name": i, "status": "FINISHED", "start_time": 0} for i in ("a", "failed"))
    archive.write(path_of(tmp_path, "s"))
    assert archive_dir(tmp_path, "s", "f1", {"a"}) == tmp_path / "s-f1"
    assert archive_dir(tmp_path, "s", "f1", {"a", "failed", "new"}) == tmp_path


def test_an_archive_holds_the_runs_its_mixed_rows_mix_from_another_study() -> None:
    """brown_mixtures mixes brown_table1's MLPs and Del. Int.: without those runs its report, rebuilt from its
    archive, showed no mixture as its MLP mixed, and every claim as not measured."""
    every = pd.DataFrame(
        {
            "run_id": ["mix", "mlp", "trigram", "unrelated"],
            "study": ["brown_mixtures", "brown_table1", "brown_table1", "brown_table1"],
            "fingerprint": ["f1"] * 4,
            "mixes": ["mlp,trigram", "", "", ""],
        }
    )
    found = StudyRuns(every, every[every["run_id"] == "mix"], every.iloc[:0], "f1", 0)
    assert sorted(archived_runs(found, {})) == ["mix", "mlp", "trigram"]
