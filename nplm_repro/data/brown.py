"""The Brown corpus as the paper streams it (paper §4, p. 1147), from NLTK's brown.zip or its unzipped folder.

One token stream in file order ca01..cr09: words as written (case and punctuation kept, tags stripped), `<eop>`
after each paragraph, `<eot>` after each text. The first 800,000 tokens train, the next 200,000 validate, the rest
test. Words of frequency <= 3 become `<unk>`. By default the frequencies are counted on the whole stream: that is
what reproduces the deleted-interpolation perplexities measured on this stream by an independent implementation
(31.9 / 358.9 / 332.6, pinned in tests/test_ngram.py); `vocab_from: train` counts on the training split only.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from pathlib import Path

from nplm_repro.data.corpus import Corpus, make_corpus
from nplm_repro.data.files import read_members
from nplm_repro.data.splits import split_bounds
from nplm_repro.data.tokens import END_OF_PARAGRAPH, END_OF_TEXT, split_paragraphs
from nplm_repro.data.vocabulary import build_vocab, check_vocab_from, word_counts
from nplm_repro.errors import NplmError
from nplm_repro.paths import why_missing

log = logging.getLogger(__name__)

BROWN_TEXT = re.compile(r"c[a-r]\d\d")
HOW_TO_GET_BROWN = "get it with `python -m nltk.downloader brown` or point data.path at brown.zip"


def nltk_data_dirs() -> list[Path]:
    """NLTK's own search path (NLTK_DATA, ~/nltk_data, the system locations), in NLTK's order."""
    import nltk.data  # seconds to import, and needed only when data.path is not set

    return [Path(p).expanduser() for p in nltk.data.path]


def brown_candidates(path: str | os.PathLike | None) -> list[Path]:
    """Where to look for Brown: the configured path alone (a typo must not quietly read another copy), else
    every NLTK data location, in NLTK's order."""
    if path:
        return [Path(path).expanduser()]
    candidates = []
    for root in nltk_data_dirs():
        candidates += [root / "corpora" / "brown.zip", root / "corpora" / "brown"]
    return candidates


def find_brown(path: str | os.PathLike | None) -> Path:
    """The first candidate that exists; the error lists every place that was looked at."""
    candidates = brown_candidates(path)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    looked = ", ".join(f"{c} ({why_missing(c)})" if c.is_symlink() else str(c) for c in candidates)
    raise NplmError(f"Brown corpus not found (looked in: {looked}); {HOW_TO_GET_BROWN}")


def _holding_texts(source: Path) -> Path:
    """The zip or folder that holds the texts: `source`, or for a folder without them its brown.zip,
    corpora/brown.zip or brown/ (an NLTK data folder, or its corpora folder)."""
    try:
        if not source.is_dir() or any(BROWN_TEXT.fullmatch(p.name) for p in source.iterdir()):
            return source
    except OSError as error:
        raise NplmError(f"{source}: cannot read ({error})") from error
    inner = (source / "brown.zip", source / "corpora" / "brown.zip", source / "brown")
    found = next((p for p in inner if p.exists()), None)
    if found is None:
        raise NplmError(f"{source}: no Brown texts (ca01..cr09) in this folder")
    return _holding_texts(found)


def _is_text(member: str) -> bool:
    return BROWN_TEXT.fullmatch(member.rsplit("/", 1)[-1]) is not None


def _words(line: str) -> list[str]:
    """A line's words: its whitespace-separated word/tag items without their tags."""
    return [item.rsplit("/", 1)[0] for item in line.split()]


def brown_text(text: str) -> tuple[list[str], Counter]:
    """One text as Brown's stream has it: its paragraphs' words, `<eop>` after each, `<eot>` at its end; and what
    was counted (paragraphs, words). Also how a user's text in Brown's word/TAG format is read (brown_plain.py)."""
    tokens: list[str] = []
    counted: Counter = Counter()
    for paragraph in split_paragraphs(text.splitlines(), _words):
        tokens += [*paragraph, END_OF_PARAGRAPH]
        counted["words"] += len(paragraph)
        counted["paragraphs"] += 1
    tokens.append(END_OF_TEXT)
    return tokens, counted


def read_brown(source: Path) -> tuple[list[str], Counter, tuple[str, ...]]:
    """The paper's token stream, what was counted (texts, paragraphs, words) and the names of its texts (ca01 ...)."""
    files = read_members(_holding_texts(source), _is_text)
    if not files:
        raise NplmError(f"{source}: no Brown texts (ca01..cr09) found; {HOW_TO_GET_BROWN}")
    tokens: list[str] = []
    counted: Counter = Counter()
    for name, raw in files:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise NplmError(f"{source}: {name.rsplit('/', 1)[-1]} is not UTF-8 at byte {error.start}") from error
        words, found = brown_text(text)
        tokens += words
        counted.update(found)
        counted["texts"] += 1
    if counted["words"] == 0:
        raise NplmError(f"{source}: the corpus is empty (no words in {len(files)} text{'s' * (len(files) != 1)})")
    return tokens, counted, tuple(re.split("[/:]", name)[-1] for name, _ in files)


def prepare_brown(
    path: str | None,
    train: int = 800_000,
    valid: int = 200_000,
    test: int | None = None,
    max_unk_freq: int = 3,
    vocab_from: str = "stream",
) -> Corpus:
    """Brown as the paper streams it, with frequencies counted on `vocab_from` ('stream' or 'train'): its files and
    tokens (`read_brown`), the splits' bounds, the vocabulary, the Corpus."""
    check_vocab_from(vocab_from)
    source = find_brown(path)
    tokens, counted, texts = read_brown(source)
    bounds = split_bounds(len(tokens), train, valid, test)
    tokens = tokens[: bounds["test"][1]]
    vocab = build_vocab(word_counts(tokens, bounds, vocab_from), max_unk_freq)
    corpus = make_corpus(Corpus, "brown", tokens, bounds, counted, vocab, source.name, texts=texts)
    log.info("read %s", source)
    log.info("%s", corpus.summary())
    return corpus
