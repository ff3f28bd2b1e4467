"""scripts/test_times.py: the slowest tests and the time of each file, read from pytest's JUnit XML."""

import runpy
from pathlib import Path

import pytest
from helpers import ROOT

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3" time="12.5">
<testcase classname="tests.test_a" name="test_one" time="4.0"/>
<testcase classname="tests.test_a" name="test_two[x]" time="1.5"/>
<testcase classname="tests.test_b" name="test_three" time="6.0"/>
</testsuite></testsuites>
"""


def test_the_slowest_tests_then_each_file_by_its_time(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "times.xml").write_text(JUNIT)
    main = runpy.run_path(str(ROOT / "scripts" / "test_times.py"))["main"]
    assert main([str(tmp_path / "times.xml"), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "the 2 slowest tests (s):",
        "     6.0  tests/test_b.py::test_three",
        "     4.0  tests/test_a.py::test_one",
    ]
    assert "     5.5     2  tests/test_a.py" in lines and lines[-1] == "12 s over 3 tests; the suite took 12 s"
    assert main([str(tmp_path / "missing.xml")]) == 2
    assert capsys.readouterr().err.startswith(f"test_times: {tmp_path}/missing.xml: not a JUnit XML file")
