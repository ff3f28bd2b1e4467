"""A study's runs shipped beside its report (`<study>.runs.jsonl`, storage/archive.py): a real quickstart sweep on a
slice of Brown writes its archive; `nplm-import` puts it into an empty store, which the study's own sweep then
resumes, training only what the store lacks; bad archives and stores are one line and exit 2 with nothing written;
and every committed report is rebuilt from its archive alone, the same files as committed."""

import filecmp
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
from helpers import ROOT, console_script, data_slice, run_command, run_script
from PIL import Image

from nplm_repro.storage.archive import SUFFIX, Archive, dumps

REPORTS = ROOT / "reports"
# The quickstart's four jobs, each a few seconds: MLP9 trains 5 batches of one epoch on a 20k-token slice of Brown
TINY = [*data_slice(20_000, 4_000, 4_000), "trainer.max_epochs=1", "trainer.limit_train_batches=5"]
SHIPPED = sorted(REPORTS.rglob(f"*{SUFFIX}"))  # every committed archive: a report beside it, or a study in progress
MADE_BEFORE = "**Made before runs shipped:**"  # the first line of a committed report whose runs are gone


def sweep(workdir: Path, brown_path: Path, uri: str, *more: str) -> str:
    """The quickstart's own command on the slice, as a user runs it (its report in reports/, the study's default);
    its output."""
    args = ["-m", "study=quickstart", f"data.path={brown_path}", *TINY, f"tracking.uri={uri}", *more]
    before = set(workdir.glob("multirun/*/*"))
    result = run_script("nplm-train", *args, cwd=workdir, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    new = sorted(set(workdir.glob("multirun/*/*")) - before)  # joblib's jobs write to their own logs
    return result.stdout + result.stderr + "".join(p.read_text() for d in new for p in sorted(d.glob("*/output.log")))


def nplm_import(workdir: Path, uri: str, *archives: Path) -> subprocess.CompletedProcess:
    return run_script("nplm-import", *map(str, archives), "--tracking-uri", uri, cwd=workdir)


def runs_in(uri: str) -> list[mlflow.entities.Run]:
    return mlflow.MlflowClient(uri).search_runs(mlflow.MlflowClient(uri).get_experiment_by_name("brown").experiment_id)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, brown_path: Path) -> Path:
    """A quickstart sweep's work folder: its store (made.db), its report with its archive (reports/) and what the
    sweep said (output.txt: the terminal's lines, then its jobs' logs)."""
    workdir = tmp_path_factory.mktemp("made")
    (workdir / "output.txt").write_text(sweep(workdir, brown_path, f"sqlite:///{workdir}/made.db"))
    return workdir


@pytest.fixture
def archive(made: Path) -> Path:
    return made / "reports" / f"quickstart{SUFFIX}"


@pytest.fixture
def imported(archive: Path, tmp_path: Path) -> str:
    """A store in tmp_path with the quickstart's archive imported: its URI."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert nplm_import(tmp_path, uri, archive).returncode == 0
    return uri


@pytest.mark.slow
def test_the_quickstart_ends_in_its_report_with_the_claims_it_checks(made: Path) -> None:
    """README's first command, on a slice of Brown: its four rows, then reports/quickstart.md beside the paper's
    numbers, every claim judged (holds, fails or inconclusive: never "not measured")."""
    output = (made / "output.txt").read_text()
    assert "report: reports/quickstart.md" in output and "mlflow ui --backend-store-uri" in output
    report = (made / "reports" / "quickstart.md").read_text()
    for row in ("MLP9", "MLP10", "Del. Int.", "Kneser-Ney back-off"):
        assert re.search(rf"^\| {re.escape(row)}( \(\+dirty\))? +\|", report, re.MULTILINE), row
    claims = re.findall(r"^- \*\*(.+)\*\*: (\w+)", report, re.MULTILINE)
    assert len(claims) == 3 and all(verdict in ("holds", "fails", "inconclusive") for _, verdict in claims), claims


@pytest.mark.slow
def test_the_sweep_ships_its_runs_an_import_resumes_it_training_nothing_and_a_deleted_run_is_the_one_job_trained(
    made: Path, archive: Path, brown_path: Path, tmp_path: Path
) -> None:
    lines = archive.read_text().splitlines()
    header, records = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    assert header["study"] == "quickstart" and len(records) == 5  # 4 jobs and the sweep's parent
    trained = next(r for r in records if r["tags"].get("row") == "MLP9")
    assert {"git_commit", "code_fingerprint", "cpu_model", "cpu_flags", "version.torch", "torch_threads"} <= set(
        trained["tags"]
    )
    assert trained["history"]["valid_ppl_epoch"] and set(trained["scores"]) == {"valid", "test"}
    assert len(lines[1]) < 50_000 and trained["features"]["map"]["words"]

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first = nplm_import(tmp_path, uri, archive)
    assert first.returncode == 0, first.stderr
    assert "5 runs imported" in first.stderr and len(runs_in(uri)) == 5
    again = nplm_import(tmp_path, uri, archive)
    assert again.returncode == 0 and "0 runs imported" in again.stderr and len(runs_in(uri)) == 5

    shutil.copytree(made / "reports", tmp_path / "reports")
    before = {p.name: p.read_bytes() for p in (tmp_path / "reports").iterdir()}
    output = sweep(tmp_path, brown_path, uri)
    assert output.count("skipped: run") == 4 and "sweep: nothing ran: every job's run was in the store" in output, (
        output[-3000:]
    )
    assert len(runs_in(uri)) == 5  # nothing trained: the imported parent resumed, no new run
    after = {p.name: p.read_bytes() for p in (tmp_path / "reports").iterdir()}
    assert after == before  # the same report and archive, from the imported runs

    # a run deleted from the imported study is the one job its sweep trains
    (mlp9,) = [r for r in runs_in(uri) if r.data.tags.get("row") == "MLP9"]
    mlflow.MlflowClient(uri).delete_run(mlp9.info.run_id)
    output = sweep(tmp_path, brown_path, uri)
    assert output.count("skipped: run") == 3, output[-3000:]
    new = [r for r in runs_in(uri) if "archive.run_id" not in r.data.tags]
    assert [r.data.tags.get("row") for r in new] == ["MLP9"] and new[0].info.status == "FINISHED"


@pytest.mark.slow
def test_a_new_mixture_over_an_imported_run_names_the_row_to_re_run(
    imported: str, archive: Path, brown_path: Path, tmp_path: Path
) -> None:
    """An imported run has each text's sum of scores, not each token's: a mixture it was not in cannot be made."""
    args = ["experiment=mlp10", "model.mode=learned", "study=quickstart", f"data.path={brown_path}", *TINY]
    result = run_script("nplm-train", *args, f"tracking.uri={imported}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]  # the study's sweep of one job: its progress, then the error
    assert line.startswith("nplm-train: error: run ") and "(row MLP9)" in line, line
    assert f"imported from {archive.name}" in line and "re-run row MLP9 here" in line


@pytest.mark.slow
def test_each_run_is_in_the_archive_as_soon_as_it_ends(brown_path: Path, tmp_path: Path) -> None:
    """A sweep's machine may be lost at any time: Kneser-Ney's run is shipped while MLP9, after it, still trains."""
    args = ["-m", "study=quickstart", "experiment=kn3,mlp9", "hydra/launcher=basic", f"data.path={brown_path}"]
    args += [*data_slice(20_000, 4_000, 4_000), "trainer.max_epochs=200", f"tracking.uri=sqlite:///{tmp_path}/m.db"]
    with open(tmp_path / "sweep.log", "w") as log:
        command = [console_script("nplm-train"), *args, "report=rep"]
        options = {"cwd": tmp_path, "stdout": log, "stderr": subprocess.STDOUT, "start_new_session": True}
        sweeping = subprocess.Popen(command, **options)
    try:
        archive, deadline = tmp_path / "rep" / f"quickstart{SUFFIX}", time.monotonic() + 300
        while not (archive.is_file() and "Kneser-Ney" in archive.read_text()):
            assert sweeping.poll() is None, (tmp_path / "sweep.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "Kneser-Ney's run not archived in 300 s"
            time.sleep(0.5)
        assert sweeping.poll() is None  # MLP9 trains on
        runs = Archive.read(archive).runs.values()
        (shipped,) = [run for run in runs if run["tags"].get("sweep") != "true"]  # and the sweep's parent
        assert shipped["status"] == "FINISHED" and shipped["scores"]["test"]
    finally:
        os.killpg(sweeping.pid, signal.SIGKILL)  # the machine lost
        sweeping.wait()


def broken(text: str) -> dict[str, str]:
    """An archive's text made bad in each way a file is: cut in the middle of a line, a line edited into another
    shape, a header that is not one."""
    lines = text.splitlines()
    edited = json.loads(lines[2])
    edited["metrics"] = "many"
    return {
        "truncated": "\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2],
        "edited": "\n".join([*lines[:2], json.dumps(edited), *lines[3:]]) + "\n",
        "not an archive": '{"format": "something else"}\n',
    }


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated", "edited", "not an archive"])
def test_a_bad_archive_is_one_line_naming_its_file_and_line_and_nothing_is_written(
    archive: Path, tmp_path: Path, how: str
) -> None:
    bad = tmp_path / f"bad{SUFFIX}"
    bad.write_text(broken(archive.read_text())[how])
    result = nplm_import(tmp_path, f"sqlite:///{tmp_path}/mlflow.db", archive, bad)  # the good one first
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    where = {"truncated": 4, "edited": 3, "not an archive": 1}[how]
    assert line.startswith(f"nplm-import: error: {bad}:{where}: "), line
    assert not (tmp_path / "mlflow.db").exists()  # no store made, not even for the good archive before it


@pytest.mark.slow
def test_a_store_holding_another_run_of_an_archived_job_takes_nothing(
    archive: Path, brown_path: Path, tmp_path: Path
) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["experiment=kn3", "study=quickstart", f"data.path={brown_path}", *TINY, f"tracking.uri={uri}"]
    assert run_script("nplm-train", *args, cwd=tmp_path).returncode == 0  # the same job, a run of this store's own
    before = sorted(r.info.run_id for r in runs_in(uri))
    result = nplm_import(tmp_path, uri, archive)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    (kn3,) = [r.info.run_id for r in runs_in(uri) if r.data.tags.get("row")]  # and its sweep's parent
    assert f"{archive}: the store already has run {kn3} of config_key" in line, line
    assert sorted(r.info.run_id for r in runs_in(uri)) == before


def same_figure(made: Path, committed: Path) -> str | None:
    """Why a rebuilt figure is not the committed one, or None: a PNG by its pixels, an SVG by its text less its
    <metadata> (matplotlib writes its version and a date there)."""
    if committed.suffix == ".png":
        a, b = (np.asarray(Image.open(io.BytesIO(p.read_bytes())).convert("RGBA")) for p in (made, committed))
        return None if a.shape == b.shape and (a == b).all() else "other pixels"
    strip = re.compile(r"<metadata>.*?</metadata>", re.DOTALL)
    a, b = (strip.sub("", p.read_text(encoding="utf-8")) for p in (made, committed))
    return None if a == b else "another drawing"


def report_files(folder: Path, study: str) -> set[str]:
    """The files of `study`'s report in `folder`: its page, table, LaTeX, HTML and figures."""
    return {p.name for p in folder.iterdir() if p.is_file() and re.match(rf"{re.escape(study)}[._]", p.name)}


@pytest.mark.parametrize("shipped", SHIPPED, ids=[str(p.relative_to(REPORTS)) for p in SHIPPED])
def test_every_committed_report_is_rebuilt_from_its_archive_alone_as_committed(shipped: Path, tmp_path: Path) -> None:
    """`nplm-report --study S --out DIR` with no store: the archive in DIR is all it reads. Text files byte for byte,
    figures as `same_figure` says. An archive without its report beside it is a study in progress: it is read."""
    study, folder = shipped.name.removesuffix(SUFFIX), shipped.parent
    if not (folder / f"{study}.md").is_file():
        assert Archive.read(shipped).study == study
        return
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(shipped, out)
    started = time.monotonic()
    result = run_script("nplm-report", "--study", study, "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "mlflow.db").exists(), "a rebuild made a store"
    committed, rebuilt = report_files(folder, study), report_files(out, study)
    assert rebuilt == committed
    differ = {}
    for name in sorted(committed):
        a, b = out / name, folder / name
        if a.suffix in (".png", ".svg"):
            why = same_figure(a, b)
        else:
            why = None if filecmp.cmp(a, b, shallow=False) else "other bytes"
        if why:
            differ[name] = why
    assert not differ, f"rebuilt in {time.monotonic() - started:.0f} s, differ from reports/: {differ}"


def test_every_report_without_its_runs_says_so_in_its_first_line() -> None:
    """A report whose runs are gone cannot be rebuilt or re-checked: its first line says so and how to re-run it."""
    for page in sorted(REPORTS.rglob("*.md")):
        if page.name == "README.md" or (page.parent / f"{page.stem}{SUFFIX}").is_file():
            continue
        first = page.read_text(encoding="utf-8").partition("\n")[0]
        assert first.startswith(MADE_BEFORE) and "nplm-train " in first, page


def test_an_archive_is_sorted_one_run_a_line_within_its_sizes() -> None:
    """Stable text (a diff shows what a run changed), about 50 kB a run and 5 MB a study at most."""
    for shipped in SHIPPED:
        lines = shipped.read_text(encoding="utf-8").splitlines()
        ids = [json.loads(line)["run_id"] for line in lines[1:]]
        assert ids == sorted(ids) and all(len(line) <= 60_000 for line in lines[1:]), shipped
        assert shipped.stat().st_size <= 5_000_000, shipped
        assert all(line == dumps(json.loads(line)) for line in lines), f"{shipped}: keys not sorted"


def test_reports_readme_gives_every_archive_its_size() -> None:
    """A report's archive has its row and size; a study's in progress (no report beside it yet, its runs committed as
    they end) is named by its folder, or by its own name in reports/ itself, its size changing with every run."""
    readme = (REPORTS / "README.md").read_text(encoding="utf-8")
    for shipped in SHIPPED:
        if not (shipped.parent / f"{shipped.name.removesuffix(SUFFIX)}.md").is_file():
            folder = shipped.parent.relative_to(REPORTS)
            assert f"]({folder}/)" in readme if folder.parts else f"]({shipped.name})" in readme, shipped
            continue
        (row,) = [line for line in readme.splitlines() if f"]({shipped.relative_to(REPORTS)})" in line]
        assert f"| {shipped.stat().st_size / 1000:.1f} kB |" in row, row


def test_no_committed_report_gives_a_verdict_on_a_confounded_pair(tmp_path: Path) -> None:
    """scripts/check_verdicts.py on reports/ (as CI runs it through this test), then on a copy of the quickstart's
    whose MLP9 ran other code than the n-grams it is compared with: that line is named and the exit is 1."""
    script = [sys.executable, str(ROOT / "scripts" / "check_verdicts.py")]
    result = run_command(script, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    reports = sum((p.parent / f"{p.name.removesuffix(SUFFIX)}.md").is_file() for p in SHIPPED)
    assert f"{reports} reports rebuilt from their runs and re-checked: 0 lines wrong" in result.stdout
    shutil.copy(REPORTS / "quickstart.md", tmp_path)
    lines = (REPORTS / f"quickstart{SUFFIX}").read_text().splitlines()
    records = [json.loads(line) for line in lines[1:]]
    for record in records:
        if record["tags"].get("row") == "MLP9":
            record["tags"]["code_fingerprint"] = "0" * 16
    (tmp_path / f"quickstart{SUFFIX}").write_text("\n".join([lines[0], *map(dumps, records)]) + "\n")
    result = run_command([*script, str(tmp_path)], cwd=ROOT)
    assert result.returncode == 1 and "quickstart.md: not as its runs rebuild it: Del. Int. over MLP9" in result.stdout
