"""The fourth step of reading a corpus: the vocabulary, from word frequencies counted on the whole stream or on the
training split (`vocab_from`); every other word becomes `<unk>`. Brown's rule is here (`build_vocab`); a text
corpus's, which keeps symbols and punctuation, is text.py's `build_text_vocab`.
"""

from __future__ import annotations

from collections import Counter

from nplm_repro.data.tokens import END_OF_PARAGRAPH, END_OF_TEXT
from nplm_repro.errors import NplmError

UNK = "<unk>"
VOCAB_FROM = ("stream", "train")  # where word frequencies are counted: the whole stream or the training split


def check_vocab_from(vocab_from: str) -> None:
    """Refuse an unknown `vocab_from` before any file is read."""
    if vocab_from not in VOCAB_FROM:
        raise NplmError(f"data.vocab_from must be 'stream' or 'train', not {vocab_from!r}")


def build_vocab(counts: Counter, max_unk_freq: int) -> tuple[str, ...]:
    """Words seen more than `max_unk_freq` times and the two marks, most frequent first, then `<unk>`."""
    kept = {w for w, c in counts.items() if c > max_unk_freq} | {END_OF_PARAGRAPH, END_OF_TEXT}
    return (*sorted(kept, key=lambda w: (-counts[w], w)), UNK)


def word_counts(tokens: list[str], bounds: dict[str, tuple[int, int]], vocab_from: str) -> Counter:
    """The frequencies a vocabulary is built from: of every token (`vocab_from` 'stream') or of the training split's
    ('train', the tokens before the end of `bounds`'s train)."""
    return Counter(tokens if vocab_from == "stream" else tokens[: bounds["train"][1]])
