"""The last step of reading a corpus (paper §4, p. 1147): the Corpus, an id stream over a vocabulary cut into
train/valid/test spans, and `make_corpus`, which every reader ends with.

A reader (brown.py, text.py; load.py picks the one a data config names) reads one way: its files (files.py) ->
tokens (tokens.py: the stream, its paragraphs and marks) -> the splits' bounds (splits.py) -> the vocabulary
(vocabulary.py, counted on the whole stream or the training split) -> the Corpus (here). The marks are importable
from here too: whoever reads a Corpus reads its vocabulary's `<eop>`, `<eot>` and `<unk>`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from nplm_repro.data.splits import SPLITS, Sizes
from nplm_repro.data.tokens import END_OF_PARAGRAPH, END_OF_TEXT  # noqa: F401  <eop> for whoever reads a Corpus
from nplm_repro.data.vocabulary import UNK


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


def make_corpus(
    kind: type[AnyCorpus],
    name: str,
    tokens: list[str],
    bounds: dict[str, tuple[int, int]],
    counted: Counter,
    vocab: tuple[str, ...],
    source: str,
    settings: dict[str, Any] | None = None,
    texts: tuple[str, ...] = (),
) -> AnyCorpus:
    """The tail every reader shares: `tokens`, already cut to the end of the test split of `bounds`, as a `kind`
    (Corpus or a subclass) over `vocab` (vocabulary.py): every word not in it becomes `<unk>`, and `counted` gains
    the types and `<unk>` counts."""
    index = {w: i for i, w in enumerate(vocab)}
    unk = index[UNK]
    ids = torch.tensor([index.get(w, unk) for w in tokens], dtype=torch.int64)
    types = set(tokens)
    counted.update(types=len(types), unk_types=len(types - index.keys()), unk_tokens=int((ids == unk).sum()))
    return kind(name, vocab, ids, bounds, dict(counted), settings or {}, source, texts)
