"""The corpus a `data` config names (conf/data/*.yaml): Brown's reader, or a plain-text corpus with or without
the paper's AP News preprocessing (§4, p. 1147)."""

from __future__ import annotations

from typing import Any

from nplm_repro.data.brown import prepare_brown
from nplm_repro.data.corpus import Corpus
from nplm_repro.data.text import prepare_text
from nplm_repro.errors import NplmError

CORPORA = ("brown", "text", "ap")  # data.corpus: brown.py's reader; text.py's for text and ap


def load_corpus(data: Any) -> Corpus:
    """Read and prepare the corpus of a `data` config (conf/data/brown.yaml, text.yaml, ap.yaml)."""
    if data.corpus not in CORPORA:
        raise NplmError(f"data.corpus={data.corpus!r} is not known (known: {', '.join(CORPORA)})")
    split = data.split
    if data.corpus == "brown":
        return prepare_brown(data.path, split.train, split.valid, split.test, data.max_unk_freq, data.vocab_from)
    return prepare_text(
        data.path,
        name=data.corpus,
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
