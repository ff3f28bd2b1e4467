"""`nplm-report`: a study's runs in MLflow -> the paper-style table (md, tex, csv, html) and figures."""

from __future__ import annotations

import logging
from pathlib import Path

from nplm_repro.errors import NplmError
from nplm_repro.reporting.report_all import build, main, write

log = logging.getLogger(__name__)

__all__ = ["main", "write_study"]


def write_study(uri: str, experiment: str, study: str, out: Path) -> None:
    """The study's report, as `nplm-report --study` writes it, when a sweep ends (conf/config.yaml names this);
    a report that cannot be built is only a warning."""
    try:
        for path in write(build(uri, experiment, study), out):
            log.info("report: %s", path)
    except NplmError as error:
        log.warning("no report of study %s: %s", study, error)


if __name__ == "__main__":
    main()
