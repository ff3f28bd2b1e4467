"""`nplm-score`: a recorded run's log-probability of every token of a split or of your own text, and exactly what
was counted (as SRILM's `ngram -ppl` and KenLM's `query` print it).

nplm-score 3f2a...                                   # a run id: its test split
nplm-score --row MLP5 --study brown_table1 --split valid
nplm-score 3f2a... --text story.txt --per-token story.tsv
nplm-score 3f2a... --log                             # attach kept scores to a run made before runs kept them

The run is rebuilt from what it recorded (nplm_repro/tracking/scoring.py): MLP, n-gram and mixed runs alike.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import sys
from pathlib import Path

import numpy as np

from nplm_repro.cli import TRACEBACK, cli, store_arguments
from nplm_repro.errors import NplmError
from nplm_repro.scores import KEPT_SPLITS
from nplm_repro.tracking.kept import kept_scores, log_scores
from nplm_repro.tracking.scoring import RunScorer, Tokens, find_row
from nplm_repro.tracking.store import existing_store

TOLERANCE = 1e-6  # relative: kept scores must give the run's logged perplexity


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nplm-score", description=__doc__.splitlines()[0])
    parser.add_argument("run_id", nargs="?", help="the run to score (or --row and --study)")
    parser.add_argument("--row", help="a paper row (MLP5, Del. Int., ...): the newest FINISHED run of it in --study")
    parser.add_argument("--study", help="with --row: the study whose run is scored (tag study)")
    parser.add_argument("--seed", type=int, help="with --row: that seed's run (default: the newest of any seed)")
    parser.add_argument("--experiment", default="brown", help="with --row: the MLflow experiment (default: brown)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--split", choices=("train", "valid", "test"), help="a split of the run's data (default: test)")
    where.add_argument("--text", type=Path, help="a text file, read with the run's reader and vocabulary")
    parser.add_argument("--per-token", type=Path, help="write token, text and ln P of every token to this TSV file")
    parser.add_argument("--log", action="store_true", help="attach the kept scores (valid, test) to a run lacking them")
    parser.add_argument("--data-path", help="the run's corpus, where its recorded path no longer holds it")
    store_arguments(parser)
    args = parser.parse_args()
    if bool(args.run_id) == bool(args.row):
        raise NplmError("name one run: a run id, or --row with --study")
    if args.row and not args.study:
        raise NplmError("--row needs --study: the study whose run of that row is scored")
    if args.log and (args.text or args.split or args.per_token):
        raise NplmError("--log scores valid and test, as a run keeps them: it takes no --split, --text or --per-token")
    if args.per_token and args.per_token.exists():
        raise NplmError(f"--per-token {args.per_token}: the file exists; name a new one")
    if args.per_token and not args.per_token.parent.is_dir():
        raise NplmError(f"--per-token {args.per_token}: no such directory {args.per_token.parent}")
    return args


def summary(scorer: RunScorer, tokens: Tokens, logprob: np.ndarray) -> str:
    """One line: what was scored and counted, the total log-probability and the perplexity."""
    total = float(np.sum(logprob, dtype=np.float64))
    what = f"split {tokens.span}" if tokens.span != "text" else f"text {tokens.corpus.texts[0]}"
    return (
        f"run {scorer.run_id[:12]} ({scorer.name}), {what}: {tokens.size:,} tokens, {tokens.unk:,} <unk>, "
        f"{tokens.texts:,} text{'s' * (tokens.texts != 1)}, logprob {total:,.2f} (ln), ppl {math.exp(-total / tokens.size):.3f}"
    )


def write_per_token(path: Path, tokens: Tokens, logprob: np.ndarray) -> None:
    """token, text, ln P: the vocabulary's token (`<unk>` for a word outside it), the name of its text."""
    start, end = tokens.corpus.bounds[tokens.span]
    vocab, names = tokens.corpus.vocab, tokens.corpus.text_names()
    partial = path.with_name(path.name + ".part")
    with partial.open("w", newline="") as f:
        out = csv.writer(f, delimiter="\t", lineterminator="\n")
        out.writerow(["token", "text", "logprob"])
        for i, text, lp in zip(tokens.corpus.ids[start:end].tolist(), tokens.text_ids().tolist(), logprob.tolist()):
            out.writerow([vocab[i], names[text], f"{lp:.6f}"])
    partial.rename(path)  # nothing half-written under the name asked for


def backfill(scorer: RunScorer) -> str:
    """Attach the run's kept scores, after checking that they give its logged perplexities."""
    if kept_scores(scorer.client, scorer.run_id) is not None:
        return f"run {scorer.run_id[:12]} ({scorer.name}) already keeps its scores: nothing to do"
    scores = scorer.kept()
    for split in KEPT_SPLITS:
        logged = scorer.run.data.metrics.get(f"{split}_ppl")
        ours = scores.splits[split].perplexity()
        if logged is None or abs(ours / logged - 1) > TOLERANCE:
            raise NplmError(
                f"run {scorer.run_id}: {split} scored again gives perplexity {ours:.6f}, the run logged {logged}: "
                "not the same model or data, so no scores were attached"
            )
    log_scores(scorer.client, scorer.run_id, scores)
    perplexities = ", ".join(f"{s} {scores.splits[s].perplexity():.2f}" for s in KEPT_SPLITS)
    return f"run {scorer.run_id[:12]} ({scorer.name}): kept scores attached ({perplexities}, as logged)"


def _main() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # its device and tip lines, at every Trainer
    args = _arguments()
    existing_store(args.tracking_uri)
    run_id = args.run_id or find_row(args.tracking_uri, args.experiment, args.study, args.row, args.seed)
    scorer = RunScorer(args.tracking_uri, run_id, args.data_path)
    if args.log:
        print(backfill(scorer))
        return
    tokens = scorer.text(args.text) if args.text else scorer.split(args.split or "test")
    logprob = scorer.logprob(tokens)
    if args.per_token:
        write_per_token(args.per_token, tokens, logprob)
    print(summary(scorer, tokens, logprob))
    if args.per_token:
        print(f"per-token scores: {args.per_token}", file=sys.stderr)


main = cli(_main, traceback_env=TRACEBACK)

if __name__ == "__main__":
    main()
