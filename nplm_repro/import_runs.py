"""`nplm-import`: a study's shipped runs (reports/<study>.runs.jsonl) into a tracking store, to browse them in
MLflow's dashboard and to resume the study: its sweep then finds every imported job FINISHED and trains only the
jobs the archive lacks.

nplm-import reports/quickstart.runs.jsonl                   # into ./mlflow.db (created if missing)
nplm-import reports/brown_table1_sampled/brown_table1.runs.jsonl --tracking-uri http://127.0.0.1:5000

A run the store already has (by its archived id) is not imported again. Every archive is read and checked before
the store is touched: a malformed line, or a store holding another run of an archived run's job (config_key), is one
line and exit 2, with nothing written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlflow

from nplm_repro.cli import cli, store_arguments
from nplm_repro.errors import NplmError
from nplm_repro.exits import TRACEBACK
from nplm_repro.storage.archive import Archive
from nplm_repro.storage.importing import conflicts, import_archive, imported_ids
from nplm_repro.storage.redaction import redact
from nplm_repro.storage.store import check_store, ensure_experiment, sqlite_file
from nplm_repro.sweeping.sweep import dashboard


def _main() -> None:
    parser = argparse.ArgumentParser(prog="nplm-import", description=__doc__.splitlines()[0])
    parser.add_argument("archives", nargs="+", type=Path, help="a study's archive of runs (<study>.runs.jsonl)")
    store_arguments(parser)
    args = parser.parse_args()
    archives = [(path, Archive.read(path)) for path in args.archives]  # all checked before the store is touched
    uri = args.tracking_uri
    path = sqlite_file(uri)
    if path is None or path.is_file():
        check_store(uri, create=False)
        for where, archive in archives:
            why = conflicts(archive, uri, archive.experiment, imported_ids(uri, archive.experiment))
            if why:
                raise NplmError(f"{where}: {why}")
    check_store(uri)
    for where, archive in archives:
        done = import_archive(archive, where, uri)
        experiment_id = ensure_experiment(mlflow.MlflowClient(uri), archive.experiment)
        print(
            f"nplm-import: study {archive.study}: {len(done.added)} runs imported from {where}, "
            f"{len(done.present)} already in {redact(uri)}",
            file=sys.stderr,
        )
        print(f"its runs: {dashboard(uri, experiment_id)}")
        print(f"its sweep trains only what is missing: nplm-train -m study={archive.study} data.path=...")


main = cli(_main, traceback_env=TRACEBACK)


if __name__ == "__main__":
    main()
