"""A user's plain-text corpus and the paper's AP News preprocessing (§4, p. 1147), for Table 2 (p. 1150) on any news.

Reading. `data.path` is a file, a directory (every file below it, hidden ones skipped) or a `.zip`; files are
read in sorted order of their path, and `members` keeps only those whose path (relative to the directory, or
inside the zip) starts with it, e.g. `treebank/raw/wsj_`. Text is UTF-8 (or `encoding`), its invisible characters
dropped (`drop_invisible`). Each file is one text, `<eot>` after it; with `paragraphs` on, `<eop>` after each
block of non-blank lines (as in Brown). Lines equal to one of `drop_lines` are skipped (`.START`, the first line of
the Penn Treebank's raw files). A file whose every item is `word/TAG` (Brown, the Treebank's `.pos`, whose `[ ]`
chunk brackets and `===` lines are skipped) is tagged (`tags: auto`): its words are kept as they are and its tags
name the proper nouns; any other file is cut by `tokenize`.

Preprocessing, each step switchable, in this order (the paper lists them without an order):
1. `numbers`: whole-token numeric forms become symbols (`NUMBERS`: years, ordinals, fractions, decimals,
   integers); other tokens with digits (10-year, 1989-90, A300) are left to the vocabulary.
2. `proper_nouns`: proper nouns become `<proper>`: tagged words by their tag (NNP, NNPS; Brown's NP, NPS),
   untagged ones by `proper_noun_types`.
3. `lowercase`: every remaining token is lower-cased.
4. The vocabulary: `<eop>`, `<eot>`, every symbol and every punctuation token that occurs are always kept; then
   the most frequent words seen more than `max_unk_freq` times, until |V| (with `<unk>`) is `vocab_size`;
   every other word becomes `<unk>`. Frequencies are counted on `vocab_from` (train by default).
Splits: token counts (`split.train`, `split.valid`; `split.test` null = the rest), or all three null for the
paper's AP proportions 13,994,528 / 963,138 / 963,071 of the stream, or separate sources (`split.valid_path`,
`split.test_path`; `data.path` is then the training text).
"""

from __future__ import annotations

import codecs
import logging
import re
import sys
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

from nplm_repro.data.corpus import Corpus, make_corpus
from nplm_repro.data.files import open_zip, read_members
from nplm_repro.data.splits import SPLITS, split_bounds
from nplm_repro.data.tokens import END_OF_PARAGRAPH, END_OF_TEXT, split_paragraphs
from nplm_repro.data.vocabulary import UNK, check_vocab_from, word_counts
from nplm_repro.errors import NplmError
from nplm_repro.paths import why_missing

log = logging.getLogger(__name__)

PROPER = "<proper>"
NUMBERS = (  # tried in order; the first that matches the whole token names its symbol
    ("<year>", re.compile(r"(1[5-9]|20)\d\ds?")),  # 1500..2099 and decades (1990s)
    ("<ordinal>", re.compile(r"\d+(st|nd|rd|th)", re.IGNORECASE)),  # 3rd, 21st
    ("<fraction>", re.compile(r"\d+/\d+")),  # 1/2 (the Treebank's 1\/2 once unescaped)
    ("<decimal>", re.compile(r"(\d{1,3}(,\d{3})+|\d+)\.\d+")),  # 3.5, 1,000.25
    ("<int>", re.compile(r"\d{1,3}(,\d{3})+|\d+")),  # 61, 1,000
)
SYMBOLS = (*(symbol for symbol, _ in NUMBERS), PROPER)
AP_SPLIT = (13_994_528, 963_138, 963_071)  # train / valid / test tokens of AP News (§4, p. 1147)
TOKEN = re.compile(
    r"(?:[^\W\d_]\.){2,}"  # initialisms with their dots: U.S., N.V.
    r"|\d+(?:[.,/:]\d+)*\w*(?:[-'’]\w+)*"  # numbers: 1,000 3.5 1/2 10:30 21st 1990s 10-year
    r"|\w+(?:[-'’]\w+)*"  # words, inner hyphens and apostrophes kept: don't, state-of-the-art
    r"|\S"  # any other character alone: punctuation and symbols
)
TAGGED = re.compile(r"\S+/[^\s/]+")
CHUNK = ("[", "]")  # the Treebank's .pos chunk brackets
PROPER_TAGS = {"NNP", "NNPS", "NP", "NPS", "NP$", "NPS$"}  # Penn Treebank; Brown (np, nps, np$, np-tl, ...)
SENTENCE_END = {".", "!", "?"}
OPENERS = {'"', "'", "`", "``", "(", "[", "“", "‘"}


def tokenize(line: str) -> list[str]:
    """Words and punctuation as separate tokens, by one regular expression (`TOKEN`): deterministic.

    >>> tokenize("Mr. Smith's U.S. unit paid $1,000.50 -- on Nov. 29th.")
    ['Mr', '.', "Smith's", 'U.S.', 'unit', 'paid', '$', '1,000.50', '-', '-', 'on', 'Nov', '.', '29th', '.']
    """
    return TOKEN.findall(line)


def number_symbol(token: str) -> str | None:
    """The symbol of a numeric form (`NUMBERS`), or None."""
    return next((symbol for symbol, form in NUMBERS if form.fullmatch(token)), None)


def is_punctuation(token: str) -> bool:
    """Only Unicode punctuation and symbol characters (, . `` -- $ %): always kept in the vocabulary."""
    return all(unicodedata.category(ch)[0] in "PS" for ch in token)


def _word_of(item: str) -> tuple[str, bool]:
    """A tagged item's word (the Treebank's escaped slash and star restored) and whether its tag is a proper noun's."""
    word, tag = item.rsplit("/", 1)
    base = re.split(r"[-+|]", tag.upper())[0]
    return word.replace("\\/", "/").replace("\\*", "*"), base in PROPER_TAGS


@dataclass
class Stream:
    """Tokens as read, and per token whether it starts a sentence and, in tagged files, whether it is proper."""

    tokens: list[str]
    initial: list[bool]
    tagged_proper: list[bool | None]
    counted: Counter

    def add(self, token: str, initial: bool = False, proper: bool | None = None) -> None:
        self.tokens.append(token)
        self.initial.append(initial)
        self.tagged_proper.append(proper)


def _is_tagged(lines: list[str], tags: str | bool) -> bool:
    items = [i for line in lines if line.strip("= \t") for i in line.split() if i not in CHUNK]
    if tags == "auto":
        return bool(items) and all(TAGGED.fullmatch(i) for i in items)
    return bool(tags)


def _line_words(name: str, tagged: bool, line: str) -> list[tuple[str, bool, bool | None]]:
    """A line's tokens, each with whether it starts a sentence and, if tagged, whether its tag is a proper noun's."""
    words: list[tuple[str, bool, bool | None]] = []
    start = True
    for item in line.split() if tagged else tokenize(line):
        if tagged and item in CHUNK:
            continue
        if tagged and not TAGGED.fullmatch(item):
            raise NplmError(f"{name}: {item!r} is not word/TAG (data.tags=true); set data.tags=auto or false")
        token, proper = _word_of(item) if tagged else (item, None)
        words.append((token, start, proper))
        start = token in SENTENCE_END or (start and token in OPENERS)
    return words


def _read_text(stream: Stream, name: str, text: str, tags: str | bool, paragraphs: bool, drop: set[str]) -> None:
    """One file into the stream: its paragraphs, then `<eot>`."""
    lines = [line for line in text.splitlines() if line.strip() not in drop]
    tagged = _is_tagged(lines, tags)
    if tagged:  # the .pos files' === separator lines are not text: they end a paragraph like blank ones
        lines = [line if line.strip("= \t") else "" for line in lines]
    stream.counted["files"] += 1
    stream.counted["tagged_files"] += tagged
    for paragraph in split_paragraphs(lines, partial(_line_words, name, tagged)):
        for word in paragraph:
            stream.add(*word)
        stream.counted["words"] += len(paragraph)
        if paragraphs:
            stream.add(END_OF_PARAGRAPH)
            stream.counted["paragraphs"] += 1
    stream.add(END_OF_TEXT)


# Variation selectors (category Mn): they choose a glyph of the character before them (U+FE0F, an emoji's colour
# form), never a letter of their own.
VARIATION_SELECTORS = "\ufe00-\ufe0f\U000e0100-\U000e01ef"


@cache
def _invisible() -> re.Pattern[str]:
    """Unicode's format characters (category Cf, in the Unicode version of this Python) and VARIATION_SELECTORS, as
    one character class; built at the first text that is not ASCII (a tenth of a second)."""
    formats = (chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf")
    return re.compile(f"[{''.join(map(re.escape, formats))}{VARIATION_SELECTORS}]")


def drop_invisible(text: str) -> str:
    """`text` without the characters that only join, break or colour what is written: the format characters (zero-
    width joiner and space, soft hyphen, byte order mark, word joiner, direction marks) and variation selectors.
    Kept, each is a token of its own (`<unk>`) or cuts a word in two (a soft hyphen inside one). Every text is read
    through it: a corpus's files (`decode`) and a user's text (plain.py's `read_text`). Brown, ASCII, has none: its
    tokens and fingerprint are as before."""
    return text if text.isascii() else _invisible().sub("", text)


def source_files(path: Path, members: str | None) -> list[tuple[str, bytes]]:
    """(name, raw bytes) of a plain file, or of every file of a directory or zip whose path inside it starts with
    `members`, sorted by that path."""
    if path.is_dir() or path.suffix.lower() == ".zip":
        prefix = members or ""
        return read_members(path, lambda member: member.startswith(prefix))
    try:
        return [(path.name, path.read_bytes())]
    except OSError as error:
        raise NplmError(f"{path}: cannot read ({error})") from error


def source_path(path: str, key: str) -> Path:
    """`path`, refused in one line naming `key` if it does not exist, or if it is a `.zip` that is none. The first
    step of reading, and what nplm-train checks before it opens a store (`checks.check_job`)."""
    where = Path(path).expanduser()
    if not where.exists():
        raise NplmError(f"{key}={path}: {why_missing(where)}")
    if where.is_file() and where.suffix.lower() == ".zip":
        open_zip(where).close()
    return where


def decode(name: str, raw: bytes, encoding: str) -> str:
    """A file's text, its invisible characters (a byte order mark among them) dropped (`drop_invisible`); bytes that
    are not text in `encoding`, or a NUL (binary data, or text in another encoding, which would become a word of its
    own) are one NplmError with the file and byte offset."""
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as error:
        raise NplmError(
            f"{name} is not {encoding} at byte {error.start}; fix the file or set data.encoding (e.g. latin-1)"
        ) from error
    if "\x00" in text:
        at = len(text[: text.index("\x00")].encode(encoding))
        raise NplmError(
            f"{name} has a NUL character at byte {at}: not {encoding} text; fix the file or set data.encoding "
            "(e.g. utf-16)"
        )
    return drop_invisible(text)


def read_source(path: str, key: str, members: str | None, encoding: str, **how: Any) -> Stream:
    """Every text of one source (`key` names its config key in errors)."""
    files = source_files(source_path(path, key), members)
    if not files:
        raise NplmError(
            f"{key}={path}: no files" + (f" whose name starts with data.members={members!r}" if members else "")
        )
    stream = Stream([], [], [], Counter(dict.fromkeys(("files", "tagged_files", "paragraphs", "words"), 0)))
    for name, raw in files:
        _read_text(stream, name, decode(name, raw, encoding), **how)
    if stream.counted["words"] == 0:
        raise NplmError(f"{key}={path}: the corpus is empty (no words in {len(files)} file{'s' * (len(files) != 1)})")
    return stream


def proper_noun_types(stream: Stream, train_end: int) -> set[str]:
    """The heuristic for untagged text: a word of two or more characters that starts with a capital, occurs at
    least once not at the start of a sentence (a line's first token, or the token after . ! ? and any opening
    quotes or brackets), and never occurs written in lower case. Judged on the training split for words that
    occur there, on the whole stream for the others."""
    lower: list[set[str]] = [set(), set()]  # [train, stream]
    inside: list[set[str]] = [set(), set()]
    in_train: set[str] = set()
    for i, (token, initial, tagged) in enumerate(zip(stream.tokens, stream.initial, stream.tagged_proper)):
        scopes = (0, 1) if i < train_end else (1,)
        if token.islower():
            for s in scopes:
                lower[s].add(token)
        elif tagged is None and len(token) > 1 and token[0].isupper():
            if i < train_end:
                in_train.add(token)
            if not initial:
                for s in scopes:
                    inside[s].add(token)
    return {w for s in (0, 1) for w in inside[s] if (w in in_train) == (s == 0) and w.lower() not in lower[s]}


def build_text_vocab(counts: Counter, max_unk_freq: int, vocab_size: int | None) -> tuple[str, ...]:
    """The marks, the symbols and punctuation that occur, then the most frequent words seen more than
    `max_unk_freq` times up to |V| = `vocab_size` (with `<unk>`); most frequent first, then `<unk>`."""
    always = {END_OF_PARAGRAPH, END_OF_TEXT} | {w for w in counts if w in SYMBOLS or is_punctuation(w)}
    words = sorted(
        (w for w, c in counts.items() if c > max_unk_freq and w not in always), key=lambda w: (-counts[w], w)
    )
    if vocab_size is not None:
        room = vocab_size - len(always) - 1
        if room < 0:
            raise NplmError(
                f"data.vocab_size={vocab_size} is smaller than the {len(always) + 1} marks, symbols, punctuation "
                f"types and {UNK} that are always kept"
            )
        words = words[:room]
    return (*sorted(always | set(words), key=lambda w: (-counts[w], w)), UNK)


def _split_sizes(total: int, train: int | None, valid: int | None, test: int | None) -> dict[str, tuple[int, int]]:
    if train is None and valid is None and test is None:
        train, valid = (round(total * part / sum(AP_SPLIT)) for part in AP_SPLIT[:2])
    elif train is None or valid is None:
        raise NplmError(
            "data.split.train and data.split.valid: give both (data.split.test=null takes the rest), "
            "or all three null for the paper's AP proportions"
        )
    return split_bounds(total, train, valid, test)


@dataclass(frozen=True)
class TextCorpus(Corpus):
    """A Corpus whose summary says what each preprocessing step did."""

    def summary(self) -> str:
        c, s = self.counts, self.settings
        numbers = ", ".join(f"{sym} {c[_key(sym)]:,}" for sym, _ in NUMBERS) if s["numbers"] else "off"
        proper = f"{PROPER} {c['proper_tokens']:,} tokens ({c['proper_types']:,} types)" if s["proper_nouns"] else "off"
        lower = f"{c['lowercased_tokens']:,} tokens changed" if s["lowercase"] else "off"
        splits = " / ".join(f"{split} {self.size(split):,}" for split in SPLITS)
        return (
            f"{self.name} from {self.source}: {c['files']:,} files ({c['tagged_files']:,} tagged word/TAG), "
            f"{c['paragraphs']:,} paragraphs, {c['words']:,} words -> {len(self.ids):,} tokens, "
            f"{c['raw_types']:,} types as read; numbers: {numbers}; proper nouns: {proper}; lower-casing: {lower}; "
            f"{c['types']:,} types; |V| = {self.vocab_size:,} ({c['punctuation_types']:,} punctuation types kept; "
            f"{c['unk_types']:,} types, {c['unk_tokens']:,} tokens -> {UNK}); {splits}"
        )


def _key(symbol: str) -> str:
    return f"{symbol.strip('<>')}_tokens"


def preprocess(
    stream: Stream, train_end: int, numbers: bool, proper_nouns: bool, lowercase: bool
) -> tuple[list[str], Counter]:
    """Steps 1-3 of this module's docstring on a stream read: number symbols, proper nouns (judged on the tokens
    before `train_end` for the words that occur there), lower case; the tokens and what each step counted."""
    tokens, counted = stream.tokens, stream.counted
    counted["raw_types"] = len(set(tokens))
    if numbers:
        counted.update({_key(symbol): 0 for symbol, _ in NUMBERS})
        for i, token in enumerate(tokens):
            if token[0].isdigit() and (symbol := number_symbol(token)):
                tokens[i] = symbol
                counted[_key(symbol)] += 1
    if proper_nouns:
        heuristic = proper_noun_types(stream, train_end)
        proper = [tag if tag is not None else t in heuristic for t, tag in zip(tokens, stream.tagged_proper)]
        counted["proper_types"] = len({t for t, p in zip(tokens, proper) if p})
        tokens = [PROPER if p else t for t, p in zip(tokens, proper)]
        counted["proper_tokens"] = tokens.count(PROPER)
    if lowercase:
        lowered = [t if t in SYMBOLS else t.lower() for t in tokens]
        counted["lowercased_tokens"] = sum(a != b for a, b in zip(tokens, lowered))
        tokens = lowered
    return tokens, counted


def prepare_text(
    path: str | None,
    name: str = "text",
    members: str | None = None,
    encoding: str = "utf-8",
    tags: str | bool = "auto",
    paragraphs: bool = True,
    drop_lines: Sequence[str] = (),
    numbers: bool = False,
    proper_nouns: bool = False,
    lowercase: bool = False,
    max_unk_freq: int = 0,
    vocab_size: int | None = None,
    vocab_from: str = "train",
    train: int | None = None,
    valid: int | None = None,
    test: int | None = None,
    valid_path: str | None = None,
    test_path: str | None = None,
) -> TextCorpus:
    """Read, preprocess and split a plain-text corpus (this module's docstring says how)."""
    if not path:
        raise NplmError(f"data.path is required for data.corpus={name}: a UTF-8 text file, a directory or a zip")
    check_vocab_from(vocab_from)
    try:
        codecs.lookup(encoding)
    except LookupError as error:
        raise NplmError(f"data.encoding={encoding!r} is not an encoding Python knows") from error
    how = {"encoding": encoding, "tags": tags, "paragraphs": paragraphs, "drop": set(drop_lines)}
    stream = read_source(path, "data.path", members, **how)
    if valid_path or test_path:
        if not (valid_path and test_path) or (train, valid, test) != (None, None, None):
            raise NplmError(
                "data.split.valid_path and data.split.test_path: give both, with data.split.train, valid and test null"
            )
        sizes = [len(stream.tokens)]
        for key, other in (("valid_path", valid_path), ("test_path", test_path)):
            more = read_source(other, f"data.split.{key}", members, **how)
            sizes.append(len(more.tokens))
            for field_ in ("tokens", "initial", "tagged_proper"):
                getattr(stream, field_).extend(getattr(more, field_))
            stream.counted.update(more.counted)
        bounds = split_bounds(sum(sizes), sizes[0], sizes[1], sizes[2])
    else:
        bounds = _split_sizes(len(stream.tokens), train, valid, test)
    end, train_end = bounds["test"][1], bounds["train"][1]
    for kept in (stream.tokens, stream.initial, stream.tagged_proper):
        del kept[end:]
    tokens, counted = preprocess(stream, train_end, numbers, proper_nouns, lowercase)
    settings = {
        "reader": {"tags": tags, "paragraphs": paragraphs, "drop_lines": sorted(drop_lines)},
        "numbers": numbers,
        "proper_nouns": proper_nouns,
        "lowercase": lowercase,
        "max_unk_freq": max_unk_freq,
        "vocab_size": vocab_size,
        "vocab_from": vocab_from,
    }
    source = Path(path).name + (f" ({members}*)" if members else "")
    vocab = build_text_vocab(word_counts(tokens, bounds, vocab_from), max_unk_freq, vocab_size)
    counted["punctuation_types"] = sum(map(is_punctuation, vocab))
    corpus = make_corpus(TextCorpus, name, tokens, bounds, counted, vocab, source, settings)
    log.info("%s", corpus.summary())
    return corpus


def read_text_tokens(text: str, name: str, data: Any) -> list[str]:
    """A user's text as a run on a text corpus (`data`, its data config) reads its own files: the same reader and
    preprocessing, proper nouns judged on this text, before any vocabulary (plain.py's `read_text`). `name` says
    what the text is in errors."""
    stream = Stream([], [], [], Counter())
    _read_text(stream, name, text, data.tags, data.paragraphs, set(data.drop_lines))
    return preprocess(stream, len(stream.tokens), data.numbers, data.proper_nouns, data.lowercase)[0]
