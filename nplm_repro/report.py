"""`nplm-report`: a study's runs as the paper's table, each number beside the paper's, claims checked.

nplm-report --study quickstart                 # rebuilt from reports/quickstart.runs.jsonl alone, no store
nplm-report --study brown_table1 --out reports/brown_table1_sampled   # the same, from that folder's archive
nplm-report --tracking-uri sqlite:///mlflow.db # Table 1 (Brown) from a store into reports/, its archive beside it
nplm-report --study grid --fingerprint b45c28977b58c44b
nplm-report --tracking-uri http://127.0.0.1:5000 --out /tmp/reports
nplm-report --require-clean                    # only runs made from committed code (no git commit +dirty)
nplm-report --study brown_table1 --register     # also register the study's best model (nplm-brown-brown_table1)
nplm-report --study my_studies/m100.yaml        # a study file outside sweeps/: its `study` and `reporting`

Without --tracking-uri (nor $MLFLOW_TRACKING_URI), a study whose archive is in --out is rebuilt from it, in place;
otherwise from the store (default sqlite:///mlflow.db), and written with its archive into --out unless the report
there is made of runs the store does not hold (then into --out/<study>-<fingerprint>/, said in one line).
Which runs make the table: nplm_repro/tracking/runs.py; which row and run are the best: nplm_repro/tracking/best.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from nplm_repro.cli import DEFAULT_STORE, cli, store_arguments
from nplm_repro.errors import NplmError
from nplm_repro.exits import TRACEBACK
from nplm_repro.paper import PAPER_TABLES
from nplm_repro.paths import check_report_dir
from nplm_repro.reporting.claims import headline
from nplm_repro.reporting.render import write
from nplm_repro.reporting.tables import build
from nplm_repro.storage.archive import Archive, path_of
from nplm_repro.storage.importing import held_runs
from nplm_repro.studies import check_claimed_rows, checked, claimed_rows, declaration, study_file
from nplm_repro.tracking.archived import archive_dir
from nplm_repro.tracking.study_rows import study_rows

log = logging.getLogger(__name__)

TABLE1 = next(iter(PAPER_TABLES))  # the study named after the paper's first table, as untagged runs of its rows are

__all__ = ["main", "write_study"]


def _main() -> None:
    parser = argparse.ArgumentParser(prog="nplm-report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--study",
        default=TABLE1,
        help=f"a study (sweeps/<name>.yaml), a study file (PATH.yaml), or a sweep's name (default: {TABLE1}, the "
        "study of the paper's Table 1)",
    )
    parser.add_argument("--experiment", help="MLflow experiment (default: the paper table's corpus, else brown)")
    store_arguments(parser, default=None)
    parser.add_argument("--fingerprint", help="data fingerprint to report (default: that of the newest run)")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="directory of the report (default: reports)")
    parser.add_argument(
        "--require-clean",
        action="store_true",
        help="leave out runs made from code with uncommitted changes (git commit +dirty)",
    )
    parser.add_argument(
        "--register",
        action="store_true",
        help="register the study's best trained model (tracking/best.py) as nplm-<experiment>-<study>@champion, "
        "as a sweep does",
    )
    args = parser.parse_args()
    check_report_dir(str(args.out), f"--out {args.out}")
    path = Path(args.study) if args.study.endswith((".yaml", ".yml")) else None
    if path is not None:
        (study, spec), where = study_file(path), str(path)
    else:
        study, spec, where = args.study, declaration(args.study), f"sweeps/{args.study}.yaml"
    if claimed_rows(spec):  # before the store is read: a claim on a row no job gives is a typo
        check_claimed_rows(spec, study_rows(study, path, where), where)
    experiment = args.experiment or PAPER_TABLES.get(spec.get("paper", ""), "brown")
    archived = path_of(args.out, study)
    if args.tracking_uri is None and archived.is_file() and not args.register:
        archive = Archive.read(archived)
        print(f"nplm-report: from {archived} ({len(archive.runs)} runs), no store", file=sys.stderr)
        report = build(archive, args.experiment or archive.experiment, study, args.fingerprint, args.require_clean, spec)
        out = args.out
    else:
        args.tracking_uri = args.tracking_uri or DEFAULT_STORE
        report = build(args.tracking_uri, experiment, study, args.fingerprint, args.require_clean, spec)
        out = archive_dir(args.out, study, report.fingerprint, held_runs(args.tracking_uri, experiment))
    if args.require_clean:
        print(f"nplm-report: left out {report.left_out} runs from dirty work trees (--require-clean)", file=sys.stderr)
    for path in write(report, out):
        print(path)
    if args.register:
        from nplm_repro.sweeping.registry import register_best  # loads torch: a report alone never does

        registered = register_best(args.tracking_uri, experiment, study, args.fingerprint, args.require_clean)
        print(
            f"registered: models:/{registered}, served as models:/{registered.rsplit('/', 1)[0]}@champion"
            if registered
            else "registered nothing: the study has no finished trained run with weights"
        )


main = cli(_main, traceback_env=TRACEBACK)


def write_study(
    uri: str, experiment: str, study: str, out: Path, declared: dict[str, Any] | None = None
) -> tuple[list[Path], dict[str, float]]:
    """The study's report and its archive, as `nplm-report --study` writes them from a store, when a sweep ends
    (conf/config.yaml names this), with what the sweep's study file declares (`declared`; None: sweeps/<study>.yaml's),
    into `out` unless a report there was made of other runs (`archive_dir`); returns its files and headline numbers,
    which the sweep keeps on its parent run. A report that cannot be built is only a warning (no files, no
    numbers)."""
    try:
        spec = declaration(study) if declared is None else checked(declared, f"study {study}")
        report = build(uri, experiment, study, spec=spec)
        written = write(report, archive_dir(out, study, report.fingerprint, held_runs(uri, experiment)))
    except NplmError as error:
        log.warning("no report of study %s: %s", study, error)
        return [], {}
    page = next((p for p in written if p.suffix == ".md"), written[0]) if written else None
    if page is not None:
        log.info("report: %s, and beside it %d more files (.csv, .tex, .html, figures)", page, len(written) - 1)
    return written, headline(report.table)


if __name__ == "__main__":
    main()
