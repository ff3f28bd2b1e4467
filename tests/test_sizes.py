"""No module of the package is too long to check against the paper in one sitting."""

from helpers import ROOT

LIMIT = 450  # lines a module: past it, split it along its concerns (docs/layout.md says where each one sits)


def test_no_module_is_over_450_lines() -> None:
    sizes = {path: len(path.read_text().splitlines()) for path in (ROOT / "nplm_repro").rglob("*.py")}
    assert len(sizes) > 50  # the package was found: a reading of none checks none
    over = {str(path.relative_to(ROOT)): lines for path, lines in sorted(sizes.items()) if lines > LIMIT}
    assert not over, f"modules over {LIMIT} lines: {over}"
