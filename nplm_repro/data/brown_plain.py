"""Plain text cut into tokens as Brown's are (`brown_words`): how a run on Brown reads a user's text
(`brown_plain_words`; plain.py's `read_text` asks the run's corpus kind, load.py, which reader that is).

A run on Brown learnt Brown's tokens, which are not whitespace-separated words of plain text: Brown transcribes
punctuation as tokens of its own (`nation ,`), double quotes as `` and '' (opening, closing), a dash as `--`, and
keeps whole what written English writes as one word: contractions (don't, I'm), possessives (Atlanta's, parents'),
hyphenated words (well-known), numbers with their $ and % ($1,000, 50%), and abbreviations with their dot (Mr., U.S.,
etc.). So plain text is cut as Brown is (`brown_words`), or read as it is where it already is tokens: a file in
Brown's own word/TAG format.

Whether a dot or an apostrophe at a word's edge belongs to the word is a fact about Brown, not a rule of English
(Brown writes `Mr.` and `etc.` whole but `in .` and `no .` apart, `'em` and `goin'` whole but `' pro '` apart):
`BROWN_FORMS` lists the words Brown writes with them, derived from Brown itself (`brown_forms`), not the run's
vocabulary, so that a rare abbreviation is one `<unk>` as in Brown's stream, not `<unk>` and a sentence's end.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from collections.abc import Sequence
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

from nplm_repro.data.brown import brown_text, read_brown
from nplm_repro.data.brown_forms import BROWN_FORMS
from nplm_repro.data.text import TAGGED
from nplm_repro.data.tokens import marked, split_paragraphs

if TYPE_CHECKING:
    from nltk.tokenize import RegexpTokenizer

# Typeset characters as Brown's transcription writes them (curly double quotes become Brown's `` and '' at once;
# a straight one is opening or closing by where it stands, in `brown_words`).
TYPESET = (
    (re.compile("[‘’‛′]"), "'"),
    (re.compile("[“‟]"), "``"),
    (re.compile("[”″]"), "''"),
    (re.compile(r"(?<=\w)–(?=\w)"), "-"),  # an en dash in a range, 1960–1962: Brown's hyphen
    (re.compile("[—―–]"), "--"),  # a dash: Brown's --
    (re.compile("…"), "..."),
)
PATTERN = r"""(?x)
    ``|''                                   # quotes already written as Brown writes them
    |-{2,}                                  # a dash
    |\.{3,}                                 # an ellipsis (Brown has none: it stays one token, unknown)
    |(?:[^\W\d_]\.){2,}(?:'s)?             # initialisms, with their dots: U.S., p.m., e.g., U.N.'s
    |\$?\.?\d\w*(?:[-.,:/']\w+)*%?          # numbers, with $ and %: $1,000.50 $.03 1/2 10:30 1960s 50% 10-year
    |\w+(?:[-'./]\w+)*(?:-(?=\s))?          # words, inner - ' . / kept, and a hanging hyphen: one- and two-story
    |\S                                     # anything else alone: punctuation, a quote, an edge apostrophe
"""
CLOSE_BEFORE = {".", ",", "?", "!", ";", ":"}  # Brown writes a closing quote before these: `city '' .`
DECADE = re.compile(r"\d\d(?:'?s)?")  # '61, '30s, '20's: Brown keeps their apostrophe
OPENING = "([{-"  # after these (or a space), a straight quote opens


@cache
def _tokenizer() -> RegexpTokenizer:
    from nltk.tokenize import RegexpTokenizer  # a second to import: only where plain text is read

    return RegexpTokenizer(PATTERN)


def _typeset(text: str) -> str:
    for pattern, brown in TYPESET:
        text = pattern.sub(brown, text)
    return text


def brown_words(text: str, forms: frozenset[str] = BROWN_FORMS) -> list[str]:
    """Plain text (a paragraph) cut into tokens as Brown's are: NLTK's RegexpTokenizer with `PATTERN`, then what
    a pattern cannot see, by where each token stands: a straight double quote opens (``) after a space or an
    opening bracket and closes ('') before one; an apostrophe or a dot at a word's edge joins it where Brown writes
    that word with it (`forms`; an apostrophe after an s, the plural possessive parents', unless a single quote
    is open; the apostrophe of a decade, '61); a closing double quote goes before the punctuation it follows."""
    text = _typeset(text)
    spans = list(_tokenizer().span_tokenize(text))
    words: list[str] = []
    last = -1  # where the previous token ends: it touches the next if that starts there
    double = single = False  # a double or a single quote is open
    prefix = ""  # an apostrophe that joins the next word
    for i, (start, end) in enumerate(spans):
        token = text[start:end]
        before = text[start - 1] if start else " "
        after = text[end] if end < len(text) else " "
        touches_next = i + 1 < len(spans) and spans[i + 1][0] == end
        if token == '"':
            opens = before.isspace() or before in OPENING
            closes = after.isspace() or after in CLOSE_BEFORE or after in ")]}-"
            double = opens if opens != closes else not double  # a space on both sides, or none: by turns
            token = "``" if double else "''"
        elif token in ("``", "''"):
            double = token == "``"
        elif token == "'" and last == start and words and words[-1][-1:].isalnum():
            whole = words[-1] + "'"
            if not single and (whole in forms or words[-1][-1] in "sS"):
                words[-1], last = whole, end
                continue
            single = False
        elif token == "'" and touches_next and (before.isspace() or before in OPENING):
            following = text[end : spans[i + 1][1]]
            if "'" + following in forms or DECADE.fullmatch(following):
                prefix = "'"
                continue
            single = True
        elif token == "'":
            single = not single
        elif token == "." and last == start and words and words[-1] + "." in forms:
            words[-1], last = words[-1] + ".", end
            continue
        words.append(prefix + token)
        prefix, last = "", end
    for i in range(1, len(words)):
        if words[i] == "''" and words[i - 1] in CLOSE_BEFORE:
            words[i - 1], words[i] = words[i], words[i - 1]
    return words


def _tagged(text: str) -> bool:
    """Whether a text is in Brown's own word/TAG format: it has items, and every one is word/TAG."""
    items = text.split()
    return bool(items) and all(TAGGED.fullmatch(item) for item in items)


def brown_plain_words(text: str) -> list[str]:
    """A user's text as a run on Brown reads it: a text in Brown's word/TAG format as Brown's own texts are read,
    plain text cut by `brown_words`; its paragraphs (blocks of non-blank lines) marked, `<eot>` at its end."""
    if _tagged(text):
        return brown_text(text)[0]
    blocks = split_paragraphs(text.splitlines(), lambda line: [line] if line.strip() else [])
    return marked((_block_words(block) for block in blocks), True)


PIECE = 1 << 16  # characters: a paragraph longer than this is cut at a space into pieces of about this size


def _block_words(lines: list[str]) -> list[str]:
    """`brown_words` of a paragraph, a long one piece by piece (`PIECE`, cut after a space: no token spans one), so
    that its time grows with its length, never past NLTK's time limit on one regular-expression scan (a 100 kB line
    of one repeated word, in a 50 MB file of them, timed out). A straight quote open at a cut is read by turns."""
    text = "\n".join(lines)
    words: list[str] = []
    start = 0
    while start < len(text):
        end = len(text) if len(text) - start <= PIECE else text.find(" ", start + PIECE) + 1 or len(text)
        words += brown_words(text[start:end])
        start = end
    return words


def brown_forms(tokens: Sequence[str]) -> frozenset[str]:
    """Brown's words that keep a dot or an apostrophe at their edge (`BROWN_FORMS`): the tokens of Brown's stream
    that `brown_words` without them cuts into a word and that dot or apostrophe, and that Brown writes whole more
    often than apart (`Mr.` always; `in.`, inches, 4 times, but `in .` 68 times)."""
    counts = Counter(tokens)
    apart = Counter(pairwise(tokens))
    found = set()
    for form, count in counts.items():
        if form[-1:] in (".", "'") or form[:1] == "'":
            pieces = tuple(brown_words(form, frozenset()))
            edge = (form[:-1], form[-1]) if form[-1:] in (".", "'") else ("'", form[1:])
            if pieces == edge and count > apart[pieces]:
                found.add(form)
    return frozenset(found)


def write_forms(brown: Path) -> None:
    """Write brown_forms.py from Brown's stream (`python -m nplm_repro.data.brown_plain PATH/brown.zip`); the tests
    check that the one in the package is what Brown gives."""
    forms = textwrap.fill(" ".join(sorted(brown_forms(read_brown(brown)[0]))), 116, break_on_hyphens=False)
    Path(__file__).with_name("brown_forms.py").write_text(
        '"""Brown\'s words that keep a dot or an apostrophe at their edge (brown_plain.py says why), written by\n'
        "`python -m nplm_repro.data.brown_plain brown.zip` from Brown's stream; "
        'tests/test_tokenize.py checks them."""\n\n'
        f'FORMS = """\n{forms}\n"""\nBROWN_FORMS = frozenset(FORMS.split())\n'
    )


if __name__ == "__main__":
    import sys

    write_forms(Path(sys.argv[1]))
