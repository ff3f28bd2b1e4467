"""The corpus kinds a `data` config names (conf/data/*.yaml, `data.corpus`): Brown's reader (brown.py), or a plain-text
corpus with or without the paper's AP News preprocessing (§4, p. 1147; text.py). `corpus_kind` picks the kind, here
and nowhere else: what a caller would ask by testing the corpus's name (its keys' rules, its files, where it is found
without a path, how a user's text is read as it) it asks the kind instead."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from nplm_repro.data.brown import find_brown, prepare_brown
from nplm_repro.data.brown_plain import brown_plain_words
from nplm_repro.data.corpus import Corpus
from nplm_repro.data.files import open_zip
from nplm_repro.data.text import prepare_text, read_text_tokens, source_path
from nplm_repro.errors import NplmError
from nplm_repro.rules import Rule, at_least, flag, lines, optional, text

BROWN_RULES: dict[str, Rule] = {"data.split.train": at_least(1), "data.split.valid": at_least(1)}
TEXT_RULES: dict[str, Rule] = {  # conf/data/text.yaml, ap.yaml
    "data.path": text("a UTF-8 text file, a directory of them or a zip"),
    "data.members": optional(text("a file-name prefix")),
    "data.encoding": text("an encoding name (utf-8, latin-1, ...)"),
    "data.tags": ((lambda v: v == "auto" or isinstance(v, bool)), "auto, true or false"),
    "data.paragraphs": flag(),
    "data.drop_lines": lines(),
    "data.numbers": flag(),
    "data.proper_nouns": flag(),
    "data.lowercase": flag(),
    "data.vocab_size": optional(at_least(2)),
    "data.split.train": optional(at_least(1)),
    "data.split.valid": optional(at_least(1)),
    "data.split.valid_path": optional(text("a file, directory or zip")),
    "data.split.test_path": optional(text("a file, directory or zip")),
}


class CorpusKind(ABC):
    """What callers ask of a kind of corpus, so that none of them names one. `data` is always the run's data config."""

    name: str  # data.corpus
    rules: Mapping[str, Rule]  # the values its data keys take (config_checks.check_config applies them)
    without_path: str | None  # what is read when data.path is null (Brown, from NLTK's folders); None: it needs one
    reads_whole: bool  # a user's text is read whole (judged on all of it), not a piece at a time (plain.py)

    @abstractmethod
    def load(self, data: Any) -> Corpus:
        """Read and prepare the corpus."""

    @abstractmethod
    def check_files(self, data: Any) -> None:
        """The files the config names exist (and a zip is one), as the reader will look for them: a typo stops before
        a store is created for a run that cannot start."""

    @abstractmethod
    def marks_paragraphs(self, data: Any) -> bool:
        """Whether the corpus's stream has `<eop>` after each paragraph: a user's tokens are marked the same way."""

    @abstractmethod
    def words(self, text: str, name: str, data: Any) -> list[str]:
        """A user's text as the corpus's own texts are read: its tokens, its marks, `<eot>` at its end. `name` says
        what the text is in errors."""

    @abstractmethod
    def encoding(self, data: Any) -> str:
        """What a user's file without a byte-order mark or `--encoding` is decoded as: what the corpus is."""


class BrownKind(CorpusKind):
    """Brown as the paper streams it (brown.py); a user's text cut as Brown's tokens are (brown_plain.py)."""

    name, rules, without_path, reads_whole = "brown", BROWN_RULES, "Brown", False

    def load(self, data: Any) -> Corpus:
        split = data.split
        return prepare_brown(data.path, split.train, split.valid, split.test, data.max_unk_freq, data.vocab_from)

    def check_files(self, data: Any) -> None:
        source = find_brown(data.path)
        if source.is_file():
            open_zip(source).close()

    def marks_paragraphs(self, data: Any) -> bool:
        return True

    def words(self, text: str, name: str, data: Any) -> list[str]:
        return brown_plain_words(text)

    def encoding(self, data: Any) -> str:
        return "utf-8"


class TextKind(CorpusKind):
    """A plain-text corpus (text.py), `ap` with the paper's AP News preprocessing on (conf/data/ap.yaml): read with
    its own reader and preprocessing, a user's text too (proper nouns judged on the whole text)."""

    rules, without_path, reads_whole = TEXT_RULES, None, True

    def __init__(self, name: str) -> None:
        self.name = name

    def load(self, data: Any) -> Corpus:
        split = data.split
        return prepare_text(
            data.path,
            name=self.name,
            members=data.members,
            encoding=data.encoding,
            tags=data.tags,
            paragraphs=data.paragraphs,
            drop_lines=list(data.drop_lines),
            numbers=data.numbers,
            proper_nouns=data.proper_nouns,
            lowercase=data.lowercase,
            max_unk_freq=data.max_unk_freq,
            vocab_size=data.vocab_size,
            vocab_from=data.vocab_from,
            train=split.train,
            valid=split.valid,
            test=split.test,
            valid_path=split.valid_path,
            test_path=split.test_path,
        )

    def check_files(self, data: Any) -> None:
        paths = {"data.path": data.path, "data.split.valid_path": data.split.valid_path}
        paths["data.split.test_path"] = data.split.test_path
        for key, path in paths.items():
            if path is not None:
                source_path(path, key)

    def marks_paragraphs(self, data: Any) -> bool:
        return bool(data.paragraphs)

    def words(self, text: str, name: str, data: Any) -> list[str]:
        return read_text_tokens(text, name, data)

    def encoding(self, data: Any) -> str:
        return data.encoding


KINDS: dict[str, CorpusKind] = {kind.name: kind for kind in (BrownKind(), TextKind("text"), TextKind("ap"))}
CORPORA = tuple(KINDS)  # the values data.corpus takes


def corpus_kind(data: Any) -> CorpusKind:
    """The kind of corpus a `data` config names; an unknown name is an NplmError listing the known ones."""
    if data.corpus not in KINDS:
        raise NplmError(f"data.corpus={data.corpus!r} is not known (known: {', '.join(CORPORA)})")
    return KINDS[data.corpus]


def load_corpus(data: Any) -> Corpus:
    """Read and prepare the corpus of a `data` config (conf/data/brown.yaml, text.yaml, ap.yaml)."""
    return corpus_kind(data).load(data)
