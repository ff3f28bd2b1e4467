"""The Brown corpus as the paper streams it (PAPER.md section 2): reading, vocabulary, splits, fingerprint.

One token stream in file order ca01..cr09: words as written (case and punctuation kept, tags stripped),
`<eop>` after each paragraph, `<eot>` after each text. The first 800,000 tokens train, the next 200,000
validate, the rest test. Words of frequency <= 3 become `<unk>`; by default the frequencies are counted
on the whole stream, which is what reproduces the paper's deleted-interpolation numbers
(`../shared/data/README.md`); `vocab_from: train` counts on the training split only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nplm_repro.data.splits import SPLITS, split_bounds
from nplm_repro.errors import NplmError

log = logging.getLogger(__name__)

END_OF_PARAGRAPH = "<eop>"
END_OF_TEXT = "<eot>"
UNK = "<unk>"
BROWN_TEXT = re.compile(r"c[a-r]\d\d")
HOW_TO_GET_BROWN = "get it with `python -m nltk.downloader brown` or point data.path at brown.zip"


def nltk_data_dirs() -> list[Path]:
    """NLTK's own search path (NLTK_DATA, ~/nltk_data, the system locations), in NLTK's order."""
    import nltk.data

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
    looked = ", ".join(str(c) for c in candidates)
    raise NplmError(f"Brown corpus not found (looked in: {looked}); {HOW_TO_GET_BROWN}")


def _brown_files(source: Path) -> list[tuple[str, bytes]]:
    """(name, raw bytes) of the 500 texts, sorted ca01..cr09, from a zip or an unzipped folder."""
    try:
        if source.is_dir():
            inner = [source / "brown.zip", source / "corpora" / "brown.zip", source / "brown"]
            if not any(BROWN_TEXT.fullmatch(p.name) for p in source.iterdir()):
                found = next((p for p in inner if p.exists()), None)
                if found is None:
                    raise NplmError(f"{source}: no Brown texts (ca01..cr09) in this folder")
                return _brown_files(found)
            files = sorted(p for p in source.iterdir() if BROWN_TEXT.fullmatch(p.name))
            return [(p.name, p.read_bytes()) for p in files]
        with zipfile.ZipFile(source) as archive:
            names = sorted(
                (n for n in archive.namelist() if BROWN_TEXT.fullmatch(n.rsplit("/", 1)[-1])),
                key=lambda n: n.rsplit("/", 1)[-1],
            )
            return [(n.rsplit("/", 1)[-1], archive.read(n)) for n in names]
    except (zipfile.BadZipFile, zlib.error, EOFError) as error:
        raise NplmError(f"{source}: corrupt or truncated zip ({error})") from error
    except OSError as error:
        raise NplmError(f"{source}: cannot read ({error})") from error


def read_brown(source: Path) -> tuple[list[str], Counter]:
    """The paper's token stream and what was counted (texts, paragraphs, words, marks)."""
    files = _brown_files(source)
    if not files:
        raise NplmError(f"{source}: no Brown texts (ca01..cr09) found; {HOW_TO_GET_BROWN}")
    tokens: list[str] = []
    counted: Counter = Counter()
    for name, raw in files:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise NplmError(f"{source}: {name} is not UTF-8 at byte {error.start}") from error
        in_paragraph = False
        for line in text.splitlines():
            items = line.split()
            if items:
                tokens += [item.rsplit("/", 1)[0] for item in items]
                counted["words"] += len(items)
                in_paragraph = True
            elif in_paragraph:
                tokens.append(END_OF_PARAGRAPH)
                counted["paragraphs"] += 1
                in_paragraph = False
        if in_paragraph:
            tokens.append(END_OF_PARAGRAPH)
            counted["paragraphs"] += 1
        tokens.append(END_OF_TEXT)
        counted["texts"] += 1
    if counted["words"] == 0:
        raise NplmError(f"{source}: the corpus is empty (no words in {len(files)} texts)")
    return tokens, counted


@dataclass(frozen=True)
class Corpus:
    """An id stream over a vocabulary, cut into contiguous train/valid/test spans."""

    name: str
    vocab: tuple[str, ...]
    ids: torch.Tensor
    bounds: dict[str, tuple[int, int]]
    counts: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # preprocessing switches (text corpora)
    source: str = ""  # what was read: file name (and member prefix)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def size(self, split: str) -> int:
        start, end = self.bounds[split]
        return end - start

    @property
    def fingerprint(self) -> str:
        """Hash of the vocabulary, the id stream and the split boundaries: equal iff the data is."""
        digest = hashlib.sha256("\n".join(self.vocab).encode())
        digest.update(self.ids.to(torch.int32).numpy().tobytes())
        digest.update(repr(sorted(self.bounds.items())).encode())
        if self.settings:  # two switches may give the same stream on one corpus, not on the next
            digest.update(json.dumps(self.settings, sort_keys=True).encode())
        return digest.hexdigest()[:16]

    def count_tags(self) -> dict[str, str]:
        """What was counted (`counts`) as MLflow tags `count.<what>`, and where the data was read from."""
        tags = {f"count.{k}": str(v) for k, v in sorted(self.counts.items())}
        return tags | ({"data_source": self.source} if self.source else {})

    def summary(self) -> str:
        """One line that says exactly what was counted, KenLM-style."""
        c = self.counts
        splits = " / ".join(f"{s} {self.size(s):,}" for s in SPLITS)
        return (
            f"{self.name}: {c['texts']:,} texts, {c['paragraphs']:,} paragraphs, {c['words']:,} words"
            f" -> {len(self.ids):,} tokens, {c['types']:,} types; |V| = {self.vocab_size:,}"
            f" ({c['unk_types']:,} types, {c['unk_tokens']:,} tokens -> {UNK}); {splits}"
        )


def build_vocab(counts: Counter, max_unk_freq: int) -> tuple[str, ...]:
    """Words seen more than `max_unk_freq` times and the two marks, most frequent first, then `<unk>`."""
    kept = {w for w, c in counts.items() if c > max_unk_freq} | {END_OF_PARAGRAPH, END_OF_TEXT}
    return (*sorted(kept, key=lambda w: (-counts[w], w)), UNK)


def prepare_brown(
    path: str | None,
    train: int = 800_000,
    valid: int = 200_000,
    test: int | None = None,
    max_unk_freq: int = 3,
    vocab_from: str = "stream",
) -> Corpus:
    """Brown as the paper streams it, with frequencies counted on `vocab_from` ('stream' or 'train')."""
    if vocab_from not in ("stream", "train"):
        raise NplmError(f"data.vocab_from must be 'stream' or 'train', not {vocab_from!r}")
    source = find_brown(path)
    tokens, counted = read_brown(source)
    bounds = split_bounds(len(tokens), train, valid, test)
    end = bounds["test"][1]
    tokens = tokens[:end]
    counts = Counter(tokens if vocab_from == "stream" else tokens[:train])
    vocab = build_vocab(counts, max_unk_freq)
    index = {w: i for i, w in enumerate(vocab)}
    unk = index[UNK]
    ids = torch.tensor([index.get(w, unk) for w in tokens], dtype=torch.int64)
    counted.update(
        types=len(set(tokens)),
        unk_types=len(set(tokens) - index.keys()),
        unk_tokens=int((ids == unk).sum()),
    )
    corpus = Corpus("brown", vocab, ids, bounds, dict(counted), source=source.name)
    log.info("read %s", source)
    log.info("%s", corpus.summary())
    return corpus


CORPORA = ("brown", "text", "ap")  # data.corpus: Brown's reader, or a plain-text corpus (nplm_repro.data.text)


def load_corpus(data: Any) -> Corpus:
    """The corpus a `data` config names (conf/data/*.yaml)."""
    if data.corpus not in CORPORA:
        raise NplmError(f"data.corpus={data.corpus!r} is not known (known: {', '.join(CORPORA)})")
    if data.corpus != "brown":
        from nplm_repro.data.text import load_text  # it builds on this module

        return load_text(data)
    split = data.split
    return prepare_brown(data.path, split.train, split.valid, split.test, data.max_unk_freq, data.vocab_from)
