"""`nplm-ask`: ask a trained run what it learned: text continued from a prompt, or the nearest words of words in
its learned feature space C (cosine similarity).

nplm-ask generate 3f2a... --prompt "The jury said" --words 30 --draw-seed 1
nplm-ask generate --row MLP9 --study brown_table1 --seed 2 --prompt "It was" --temperature 0.8   # seed 2's run
nplm-ask neighbours --row MLP9 --study brown_table1 cat dog room walking
nplm-ask features 3f2a... --log                      # a run from before runs kept them: its features/ artifacts

The run is rebuilt from what it recorded (nplm_repro/serving/scoring.py), its words read as `nplm-score --text`
reads a text: the run's own reader and vocabulary. --row, --study, --seed and --experiment name a run as they do in
nplm-score (cli.py's `run_arguments`); --run-seed, their --seed before, still works for this release, with a warning.
"""

from __future__ import annotations

import argparse
import logging
import math

from nplm_repro.cli import check_run, cli, named_run, run_arguments, store_arguments
from nplm_repro.data.corpus import END_OF_TEXT, UNK
from nplm_repro.errors import NplmError
from nplm_repro.exits import TRACEBACK
from nplm_repro.models.use import continue_ids, nearest
from nplm_repro.serving import features as tracked
from nplm_repro.serving.features import log_features
from nplm_repro.serving.scoring import RunScorer


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nplm-ask", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="continue a prompt, one word at a time")
    neighbours = commands.add_parser("neighbours", help="the nearest words of words in the feature space C")
    features = commands.add_parser("features", help="the run's features/ artifacts: probe words' neighbours, a map")
    for command in (generate, features):
        command.add_argument("run_id", nargs="?", help="the trained run (or --row and --study)")
    neighbours.add_argument("items", nargs="+", metavar="[RUN_ID] WORD", help="the trained run (or --row), then words")
    for command in (generate, neighbours, features):
        run_arguments(command, "asked", run_seed=True)
        command.add_argument("--data-path", help="the run's corpus, where its recorded path no longer holds it")
        store_arguments(command)
    generate.add_argument("--prompt", default="", help="the text to continue (default: none, as a text starts)")
    generate.add_argument("--words", type=int, default=30, help="how many words to draw (default: 30)")
    generate.add_argument("--temperature", type=float, default=1.0, help="0: always the most probable word")
    generate.add_argument(
        "--draw-seed", type=int, default=1, help="the draws' seed: the same seed, the same text (default: 1)"
    )
    generate.add_argument("--no-unk", action="store_true", help="never draw <unk>")
    features.add_argument("--log", action="store_true", help="attach them to the run (as runs now do when they end)")
    neighbours.add_argument(
        "--k", type=int, default=10, help="neighbours per word (default: 10; at most the vocabulary's size - 1)"
    )
    args = parser.parse_args()
    if args.command == "neighbours":  # with --row every item is a word, else the first names the run
        args.run_id, args.words = (None, args.items) if args.row else (args.items[0], args.items[1:])
        if not args.words:
            raise NplmError("neighbours: name at least one word after the run")
    check_run(args)
    if args.command == "generate" and args.words < 1:
        raise NplmError(f"--words {args.words}: must be at least 1")
    if args.command == "generate" and not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise NplmError(f"--temperature {args.temperature}: must be a finite number >= 0 (0: the most probable word)")
    if args.command == "neighbours" and args.k < 1:
        raise NplmError("--k must be at least 1")
    return args


def generate(scorer: RunScorer, args: argparse.Namespace) -> str:
    vocab = scorer.corpus.vocab
    prompt = scorer.words(args.prompt)
    never = (vocab.index(UNK),) if args.no_unk else ()
    drawn = continue_ids(
        scorer.model(), prompt, args.words, args.temperature, args.draw_seed, vocab.index(END_OF_TEXT), never
    )
    shown = " ".join(vocab[i] for i in prompt) + " | " + " ".join(vocab[i] for i in drawn)
    how = f"temperature {args.temperature:g}, draw seed {args.draw_seed}" if args.temperature else "most probable words"
    return f"run {scorer.run_id[:12]} ({scorer.name}), {args.words} words, {how}:\n{shown.strip()}"


def word_id(scorer: RunScorer, word: str) -> int:
    """`word` as one entry of the run's vocabulary, so that each line's label is the word whose neighbours it shows:
    the entry itself (`<unk>` too), else the word read as the run reads a text (an unknown word is an error naming
    its closest spellings), which must be one word: an empty word, or one that reads as several, is refused."""
    if not word.strip():
        raise NplmError(f"neighbours: {word!r} is no word: name words of the run's vocabulary")
    vocab = scorer.corpus.vocab
    if word in vocab:
        return vocab.index(word)
    ids = scorer.words(word)
    if len(ids) != 1:
        read = " ".join(vocab[i] for i in ids) or "nothing"
        raise NplmError(f"neighbours: {word!r} reads as {len(ids)} words of the run ({read}): name one word each")
    return ids[0]


def neighbours(scorer: RunScorer, args: argparse.Namespace) -> str:
    """The `args.k` nearest words of each word (one vocabulary entry each, `word_id`); k beyond the others in the
    vocabulary is refused, naming its size."""
    vocab = scorer.corpus.vocab
    if args.k > len(vocab) - 1:
        raise NplmError(
            f"--k {args.k}: the run's vocabulary has {len(vocab):,} words, so a word has at most {len(vocab) - 1:,} "
            "neighbours"
        )
    ids = [word_id(scorer, word) for word in args.words]
    found = nearest(scorer.model().word_features(), ids, args.k)
    lines = [
        f"run {scorer.run_id[:12]} ({scorer.name}), {args.k} nearest words by centred cosine similarity of the word features:"
    ]
    for word, near in zip(args.words, found):
        lines.append(f"{word}: " + ", ".join(f"{vocab[i]} {s:.2f}" for i, s in near))
    return "\n".join(lines)


def features(scorer: RunScorer, log: bool) -> str:
    """The probe words' neighbours and the paper's sentences; with `log`, all of features/ attached to the run."""
    module = scorer.model()
    if log:
        log_features(scorer.client, scorer.run_id, module, scorer.corpus, scorer.name)
    lines = [*tracked.neighbours(module, scorer.corpus), *tracked.sentences(module, scorer.corpus)]
    attached = f"\nattached to run {scorer.run_id[:12]}: {tracked.FOLDER}/ (neighbours.md, sentences.md, map.png)"
    return "\n".join(lines) + (attached if log else "")


def _main() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    args = _arguments()
    run_id = named_run(args)
    scorer = RunScorer(args.tracking_uri, run_id, args.data_path)
    if scorer.kind != "trained":
        raise NplmError(f"run {run_id} is a {scorer.kind} run: generate and neighbours ask a trained model itself")
    if args.command == "features":
        print(features(scorer, args.log))
        return
    print(generate(scorer, args) if args.command == "generate" else neighbours(scorer, args))


main = cli(_main, traceback_env=TRACEBACK)

if __name__ == "__main__":
    main()
