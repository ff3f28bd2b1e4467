"""What every corpus reader shares (paper §4, p. 1147): the Corpus type and its marks, the reading of a folder or
zip, the paragraphs of a text, and the tail that turns a stream cut into splits into a vocabulary and ids.

A stream is one list of tokens in file order: the words of each text, `<eop>` after each paragraph (a block of
non-blank lines) and `<eot>` after each text. The readers (brown.py, text.py) differ in which files they read,
how a line becomes words and, for text, the preprocessing before the vocabulary is built.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from nplm_repro.data.splits import SPLITS, Sizes
from nplm_repro.errors import NplmError

END_OF_PARAGRAPH = "<eop>"
END_OF_TEXT = "<eot>"
UNK = "<unk>"
VOCAB_FROM = ("stream", "train")  # where word frequencies are counted: the whole stream or the training split

Word = TypeVar("Word")


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
    texts: tuple[str, ...] = ()  # the names of its texts in stream order (Brown's ca01 ...); else their index

    def text_ids(self, split: str) -> np.ndarray:
        """int32 [size of split]: the text each token belongs to, as the number of texts that ended (`<eot>`) before
        it in the stream; a text's `<eot>` is its own last token. What an interval over texts resamples."""
        ends = (self.ids == self.vocab.index(END_OF_TEXT)).to(torch.int32)
        start, end = self.bounds[split]
        return (torch.cumsum(ends, 0) - ends)[start:end].numpy().astype(np.int32)

    def text_names(self) -> tuple[str, ...]:
        """A name for every text of the stream: `texts` where the reader named them, else the file's index."""
        count = int((self.ids == self.vocab.index(END_OF_TEXT)).sum()) + 1  # the last may be cut off by the split
        return tuple(self.texts[i] if i < len(self.texts) else str(i) for i in range(count))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def size(self, split: str) -> int:
        start, end = self.bounds[split]
        return end - start

    def sizes(self) -> Sizes:
        """The training split's tokens and distinct words: what a job's values are checked against once the corpus
        is read, before the store is opened (config_checks.check_sizes)."""
        start, end = self.bounds["train"]
        return Sizes(end - start, int(torch.unique(self.ids[start:end]).numel()), read=True)

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


AnyCorpus = TypeVar("AnyCorpus", bound=Corpus)

# What a file that is not a zip is, by the bytes at an offset (as file(1) tells them): said instead of zipfile's
# "File is not a zip file", which does not tell a damaged zip from a compressed corpus given where a zip was expected
NOT_ZIP = (
    (0, b"\x1f\x8b", "a gzip file"),
    (0, b"BZh", "a bzip2 file"),
    (0, b"\xfd7zXZ\x00", "an xz file"),
    (0, b"(\xb5/\xfd", "a zstd file"),
    (0, b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (0, b"Rar!", "a RAR archive"),
    (257, b"ustar", "a tar archive"),
)


def _not_a_zip(path: Path, error: zipfile.BadZipFile) -> str:
    """Why zipfile cannot open `path`, in words: a damaged zip (it starts as one), or what the file is instead."""
    with path.open("rb") as file:
        head = file.read(512)
    if head.startswith(b"PK"):
        return f"corrupt or truncated zip ({error})"
    kind = next((kind for at, magic, kind in NOT_ZIP if head[at : at + len(magic)] == magic), None)
    if kind:
        return f"{kind}, not a zip: unpack it and give the zip or folder it holds"
    return "not a zip file" + (" (it is empty)" if not head else "")


def open_zip(path: Path) -> zipfile.ZipFile:
    """`path` opened as a zip; a file that is none (or cannot be read) is one NplmError naming it and saying what
    it is instead."""
    try:
        return zipfile.ZipFile(path)
    except zipfile.BadZipFile as error:
        raise NplmError(f"{path}: {_not_a_zip(path, error)}") from None
    except OSError as error:
        raise NplmError(f"{path}: cannot read ({error.strerror})") from None


def read_members(path: Path, keep: Callable[[str], bool]) -> list[tuple[str, bytes]]:
    """(name, raw bytes) of the files of a folder (at any depth, hidden ones skipped) or of a zip whose path inside
    it `keep` accepts, sorted by that path. A name says where the bytes came from: `folder/member` or
    `archive.zip:member`. A damaged zip, a file that is no zip, or an unreadable file is one NplmError naming `path`."""
    try:
        if path.is_dir():
            files = ((p.relative_to(path).as_posix(), p) for p in path.rglob("*") if p.is_file())
            kept = sorted((n, p) for n, p in files if keep(n) and not n.startswith(".") and "/." not in n)
            return [(f"{path.name}/{n}", p.read_bytes()) for n, p in kept]
        with open_zip(path) as archive:
            names = sorted(n for n in archive.namelist() if not n.endswith("/") and keep(n))
            return [(f"{path.name}:{n}", archive.read(n)) for n in names]
    except (zipfile.BadZipFile, zlib.error, EOFError) as error:
        raise NplmError(f"{path}: corrupt or truncated zip ({error})") from None
    except OSError as error:
        raise NplmError(f"{path}: cannot read ({error})") from None


def split_paragraphs(lines: Iterable[str], words: Callable[[str], list[Word]]) -> list[list[Word]]:
    """One text's paragraphs, each the words of a block of lines ended by a blank line or the text's end; a
    block whose lines give no words is no paragraph. `words` cuts a line (a blank one gives none)."""
    found: list[list[Word]] = []
    current: list[Word] = []
    for line in lines:
        current += words(line)
        if current and not line.strip():
            found.append(current)
            current = []
    if current:
        found.append(current)
    return found


def check_vocab_from(vocab_from: str) -> None:
    """Refuse an unknown `vocab_from` before any file is read."""
    if vocab_from not in VOCAB_FROM:
        raise NplmError(f"data.vocab_from must be 'stream' or 'train', not {vocab_from!r}")


def build_vocab(counts: Counter, max_unk_freq: int) -> tuple[str, ...]:
    """Words seen more than `max_unk_freq` times and the two marks, most frequent first, then `<unk>`."""
    kept = {w for w, c in counts.items() if c > max_unk_freq} | {END_OF_PARAGRAPH, END_OF_TEXT}
    return (*sorted(kept, key=lambda w: (-counts[w], w)), UNK)


def make_corpus(
    kind: type[AnyCorpus],
    name: str,
    tokens: list[str],
    bounds: dict[str, tuple[int, int]],
    counted: Counter,
    vocabulary: Callable[[Counter], tuple[str, ...]],
    vocab_from: str,
    source: str,
    settings: dict[str, Any] | None = None,
    texts: tuple[str, ...] = (),
) -> AnyCorpus:
    """The tail every reader shares: `tokens`, already cut to the end of the test split of `bounds`, as a `kind`
    (Corpus or a subclass). Word frequencies are counted on `vocab_from` (the whole stream or the training split),
    `vocabulary` builds the vocabulary from them, every other word becomes `<unk>`, and `counted` gains the
    types and `<unk>` counts."""
    train_end = bounds["train"][1]
    vocab = vocabulary(Counter(tokens if vocab_from == "stream" else tokens[:train_end]))
    index = {w: i for i, w in enumerate(vocab)}
    unk = index[UNK]
    ids = torch.tensor([index.get(w, unk) for w in tokens], dtype=torch.int64)
    types = set(tokens)
    counted.update(types=len(types), unk_types=len(types - index.keys()), unk_tokens=int((ids == unk).sum()))
    return kind(name, vocab, ids, bounds, dict(counted), settings or {}, source, texts)
