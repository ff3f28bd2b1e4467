"""The first step of reading a corpus: its files' bytes, from a folder or a zip (paper §4, p. 1147: Brown comes as
NLTK's brown.zip or its folder, a text corpus as a file, a folder or a zip). A reader (brown.py, text.py) then
turns the bytes into tokens (tokens.py), cuts them into splits (splits.py), builds the vocabulary (vocabulary.py)
and the Corpus (corpus.py).
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

from nplm_repro.errors import NplmError

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
