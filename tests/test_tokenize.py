"""A user's text read as a run reads its corpus (nplm_repro/data/plain.py): plain text cut as Brown is cut
(brown_plain.py), checked on Brown itself by a round trip (Brown's texts written out as plain text and cut again);
Brown's own word/TAG format and whitespace-separated tokens read as they are; a text corpus's run keeps its own
reader."""

from __future__ import annotations

import re
import time
import zipfile
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import nltk.redos
import pytest
from helpers import CONF, composed
from omegaconf import OmegaConf

from nplm_repro.data import brown_plain
from nplm_repro.data import plain as plain_text
from nplm_repro.data.brown import read_brown
from nplm_repro.data.brown_plain import BROWN_FORMS, brown_forms, brown_words
from nplm_repro.data.corpus import END_OF_PARAGRAPH, END_OF_TEXT
from nplm_repro.data.plain import read_text, text_pieces
from nplm_repro.data.text import drop_invisible
from nplm_repro.errors import NplmError

BROWN = OmegaConf.load(CONF / "data" / "brown.yaml")
TEXT = OmegaConf.merge(OmegaConf.load(CONF / "data" / "text.yaml"), {"lowercase": True, "numbers": True})
GLUED_LEFT = {",", ".", ";", ":", "?", "!", ")", "]", "''", "--"}  # written without a space before
GLUED_RIGHT = {"``", "(", "[", "--"}  # written without a space after


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("our nation, our ancestors.", "our nation , our ancestors ."),  # punctuation apart
        ('He said, "I\'m here."', "He said , `` I'm here '' ."),  # straight quotes; '' before the . as in Brown
        ("“You’d go,” she said.", "`` You'd go '' , she said ."),  # curly quotes and apostrophes
        ("don't it's can't I'm well-known", "don't it's can't I'm well-known"),  # kept whole, as Brown keeps them
        ("Atlanta's jury and the parents' vote", "Atlanta's jury and the parents' vote"),  # possessives
        ("Mr. Smith of the U.S. etc. in Washington, D.C.", "Mr. Smith of the U.S. etc. in Washington , D.C."),
        ("He came in. No. 5 won.", "He came in . No. 5 won ."),  # in. is no abbreviation in Brown; No. is
        ("he left--quickly — and one- and two-story", "he left -- quickly -- and one- and two-story"),
        ("$1,000.50 or 50% at 10:30 p.m. in the '30s", "$1,000.50 or 50% at 10:30 p.m. in the '30s"),
        ("a 'pro' vote, 'em and goin'", "a ' pro ' vote , 'em and goin'"),  # single quotes apart; Brown's 'em
        ("it ran 1960–1962 and/or later...", "it ran 1960-1962 and/or later ..."),
    ],
)
def test_plain_text_is_cut_as_brown_is(text: str, tokens: str) -> None:
    assert brown_words(text) == tokens.split()


# Invisible characters, each of which read as a token of its own (or cut a word in two): an emoji family joined by
# zero-width joiners, an emoji's presentation selector, a zero-width space and a soft hyphen inside words, a byte
# order mark and a word joiner between words, a supplementary variation selector.
INVISIBLE = (
    "Family time \U0001f468\u200d\U0001f469\u200d\U0001f467 is the best \u2764\ufe0f, a data\u200bbase we "
    "co\u00adoperate on.\n\n\ufeffYes\u2060 we do\U000e0100.\n"
)
SEEN = "Family time \U0001f468\U0001f469\U0001f467 is the best \u2764, a database we cooperate on.\n\nYes we do.\n"


@pytest.mark.parametrize("tokenized", [False, True], ids=["plain", "tokenized"])
@pytest.mark.parametrize("data", [BROWN, TEXT], ids=["brown", "text"])
def test_invisible_characters_are_no_tokens(data: Any, tokenized: bool) -> None:
    """Unicode's format characters (zero-width joiner and space, soft hyphen, BOM, ...) and variation selectors
    only join, break or colour what is written: a text reads as it would without them."""
    assert drop_invisible(INVISIBLE) == SEEN
    assert read_text(INVISIBLE, data, "t", tokenized) == read_text(SEEN, data, "t", tokenized)
    if data is BROWN and not tokenized:
        assert read_text(INVISIBLE, data, "t")[:11] == [
            "Family",
            "time",
            "👨",
            "👩",
            "👧",
            "is",
            "the",
            "best",
            "❤",
            ",",
            "a",
        ]


def test_the_forms_kept_whole_are_what_brown_gives(brown_path: Path) -> None:
    """brown_forms.py is derived from Brown, not written by hand (`python -m nplm_repro.data.brown_plain` writes it)."""
    assert brown_forms(read_brown(brown_path)[0]) == BROWN_FORMS
    assert {"Mr.", "etc.", "'em", "goin'"} <= BROWN_FORMS and not {"in.", "no."} & BROWN_FORMS


def plain(tokens: list[str]) -> str:
    """Brown's tokens of a paragraph as a writer types them: straight double quotes for both `` and '', single
    quotes opening and closing in turn, the dash between words without spaces, punctuation on the word before."""
    out: list[str] = []
    glued, single = True, False
    for token in tokens:
        left = token in GLUED_LEFT
        if token == "'":
            left, single = single, not single
        if out and not left and not glued:
            out.append(" ")
        out.append('"' if token in ("``", "''") else token)
        glued = token in GLUED_RIGHT or (token == "'" and single)
    return "".join(out)


def paragraphs(tokens: list[str]) -> list[list[str]]:
    found: list[list[str]] = [[]]
    for token in tokens:
        if token == END_OF_PARAGRAPH:
            found.append([])
        elif token != END_OF_TEXT:
            found[-1].append(token)
    return found[:-1]


def round_trip(brown_path: Path, names: list[str]) -> tuple[int, int]:
    """Brown's texts `names` written as plain text, one paragraph a block, and read back as a Brown run reads a
    user's text: (tokens that came back identical, tokens), paragraph by paragraph."""
    same = total = 0
    with zipfile.ZipFile(brown_path) as archive:
        for name in names:
            tagged = archive.read(f"brown/{name}").decode()
            brown = paragraphs(read_text(tagged, BROWN, name))  # read as a word/TAG file: Brown's own tokens
            back = paragraphs(read_text("\n\n".join(plain(p) for p in brown), BROWN, name))
            assert len(back) == len(brown), name
            for ours, theirs in zip(brown, back):
                matched = SequenceMatcher(None, ours, theirs, autojunk=False).get_matching_blocks()
                same += sum(block.size for block in matched)
                total += len(ours)
    return same, total


def test_brown_written_as_plain_text_is_cut_back_into_its_own_tokens(brown_path: Path) -> None:
    """A news text, a learned one and a story (quotes, contractions, abbreviations, figures)."""
    same, total = round_trip(brown_path, ["ca01", "cj01", "cn01"])
    assert total > 6_000 and same / total >= 0.99


@pytest.mark.slow  # about 4 s: all 500 texts
def test_all_of_brown_round_trips(brown_path: Path) -> None:
    with zipfile.ZipFile(brown_path) as archive:
        names = sorted(n.split("/")[1] for n in archive.namelist() if re.fullmatch(r"brown/c[a-r]\d\d", n))
    same, total = round_trip(brown_path, names)
    print(f"round trip on {len(names)} Brown texts: {same:,} of {total:,} tokens identical ({same / total:.4%})")
    assert len(names) == 500 and same / total >= 0.999


def test_brown_files_and_tokens_are_read_as_they_are() -> None:
    tagged = "The/at jury/nn said/vbd ,/, ``/`` it's/pps+bez fine/jj ''/'' ./.\n\n1/2/cd and/or/cc\n"
    brown = ["The", "jury", "said", ",", "``", "it's", "fine", "''", ".", "<eop>", "1/2", "and/or", "<eop>", "<eot>"]
    assert read_text(tagged, BROWN, "t") == brown
    tokens = "nation, said don't.\n\nand/or\n"
    assert read_text(tokens, BROWN, "t", tokenized=True) == [
        "nation,",
        "said",
        "don't.",
        "<eop>",
        "and/or",
        "<eop>",
        "<eot>",
    ]
    assert read_text(tokens, BROWN, "t") == ["nation", ",", "said", "don't", ".", "<eop>", "and/or", "<eop>", "<eot>"]
    assert read_text("", BROWN, "t") == read_text(" \n\n", BROWN, "t") == ["<eot>"]


def test_a_text_corpus_run_keeps_its_own_reader_and_preprocessing() -> None:
    preprocessed = ["the", "<int>", "cats", ",", "in", "<year>", ".", "<eop>", "<eot>"]
    assert read_text("The 3 cats, in 1990.\n", TEXT, "t") == preprocessed
    unpara = OmegaConf.merge(TEXT, {"paragraphs": False})
    assert read_text("The 3\n\ncats,\n", unpara, "t", tokenized=True) == ["The", "3", "cats,", "<eot>"]


def test_binary_data_is_refused_in_one_line() -> None:
    for data in (BROWN, TEXT):
        said = r"^--text x\.bin has a NUL byte at byte 2: binary data, not text, or UTF-16 text with no byte-order mark"
        with pytest.raises(NplmError, match=said + r" \(nplm-score reads that with --encoding utf-16\)$"):
            read_text("ab\x00\x00", data, "--text x.bin")


def test_a_long_line_is_cut_in_pieces_each_scanned_within_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100 kB line of one repeated word, in a 50 MB file of them: one paragraph, scanned by one regular expression,
    past NLTK's 5 s limit (`TimeoutError`, the tokenizer's whole regex in the message). Cut into pieces (here of
    1 kB, so that the 2 MB line is about 2,000 of them), each scan takes about a 2,000th of the whole line's. The
    limit is set at a quarter of the whole line's own scan, the faster of two timed here: that scan would have to
    run 4 times faster than both to finish within it, and a piece keeps a margin of hundreds of times its own scan
    (the limit is wall-clock time over a lazy scan, so a garbage collection in a big test session falls inside it).
    A piece's own time is not the measure: a tracer such as coverage.py costs each call, 2,000 times over."""
    line = 'The jury said "it was Mr. Smith\'s 50% of $1,000." ' * 40_000  # 2 MB, no blank line, no newline
    data = composed().data
    whole = brown_words(line)  # the first scan also compiles NLTK's expressions
    scans = []
    for _ in range(2):
        started = time.perf_counter()
        assert brown_words(line) == whole
        scans.append(time.perf_counter() - started)
    monkeypatch.setattr(brown_plain, "PIECE", 1 << 10)
    monkeypatch.setattr(nltk.redos, "DEFAULT_TIMEOUT", min(scans) / 4)
    with pytest.raises(TimeoutError):  # what a scan of the whole line did
        brown_words(line)
    assert read_text(line, data, "--text long.txt") == [*whole, "<eop>", "<eot>"]


def test_a_file_read_a_piece_at_a_time_gives_the_tokens_of_the_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nplm-score --text` read a 50 MB file whole, 1.6 GB of Python strings; now 1 MB at a time (here 40 bytes, so
    that characters, paragraphs and a long paragraph are all cut): the same tokens, the same refusals."""
    text = (
        "The café's jury said, \u201cit was Mr. Smith\u2019s.\u201d\n\n  \nA second paragraph, on\ntwo lines.\n\n"
        + "a long paragraph of many words " * 20
        + "\n\nThe end."
    )
    data = composed().data
    whole = read_text(text, data, "x")
    monkeypatch.setattr(plain_text, "READ_BYTES", 40)
    for encoding, given in (("utf-8", None), ("utf-16", None), ("utf-8-sig", None), ("cp1252", "cp1252")):
        path = tmp_path / f"{encoding}.txt"
        path.write_bytes(text.encode(encoding))  # utf-16 and utf-8-sig with a byte-order mark
        assert [w for piece in text_pieces(path, data, "x", encoding=given) for w in piece] == whole, encoding
    assert whole[:4] == ["The", "café's", "jury", "said"] and whole.count("<eop>") == 4 and len(whole) > 130
    (tmp_path / "bad.txt").write_bytes(text.encode() + b"\xff and more")
    with pytest.raises(NplmError, match=rf"^x: not utf-8 text at byte {len(text.encode())} and it has no byte-order"):
        list(text_pieces(tmp_path / "bad.txt", data, "x"))
