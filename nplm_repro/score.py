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
import contextlib
import csv
import logging
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nplm_repro.cli import check_run, cli, named_run, run_arguments, store_arguments
from nplm_repro.data.corpus import UNK
from nplm_repro.errors import NplmError
from nplm_repro.exits import TRACEBACK
from nplm_repro.scores import KEPT_SPLITS
from nplm_repro.serving.scoring import TEXT, RunScorer, Tokens, check_run_id
from nplm_repro.storage.kept import kept_scores, log_scores

TOLERANCE = 1e-6  # relative: kept scores must give the run's logged perplexity
SHOWN_UNKNOWN = 10  # the most frequent words outside the vocabulary that are listed
ROWS_AT_ONCE = 1 << 16  # --per-token rows made Python objects at a time: the memory does not grow with the text


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


@dataclass
class Tally:
    """What was scored and counted, part by part (a split is one part, a long text several: `RunScorer.text`)."""

    what: str = ""
    tokens: int = 0
    unk: int = 0
    texts: int = 0
    logprob: float = 0.0
    known: int = 0  # tokens that are not <unk>, and their ln P
    known_logprob: float = 0.0
    unknown: Counter = field(default_factory=Counter)

    def add(self, tokens: Tokens, logprob: np.ndarray) -> None:
        self.what = f"split {tokens.span}" if tokens.span != TEXT else f"text {tokens.corpus.texts[0]}"
        start, end = tokens.corpus.bounds[tokens.span]
        known = (tokens.corpus.ids[start:end] != tokens.corpus.vocab.index(UNK)).numpy()
        self.tokens, self.unk = self.tokens + tokens.size, self.unk + tokens.unk
        self.texts = max(self.texts, tokens.texts)
        self.logprob += float(np.sum(logprob, dtype=np.float64))
        self.known += int(known.sum())
        self.known_logprob += float(np.sum(logprob[known], dtype=np.float64))
        self.unknown.update(tokens.unknown)

    def summary(self, scorer: RunScorer) -> str:
        """As SRILM's `ngram -ppl` prints it: tokens, texts and `<unk>` (their share), the total log-probability and
        the perplexity; the same without the tokens that are `<unk>` (SRILM's perplexity, which leaves out the words
        outside the vocabulary from both the sum and the count); for a user's text, its most frequent words outside
        the vocabulary."""
        lines = [
            f"run {scorer.run_id[:12]} ({scorer.name}), {self.what}: {self.tokens:,} tokens, "
            f"{self.unk:,} <unk> ({self.unk / self.tokens:.2%}), {self.texts:,} text{'s' * (self.texts != 1)}, "
            f"logprob {self.logprob:,.2f} (ln), ppl {math.exp(-self.logprob / self.tokens):.3f}"
        ]
        ppl = f"{math.exp(-self.known_logprob / self.known):.3f}" if self.known else "none (every token is <unk>)"
        lines.append(f"without <unk>: {self.known:,} tokens, logprob {self.known_logprob:,.2f} (ln), ppl {ppl}")
        if self.unknown:
            top = ", ".join(f"{word} {n:,}" for word, n in self.unknown.most_common(SHOWN_UNKNOWN))
            shown = min(SHOWN_UNKNOWN, len(self.unknown))
            lines.append(f"<unk> words, the {shown} most frequent of {len(self.unknown):,}: {top}")
        return "\n".join(lines)


@contextlib.contextmanager
def per_token_file(path: Path | None) -> Iterator[Callable[[Tokens, np.ndarray], None]]:
    """A writer of token, text and ln P of every token, part by part (the vocabulary's token, `<unk>` for a word
    outside it; the name of its text), into `path`'s `.part`, renamed to `path` once every part is written: nothing
    half-written under the name asked for, and nothing at all after an error. No path: a writer of nothing."""
    if path is None:
        yield lambda tokens, logprob: None
        return
    partial = path.with_name(path.name + ".part")
    try:
        with partial.open("w", newline="") as f:
            out = csv.writer(f, delimiter="\t", lineterminator="\n")
            out.writerow(["token", "text", "logprob"])

            def write(tokens: Tokens, logprob: np.ndarray) -> None:
                start, end = tokens.corpus.bounds[tokens.span]
                vocab, names, texts = tokens.corpus.vocab, tokens.corpus.text_names(), tokens.text_ids()
                for at in range(0, end - start, ROWS_AT_ONCE):  # a block of rows as Python objects at a time
                    block = slice(at, at + ROWS_AT_ONCE)
                    ids = tokens.corpus.ids[start:end][block].tolist()
                    for i, text, lp in zip(ids, texts[block].tolist(), logprob[block].tolist()):
                        out.writerow([vocab[i], names[text], f"{lp:.6f}"])

            yield write
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.rename(path)


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
    parts = scorer.text(args.text, args.tokenized, args.encoding) if args.text else [scorer.split(args.split or "test")]
    tally = Tally()
    with per_token_file(args.per_token) as write:
        for tokens in parts:
            logprob = scorer.logprob(tokens)
            tally.add(tokens, logprob)
            write(tokens, logprob)
    print(tally.summary(scorer))
    if args.per_token:
        print(f"per-token scores: {args.per_token}", file=sys.stderr)


main = cli(_main, traceback_env=TRACEBACK)

if __name__ == "__main__":
    main()
