"""How much our data alone moves perplexities, measured rather than guessed.

Our Brown stream is not byte-identical to the paper's (|V| 17,907 against the 16,383 of §4, p. 1147;
tokenisation; split boundaries). Two measurements separate that from the models:
- the n-gram rows have no training noise, so their gap to the paper's numbers is the data's share;
- the same n-gram configurations run on other data of the same corpus (`sweeps/brown_vocab.yaml`: words seen
  <= 4 times merged, |V| just below the paper's) show how perplexity moves with |V| alone, as a log-log slope.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from nplm_repro.tracking.best import finished_rows

COMPARED = ("valid", "test")  # train has no paper number for most n-gram rows


def _model_config(config: str) -> str:
    """The configuration less its data keys: the same model on other data has the same one."""
    return json.dumps({k: v for k, v in json.loads(config).items() if not k.startswith("data.")}, sort_keys=True)


def _data_keys(config: str, reference: str) -> str:
    """The data keys of `config` that differ from `reference`, as overrides."""
    ours, ref = json.loads(config), json.loads(reference)
    keys = sorted(k for k in {*ours, *ref} if k.startswith("data.") and ours.get(k) != ref.get(k))
    return ", ".join(f"{k}={ours.get(k, '(unset)')}" for k in keys)


def ngram_offset(table: pd.DataFrame) -> str | None:
    """The n-gram rows' relative difference from the paper, per split: range and mean."""
    ngrams = finished_rows(table, "counted")
    parts = []
    for split in COMPARED:
        diff = ngrams[f"{split}_rel_diff"].dropna()
        if len(diff):
            parts.append(f"{split} {diff.min():+.1%} to {diff.max():+.1%} (mean {diff.mean():+.1%})")
    if not parts:
        return None
    return (
        f"The n-gram rows have no training noise, so their gap to the paper is what our data alone moves: "
        f"{'; '.join(parts)}, over {len(ngrams)} rows. Read each MLP row's gap against it."
    )


def vocabulary_slope(
    table: pd.DataFrame, other: pd.DataFrame, vocab_size: int, paper_vocab_size: int | None
) -> list[str]:
    """The table's n-gram rows against the same configurations on other data (one line per data fingerprint)."""
    ngrams = finished_rows(table, "counted")
    by_model = {_model_config(r.config): r for r in ngrams.itertuples()}
    other = other[(other["kind"] == "counted") & (other["state"] == "finished")]
    other = other.assign(model_config=other["config"].map(_model_config))
    other = other[other["model_config"].isin(by_model)]
    lines = []
    for fingerprint, runs in other.groupby("fingerprint", sort=False):
        their_vocab = int(runs["vocab_size"].iloc[0])
        if their_vocab == vocab_size:
            continue  # the same vocabulary: not what this measures
        log_v = np.log(their_vocab / vocab_size)
        rows, slopes = [], []
        for model_config, row in by_model.items():  # the table's order
            group = runs[runs["model_config"] == model_config]
            if group.empty:
                continue
            steps = []
            for split in COMPARED:
                ours, theirs = getattr(row, f"{split}_ppl"), group[f"{split}_ppl"].mean()
                slopes.append(np.log(theirs / ours) / log_v)
                steps.append(f"{split} {ours:.1f} -> {theirs:.1f} ({theirs / ours - 1:+.1%})")
            rows.append(f"{row.label}: {', '.join(steps)}")
        slope = float(np.mean(slopes))
        data = _data_keys(runs["config"].iloc[0], by_model[runs["model_config"].iloc[0]].config)
        line = (
            f"|V| = {their_vocab:,} ({data}; fingerprint `{fingerprint}`), {their_vocab / vocab_size - 1:+.1%} "
            f"against ours: {'; '.join(rows)}. Perplexity moves {slope:.2f}% per 1% of |V|"
        )
        if paper_vocab_size:
            shift = (paper_vocab_size / vocab_size) ** slope - 1
            line += (
                f"; at the paper's |V| = {paper_vocab_size:,} ({paper_vocab_size / vocab_size - 1:+.1%} against ours) "
                f"the vocabulary alone would move our perplexities by about {shift:+.1%}"
            )
        lines.append(line + ".")
    return lines
