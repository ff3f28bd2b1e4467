"""Intervals over texts and the three-way verdicts: calibrated, paired, declared as data."""

from __future__ import annotations

import numpy as np
import pytest

from nplm_repro.paper import FAMILY_NAMES, label, paper_table
from nplm_repro.reporting.claims import FAILS, HOLDS, INCONCLUSIVE, verdict_of
from nplm_repro.reporting.intervals import Bootstrap, Difference, Evidence, TextSums, interval
from nplm_repro.studies import declaration


def corpus_of_texts(rng: np.random.Generator, texts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Texts of 500 to 5,000 tokens, each with its own difficulty (mean ln P), and two models on them: B's ln P
    per token is A's minus 0.05 with a spread per text, so B's perplexity is about 5% higher; per text sums."""
    tokens = rng.integers(500, 5000, size=texts).astype(float)
    difficulty = -5.5 + 0.4 * rng.standard_normal(texts)
    a = difficulty * tokens
    b = (difficulty - 0.05 + 0.03 * rng.standard_normal(texts)) * tokens
    return tokens, a, b


def ratio(tokens: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """B's perplexity over A's, less 1: what a paired comparison estimates."""
    return float(np.exp((a.sum() - b.sum()) / tokens.sum()) - 1)


def test_the_paired_interval_covers_the_true_difference_in_about_95_percent_of_samples() -> None:
    """A population of 100,000 texts gives the true difference; 300 samples of 73 texts (Brown's test split has 73)
    each give a 95% interval, which must cover it in roughly 95% of them."""
    rng = np.random.default_rng(7)
    population = corpus_of_texts(rng, 100_000)
    truth = ratio(*population)
    covered = 0
    for _ in range(300):
        pick = rng.integers(0, 100_000, size=73)
        tokens, a, b = (part[pick] for part in population)
        sample_a = TextSums(tuple(range(73)), a, tokens)
        sample_b = TextSums(tuple(range(73)), b, tokens)
        evidence = Evidence({"A": {"test": [sample_a]}, "B": {"test": [sample_b]}}, {})
        found = evidence.compare("B", "A")
        covered += found.low <= truth <= found.high
    assert 0.90 <= covered / 300 <= 0.99


def test_a_paired_interval_is_narrower_than_either_models_own() -> None:
    """Texts hard for one model are hard for the other: the difference varies far less than each perplexity."""
    rng = np.random.default_rng(1)
    tokens, a, b = corpus_of_texts(rng, 73)
    evidence = Evidence(
        {
            "A": {"test": [TextSums(tuple(range(73)), a, tokens)]},
            "B": {"test": [TextSums(tuple(range(73)), b, tokens)]},
        },
        {},
    )
    low, high = evidence.perplexity("A", "test")
    own = high / low - 1
    paired = evidence.compare("B", "A")
    assert paired.high - paired.low < own / 5
    assert paired.low < ratio(tokens, a, b) < paired.high


def test_a_row_with_several_seeds_resamples_every_seed_alike_and_averages_their_perplexities() -> None:
    rng = np.random.default_rng(2)
    tokens, a, b = corpus_of_texts(rng, 20)
    seeds = [TextSums(tuple(range(20)), a, tokens), TextSums(tuple(range(20)), b, tokens)]
    bootstrap = Bootstrap(20, resamples=50)
    point, resampled = bootstrap.row(seeds)
    assert point == pytest.approx((seeds[0].perplexity() + seeds[1].perplexity()) / 2)
    each = [s.perplexity(bootstrap.weights) for s in seeds]
    np.testing.assert_allclose(resampled, (each[0] + each[1]) / 2)
    assert np.all(bootstrap.weights.sum(axis=1) == 20)  # each resample draws as many texts as the split has


def test_resamples_are_fixed_by_the_seed_so_a_report_rebuilds_identically() -> None:
    np.testing.assert_array_equal(Bootstrap(73).weights, Bootstrap(73).weights)
    assert not np.array_equal(Bootstrap(73, seed=1).weights, Bootstrap(73).weights)


def test_the_interval_is_the_central_95_percent() -> None:
    assert interval(np.arange(1001.0)) == pytest.approx((25.0, 975.0))


@pytest.mark.parametrize(
    ("low", "high", "kind", "threshold", "expected"),
    [
        (0.01, 0.03, "better", 0.0, HOLDS),
        (-0.03, -0.01, "better", 0.0, FAILS),
        (-0.01, 0.01, "better", 0.0, INCONCLUSIVE),
        (0.22, 0.30, "better", 0.20, HOLDS),  # "at least 20%": the lower end against 20%
        (0.18, 0.23, "better", 0.20, INCONCLUSIVE),
        (0.10, 0.19, "better", 0.20, FAILS),
        (-0.004, 0.006, "equivalent", 0.01, HOLDS),  # no effect: the whole interval within +-1%
        (0.005, 0.02, "equivalent", 0.01, INCONCLUSIVE),
        (0.012, 0.02, "equivalent", 0.01, FAILS),
        (-0.03, -0.011, "equivalent", 0.01, FAILS),
    ],
)
def test_three_way_verdicts(low: float, high: float, kind: str, threshold: float, expected: str) -> None:
    assert verdict_of(Difference((low + high) / 2, low, high), kind, threshold) == expected


@pytest.mark.parametrize("study", ["brown_table1", "ap_table2"])
def test_every_row_a_claim_names_is_a_row_of_the_papers_table(study: str) -> None:
    labels = set(paper_table(study).apply(label, axis=1))
    families = set(paper_table(study)["family"])
    for claim in declaration(study)["claims"]:
        for kind in ("better", "equivalent"):
            for pair in claim.get(kind, []):
                for row in pair:
                    if isinstance(row, dict):  # families the paper's tables know, one at least in this one
                        assert set(row["best_of"]) <= set(FAMILY_NAMES) and families & set(row["best_of"])
                    else:
                        assert row in labels, claim["claim"]
