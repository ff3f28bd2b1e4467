"""`nplm-score`: a recorded run's log-probability of every token of a split or of your own text, and exactly what
was counted (as SRILM's `ngram -ppl` and KenLM's `query` print it).

nplm-score 3f2a...                                   # a run id: its test split
nplm-score --row MLP5 --study brown_table1 --split valid
nplm-score --row MLP5 --study brown_table1 --seed 2       # that seed's run of the row
nplm-score 3f2a... --text story.txt --per-token story.tsv
nplm-score 3f2a... --text tokens.txt --tokenized          # whitespace-separated tokens, read as they are
nplm-score 3f2a... --log                             # attach kept scores to a run made before runs kept them

The run is rebuilt from what it recorded (nplm_repro/serving/scoring.py): MLP, n-gram and mixed runs alike.
--row, --study, --seed and --experiment name a run as they do in nplm-ask (cli.py's `run_arguments`).
"""

from __future__ import annotations

import argparse
import codecs
import csv
import logging
import math
import sys
from pathlib import Path

import numpy as np

from nplm_repro.cli import check_run, cli, named_run, run_arguments, store_arguments
from nplm_repro.data.corpus import UNK
from nplm_repro.errors import NplmError
from nplm_repro.exits import TRACEBACK
from nplm_repro.scores import KEPT_SPLITS
from nplm_repro.serving.scoring import RunScorer, Tokens, check_run_id
from nplm_repro.storage.kept import kept_scores, log_scores

TOLERANCE = 1e-6  # relative: kept scores must give the run's logged perplexity
SHOWN_UNKNOWN = 10  # the most frequent words outside the vocabulary that are listed


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nplm-score", description=__doc__.splitlines()[0])
    parser.add_argument("run_id", nargs="?", help="the run to score (or --row and --study)")
    run_arguments(parser, "scored")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--split", choices=("train", "valid", "test"), help="a split of the run's data (default: test)")
    where.add_argument("--text", type=Path, help="a text file, read as the run reads its corpus, and its vocabulary")
    parser.add_argument(
        "--encoding", help="the --text file's encoding (default: its byte-order mark's, else the run corpus's: utf-8)"
    )
    parser.add_argument(
        "--tokenized", action="store_true", help="with --text: whitespace-separated tokens, read as they are"
    )
    parser.add_argument("--per-token", type=Path, help="write token, text and ln P of every token to this TSV file")
    parser.add_argument("--log", action="store_true", help="attach the kept scores (valid, test) to a run lacking them")
    parser.add_argument("--data-path", help="the run's corpus, where its recorded path no longer holds it")
    store_arguments(parser)
    args = parser.parse_args()
    check_run(args)
    if args.run_id:
        check_run_id(args.run_id)
    if args.tokenized and not args.text:
        raise NplmError("--tokenized says how --text is read: give --text")
    if args.encoding and not args.text:
        raise NplmError("--encoding says how --text is read: give --text")
    if args.encoding:
        try:
            codecs.lookup(args.encoding)
        except LookupError:
            raise NplmError(f"--encoding {args.encoding}: not an encoding Python knows (utf-8, utf-16, latin-1, ...)")
    if args.log and (args.text or args.split or args.per_token):
        raise NplmError("--log scores valid and test, as a run keeps them: it takes no --split, --text or --per-token")
    if args.per_token and args.per_token.exists():
        raise NplmError(f"--per-token {args.per_token}: the file exists; name a new one")
    if args.per_token and not args.per_token.parent.is_dir():
        raise NplmError(f"--per-token {args.per_token}: no such directory {args.per_token.parent}")
    if args.per_token:
        writable(args.per_token)
    return args


def writable(path: Path) -> None:
    """Refuse a --per-token file that cannot be written, before any scoring: its `.part` is made and removed."""
    partial = path.with_name(path.name + ".part")
    try:
        partial.open("w").close()
        partial.unlink()
    except OSError as error:
        raise NplmError(f"--per-token {path}: cannot write in {path.parent} ({error.strerror or error})") from None


def summary(scorer: RunScorer, tokens: Tokens, logprob: np.ndarray) -> str:
    """What was scored and counted, as SRILM's `ngram -ppl` prints it: tokens, texts and `<unk>` (their share), the
    total log-probability and the perplexity; the same without the tokens that are `<unk>` (SRILM's perplexity,
    which leaves out the words outside the vocabulary from both the sum and the count); for a user's text, its most
    frequent words outside the vocabulary."""
    total = float(np.sum(logprob, dtype=np.float64))
    what = f"split {tokens.span}" if tokens.span != "text" else f"text {tokens.corpus.texts[0]}"
    counted = (
        f"run {scorer.run_id[:12]} ({scorer.name}), {what}: {tokens.size:,} tokens, "
        f"{tokens.unk:,} <unk> ({tokens.unk / tokens.size:.2%}), {tokens.texts:,} text{'s' * (tokens.texts != 1)}, "
        f"logprob {total:,.2f} (ln), ppl {math.exp(-total / tokens.size):.3f}"
    )
    lines = [counted]
    start, end = tokens.corpus.bounds[tokens.span]
    known = (tokens.corpus.ids[start:end] != tokens.corpus.vocab.index(UNK)).numpy()
    kept, count = float(np.sum(logprob[known], dtype=np.float64)), int(known.sum())
    ppl = f"{math.exp(-kept / count):.3f}" if count else "none (every token is <unk>)"
    lines.append(f"without <unk>: {count:,} tokens, logprob {kept:,.2f} (ln), ppl {ppl}")
    if tokens.unknown:
        top = ", ".join(f"{word} {n:,}" for word, n in tokens.unknown.most_common(SHOWN_UNKNOWN))
        shown = min(SHOWN_UNKNOWN, len(tokens.unknown))
        lines.append(f"<unk> words, the {shown} most frequent of {len(tokens.unknown):,}: {top}")
    return "\n".join(lines)


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
    run_id = named_run(args)
    scorer = RunScorer(args.tracking_uri, run_id, args.data_path)
    if args.log:
        print(backfill(scorer))
        return
    tokens = scorer.text(args.text, args.tokenized, args.encoding) if args.text else scorer.split(args.split or "test")
    logprob = scorer.logprob(tokens)
    if args.per_token:
        write_per_token(args.per_token, tokens, logprob)
    print(summary(scorer, tokens, logprob))
    if args.per_token:
        print(f"per-token scores: {args.per_token}", file=sys.stderr)


main = cli(_main, traceback_env=TRACEBACK)

if __name__ == "__main__":
    main()
