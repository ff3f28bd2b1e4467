"""The front page says what the reports say: every number README.md cites beside a report equals that report's."""

import re
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT

README = (ROOT / "README.md").read_text()
PERPLEXITY = re.compile(r"(?<![\w.+\-\[])(\d{2,3}\.\d)(?![\d%])")  # 182.3, not +4.3% or 1.5
SIGNED = re.compile(r"[+-]\d+\.\d%")  # a claim's difference, +26.0%
INTERVAL = re.compile(r"\[([+-]\d+\.\d)%?, ([+-]\d+\.\d)%?\]")  # its interval, [+23.3, +28.6]


def blocks() -> list[tuple[str, list[Path]]]:
    """Each paragraph of the README, or line of its tables, with the reports (reports/<study>.md) it links."""
    found = []
    for paragraph in README.split("\n\n"):
        parts = paragraph.splitlines() if paragraph.startswith("|") else [paragraph]
        for text in parts:
            linked = [ROOT / link for link in re.findall(r"\((reports/[\w/]+\.md)\)", text)]
            if linked:
                found.append((text, linked))
    return found


def numbers(csv: Path) -> set[str]:
    """Every perplexity of a report's table as the README writes it (one decimal): the means, the interval bounds, and
    the rows' mean best epochs."""
    table = pd.read_csv(csv)
    columns = [c for c in table if c.endswith(("_ppl", "_low", "_high", "best_epoch")) and not c.startswith("paper_")]
    return {f"{v:.1f}" for c in columns for v in table[c].dropna()}


@pytest.mark.parametrize("text,linked", blocks(), ids=lambda v: v[0][:40] if isinstance(v, tuple) else None)
def test_every_number_the_front_page_cites_is_the_reports(text: str, linked: list[Path]) -> None:
    reports = " ".join(path.read_text() for path in linked)
    ours = set().union(*(numbers(path.with_suffix(".csv")) for path in linked if path.with_suffix(".csv").exists()))
    for difference in SIGNED.findall(text):
        assert difference in reports, f"{difference} is in no report this line cites: {text[:200]}"
    for low, high in INTERVAL.findall(text):
        assert f"[{low}%, {high}%]" in reports, f"[{low}, {high}] is in no report this line cites: {text[:200]}"
    for perplexity in PERPLEXITY.findall(text):
        assert perplexity in ours, f"{perplexity} is no perplexity of a report this line cites: {text[:200]}"


def test_the_front_page_cites_reports_and_each_citation_is_checked() -> None:
    """The check reads something: the claims table and the paragraphs beyond 2003 each cite a report."""
    cited = {path.name for _, linked in blocks() for path in linked}
    assert {"brown_table1.md", "brown_modern.md", "brown_extensions.md", "brown_direct.md"} <= cited


VERDICT = re.compile(r"\b(holds|fails|inconclusive|confounded)\b")


def test_the_front_page_quotes_no_verdict_of_a_report_made_before_runs_shipped() -> None:
    """Such a report cannot be re-checked (its first line says so): its numbers may be quoted, its verdicts not."""
    for text, linked in blocks():
        unchecked = [p for p in linked if p.read_text().startswith("**Made before runs shipped:**")]
        if unchecked:
            assert not VERDICT.search(text), f"a verdict beside {unchecked[0].name}, not re-checked: {text[:200]}"
