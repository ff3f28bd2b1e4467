"""Where the test suite's time goes: the slowest tests and the time of each file, from pytest's JUnit XML.

    pytest -m "slow or not slow" --junitxml=times.xml
    python scripts/test_times.py times.xml            # the 30 slowest tests, then every file by its time
    python scripts/test_times.py times.xml --top 10

A test's time is pytest's for its call with its own setup and teardown (a module fixture's cost falls on the first
test that asks for it). Under pytest-xdist the files' times add up to more than the wall clock: they ran side by
side. The last line gives the sum, the number of tests, and the suite's wall-clock time as JUnit recorded it.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def times(xml: Path) -> tuple[dict[str, float], float]:
    """Seconds by test id (`tests/file.py::name[param]`), and the suite's recorded wall-clock seconds."""
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    found: dict[str, float] = {}
    for case in root.iter("testcase"):
        module = case.get("classname", "").split(".")
        path = "/".join(module) + ".py" if module != [""] else case.get("file", "?")
        found[f"{path}::{case.get('name')}"] = float(case.get("time") or 0)
    return found, sum(float(s.get("time") or 0) for s in suites)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml", type=Path, help="pytest's --junitxml output")
    parser.add_argument("--top", type=int, default=30, help="how many of the slowest tests to list (default 30)")
    args = parser.parse_args(argv)
    try:
        found, wall = times(args.xml)
    except (OSError, ET.ParseError) as error:
        print(f"test_times: {args.xml}: not a JUnit XML file pytest wrote ({error})", file=sys.stderr)
        return 2
    print(f"the {min(args.top, len(found))} slowest tests (s):")
    for test, seconds in sorted(found.items(), key=lambda item: -item[1])[: args.top]:
        print(f"{seconds:8.1f}  {test}")
    by_file: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for test, seconds in found.items():
        by_file[test.split("::")[0]] += seconds
        counts[test.split("::")[0]] += 1
    print("\ntime by file (s, tests):")
    for path, seconds in by_file.most_common():
        print(f"{seconds:8.1f}  {counts[path]:4}  {path}")
    print(f"\n{sum(found.values()):.0f} s over {len(found)} tests; the suite took {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
