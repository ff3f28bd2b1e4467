"""A user's text as a run reads its own corpus: for `nplm-score --text`, the prompts of `nplm-ask` and the contexts
of a run's MLflow Model, one function (`read_text`, and `read_context` for the last two) so that the three cannot
read a text differently.

How the words are read is the run's corpus kind's (load.py): a run on a plain-text corpus reads a text with its own
reader and preprocessing (text.py), a run on Brown cuts it into Brown's tokens (brown_plain.py). Whitespace-separated
tokens (`tokenized`) are read as they are, whatever the corpus.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nplm_repro.data.load import corpus_kind
from nplm_repro.data.text import drop_invisible
from nplm_repro.data.tokens import END_OF_PARAGRAPH, END_OF_TEXT, marked, split_paragraphs
from nplm_repro.errors import NplmError


def read_text(text: str, data: Any, name: str, tokenized: bool = False, at: int = 0) -> list[str]:
    """A user's text as a run on `data` (its data config) reads its corpus, its paragraphs (blocks of non-blank
    lines) marked as the corpus marks them and `<eot>` at its end. With `tokenized`, whitespace-separated tokens
    read as they are; else as the corpus kind reads a text (`words`: on Brown, a text in Brown's word/TAG format as
    Brown's own texts are read, plain text cut by `brown_words`; on a text corpus, the run's reader and
    preprocessing). Invisible characters (zero-width joiners, variation selectors, a BOM, ...) are dropped first, as
    from the corpus's own files (text.py's `drop_invisible`). `name` says what the text is in errors (a NUL: binary
    data, or UTF-16 without its byte-order mark), `at` where the text starts in its file (UTF-8 bytes: `text_pieces` reads a file a piece at a
    time)."""
    if "\x00" in text:
        at += len(text[: text.index("\x00")].encode())
        raise NplmError(
            f"{name} has a NUL byte at byte {at}: binary data, not text, or UTF-16 text with no byte-order mark "
            "(nplm-score reads that with --encoding utf-16)"
        )
    text, kind = drop_invisible(text), corpus_kind(data)
    if tokenized:
        return marked(split_paragraphs(text.splitlines(), str.split), kind.marks_paragraphs(data))
    return kind.words(text, name, data)


def read_context(text: str, data: Any, name: str) -> list[str]:
    """A prompt or a context to continue, read as `read_text` reads a text, without the marks of a text's end that
    would make the next word the first of a new text."""
    words = read_text(text, data, name)
    while words and words[-1] in (END_OF_PARAGRAPH, END_OF_TEXT):
        words.pop()
    return words


# Byte-order marks, the longest first (UTF-32 LE's begins with UTF-16 LE's): what a file without --encoding is read as
BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
READ_BYTES = 1 << 20  # a file is decoded this much at a time
BLANK_LINE = re.compile(r"\n[^\S\n]*\n")  # where a paragraph ends (tokens.py `split_paragraphs`)


def text_encoding(raw: bytes, default: str) -> str:
    """The encoding the byte-order mark at the start of `raw` names (Windows' Notepad writes UTF-16 with one), else
    `default`."""
    return next((encoding for bom, encoding in BOMS if raw.startswith(bom)), default)


def text_pieces(
    path: Path, data: Any, name: str, tokenized: bool = False, encoding: str | None = None
) -> Iterator[list[str]]:
    """A user's text file as `read_text` reads it, a piece at a time, so that the memory it takes does not grow with
    the file: on Brown, whole paragraphs of about READ_BYTES (a longer paragraph in pieces cut at a space, its
    `<eop>` after its last), `<eot>` after the last piece; a text corpus's reader reads the file whole (it judges
    proper nouns on the whole text). Decoded as `encoding` says (`--encoding`), else as its byte-order mark says
    (`text_encoding`), else as the run's corpus is (Brown: UTF-8); a byte that is not text is named."""
    with path.open("rb") as file:
        kind = corpus_kind(data)
        chosen = encoding or text_encoding(file.read(4), kind.encoding(data))
        file.seek(0)
        decoder = codecs.getincrementaldecoder(chosen)()
        size = -1 if kind.reads_whole else READ_BYTES
        pending, done, at = "", 0, 0  # text not yet read, bytes decoded, UTF-8 bytes of the text read
        while True:
            block = file.read(size)
            last = not block or size < 0
            buffered = len(decoder.getstate()[0])  # bytes of a character that the last block cut
            try:
                pending += decoder.decode(block, final=last)
            except UnicodeDecodeError as error:
                said = "" if encoding else " and it has no byte-order mark"
                raise NplmError(
                    f"{name}: not {chosen} text at byte {done - buffered + error.start}{said}: give its encoding "
                    "(--encoding utf-16, --encoding latin-1, ...) or convert it (iconv -f <encoding> -t utf-8)"
                ) from None
            done += len(block)
            cut, whole = (len(pending), True) if last else _cut(pending)
            if cut:
                piece, pending = pending[:cut], pending[cut:]
                words = read_text(piece, data, name, tokenized, at)
                if words[-1:] == [END_OF_TEXT]:  # the file's comes after its last piece
                    words.pop()
                if not whole and words[-1:] == [END_OF_PARAGRAPH]:
                    words.pop()  # a paragraph cut at a space goes on in the next piece
                at += len(piece.encode())
                yield words
            if last:
                yield [END_OF_TEXT]
                return


def _cut(text: str) -> tuple[int, bool]:
    """Where a piece of `text` ends, and whether a paragraph ends there: after its last blank line, else, past
    READ_BYTES, after its last space (the paragraph goes on); 0 to read on."""
    last = None
    for last in BLANK_LINE.finditer(text):
        pass
    if last is not None:
        return last.end(), True
    return (text.rfind(" ") + 1 if len(text) > READ_BYTES else 0), False
