"""Every verdict in reports/ is on a controlled comparison: no committed report says holds, fails or inconclusive of a
pair whose arms, run by run, differ in a key its claim does not list (nplm_repro/tracking/confounds.py).

    python scripts/check_verdicts.py            # reports/; exit 1 naming each such line, 0 when there is none

A report that ships its runs (`<study>.runs.jsonl` beside its `<study>.md`) is rebuilt from them alone, and each
claim line of it that the committed report holds is checked again on the archive's runs: the two arms its line names
compared seed by seed with the claim's own `varies`. A report whose runs were not shipped cannot be re-checked: it is
listed as such (its first line says so; tests/test_archive.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from nplm_repro.reporting.claims import FAILS, HOLDS, INCONCLUSIVE, Arms
from nplm_repro.reporting.tables import build
from nplm_repro.storage.archive import SUFFIX, Archive, ArchiveSource
from nplm_repro.studies import declaration
from nplm_repro.tracking.confounds import arm_differences, listed, trained_arm
from nplm_repro.tracking.runs import tidy

PAIR = re.compile(r"^(?P<a>.+?) (?:over|to) (?P<b>.+?): ")
VERDICT = re.compile(rf"(?:: |\]: )({HOLDS}|{FAILS}|{INCONCLUSIVE})(?:;|$)")


def violations(folder: Path, study: str) -> list[str]:
    """The claim lines of `study`'s committed report in `folder` that give a verdict on a confounded pair, and the
    lines its rebuild gives that the committed report lacks (it is not the report of its runs)."""
    archive = Archive.read(folder / f"{study}{SUFFIX}")
    report = build(archive, archive.experiment, study)
    arms = Arms(report.table, tidy(ArchiveSource(archive).frame(archive.experiment)))
    committed = (folder / f"{study}.md").read_text()
    declared = {c["claim"]: c for c in declaration(study).get("claims") or []}
    found = []
    for claim in report.claims:
        varies = declared.get(claim.text, {}).get("varies")
        for line in claim.evidence:
            pair, verdict = PAIR.match(line), VERDICT.search(line)
            if line not in committed:
                found.append(f"{folder / study}.md: not as its runs rebuild it: {line}")
            elif pair and verdict and {pair["a"], pair["b"]} <= set(arms.config):
                a, b = arms.arm(pair["a"]), arms.arm(pair["b"])
                beyond, _ = arm_differences(a, b, varies, trained_arm(a) and trained_arm(b))
                if beyond:
                    found.append(f"{folder / study}.md: {verdict[1]} on a pair that also differs in {listed(beyond)}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="?", type=Path, default=Path("reports"), help="folder (default: reports)")
    folder = parser.parse_args().reports
    if not folder.is_dir():
        print(f"check_verdicts: error: no folder {folder}", file=sys.stderr)
        return 2
    shipped = {p.parent / p.name.removesuffix(SUFFIX) for p in folder.rglob(f"*{SUFFIX}")}
    found, checked = [], 0
    for page in sorted(folder.rglob("*.md")):
        stem = page.with_suffix("")
        if stem in shipped:
            found += violations(page.parent, page.stem)
            checked += 1
        elif re.search(rf"\b({HOLDS}|{FAILS})\b", page.read_text()):
            print(f"not re-checked (its runs are not shipped): {page}")
    for line in found:
        print(line)
    print(f"{checked} reports rebuilt from their runs and re-checked: {len(found)} lines wrong")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
