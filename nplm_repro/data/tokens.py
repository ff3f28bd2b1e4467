"""The second step of reading a corpus: a text's lines as tokens. A stream is one list of tokens in file order: the
words of each text, `<eop>` after each paragraph (a block of non-blank lines) and `<eot>` after each text. The
readers (brown.py, text.py) differ in how a line becomes words; the paragraphs and the marks are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

END_OF_PARAGRAPH = "<eop>"
END_OF_TEXT = "<eot>"

Word = TypeVar("Word")


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


def marked(paragraphs: Iterable[list[str]], marks: bool) -> list[str]:
    """Paragraphs as a stream: `<eop>` after each (where `marks`: where the corpus marks them), `<eot>` at the end."""
    tokens: list[str] = []
    for paragraph in paragraphs:
        tokens += [*paragraph, END_OF_PARAGRAPH] if marks else paragraph
    return [*tokens, END_OF_TEXT]
