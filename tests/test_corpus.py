"""The Brown preprocessing facts on the real zip, the windows, and the corpus errors (also through `nplm-train`)."""

import bz2
import gzip
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import run_script

from nplm_repro.data.brown import find_brown, prepare_brown
from nplm_repro.data.corpus import END_OF_PARAGRAPH, END_OF_TEXT, UNK, Corpus
from nplm_repro.data.text import source_path
from nplm_repro.data.windows import WindowBatches, split_context, windows
from nplm_repro.errors import NplmError, one_line


def test_brown_stream_facts(brown: Corpus) -> None:
    """The counts documented beside the Brown zip: 1,161,192 words + 15,667 paragraph + 500 text marks."""
    assert brown.counts["texts"] == 500
    assert brown.counts["paragraphs"] == 15_667
    assert brown.counts["words"] == 1_161_192
    assert len(brown.ids) == 1_177_359
    assert brown.counts["types"] == 56_057 + 2  # the two marks are types of the stream too


def test_brown_splits_are_the_papers(brown: Corpus) -> None:
    assert brown.bounds == {"train": (0, 800_000), "valid": (800_000, 1_000_000), "test": (1_000_000, 1_177_359)}


def test_vocabulary_merges_words_seen_at_most_three_times(brown: Corpus) -> None:
    assert brown.vocab_size == 17_907  # 17,904 words + <eop> + <eot> + <unk>... counted on the whole stream
    counts = torch.bincount(brown.ids, minlength=brown.vocab_size)
    kept = [i for i, w in enumerate(brown.vocab) if w != UNK]
    assert counts[kept].min() >= 4
    assert UNK in brown.vocab and END_OF_PARAGRAPH in brown.vocab and END_OF_TEXT in brown.vocab


def test_marks_end_paragraphs_and_texts(brown: Corpus) -> None:
    vocab = brown.vocab
    eop, eot = vocab.index(END_OF_PARAGRAPH), vocab.index(END_OF_TEXT)
    assert int((brown.ids == eot).sum()) == 500
    assert int((brown.ids == eop).sum()) == 15_667
    assert brown.ids[-1] == eot and brown.ids[-2] == eop  # cr09 ends with its last paragraph
    first = [vocab[i] for i in brown.ids[:9]]
    assert first == ["The", "Fulton", "County", "Grand", "Jury", "said", "Friday", "an", "investigation"]


def test_vocab_from_train_counts_on_the_training_split(brown_path: Path) -> None:
    assert prepare_brown(str(brown_path), vocab_from="train").vocab_size == 14_039


def test_fingerprint_changes_with_the_data(tiny_brown_path: Path) -> None:
    small = prepare_brown(str(tiny_brown_path), train=1000, valid=100, test=100)
    again = prepare_brown(str(tiny_brown_path), train=1000, valid=100, test=100)
    other = prepare_brown(str(tiny_brown_path), train=1000, valid=100, test=101)
    assert small.fingerprint == again.fingerprint != other.fingerprint


def test_windows_take_context_from_the_previous_split() -> None:
    ids = torch.arange(10)
    rows = windows(ids, 4, 7, n=3, pad_id=99)
    assert rows.tolist() == [[2, 3, 4], [3, 4, 5], [4, 5, 6]]


def test_windows_pad_the_start_of_the_stream_with_end_of_text() -> None:
    rows = windows(torch.arange(5), 0, 3, n=4, pad_id=99)
    assert rows.tolist() == [[99, 99, 99, 0], [99, 99, 0, 1], [99, 0, 1, 2]]


def test_every_token_of_a_split_is_scored_once(tiny_brown_path: Path) -> None:
    brown = prepare_brown(str(tiny_brown_path), train=6000, valid=2000)
    start, end = brown.bounds["test"]
    rows = windows(brown.ids, start, end, n=5, pad_id=0)
    batches = WindowBatches(rows, batch_size=256, shuffle=True, seed=3)
    targets = torch.cat([target for _, target in batches])
    assert len(batches) == -(-(end - start) // 256) > 1
    assert torch.equal(targets.sort().values, brown.ids[start:end].sort().values)
    context, target = split_context(rows[:1])
    assert context[0].tolist() == [brown.ids[start - 1 - k].item() for k in range(4)]  # w_{t-1} first
    assert target.item() == brown.ids[start].item()


def test_shuffle_is_seeded_and_changes_each_pass() -> None:
    rows = windows(torch.arange(100), 0, 100, n=2, pad_id=0)
    first, second = WindowBatches(rows, 10, shuffle=True, seed=1), WindowBatches(rows, 10, shuffle=True, seed=1)
    epoch1 = [t.tolist() for _, t in first]
    assert epoch1 == [t.tolist() for _, t in second]
    assert epoch1 != [t.tolist() for _, t in first]


def test_missing_corpus_lists_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nltk"))
    with pytest.raises(NplmError, match="not found.*nltk.*nltk.downloader brown") as error:
        find_brown(None)
    assert "\n" not in str(error.value)


def test_configured_path_that_does_not_exist_is_an_error_even_if_nltk_has_brown(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    """A typo in data.path must not quietly train on another copy of the corpus."""
    import nltk.data

    (tmp_path / "corpora").mkdir()
    (tmp_path / "corpora" / "brown.zip").symlink_to(tiny_brown_path)
    nltk.data.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(NplmError, match=f"not found \\(looked in: {tmp_path}/typo.zip\\);"):
            find_brown(tmp_path / "typo.zip")
    finally:
        nltk.data.path.remove(str(tmp_path))


def test_found_in_nltk_data_when_not_configured(tiny_brown_path: Path, tmp_path: Path) -> None:
    import nltk.data

    corpora = tmp_path / "corpora"
    corpora.mkdir()
    (corpora / "brown.zip").symlink_to(tiny_brown_path)
    nltk.data.path.insert(0, str(tmp_path))
    try:
        assert find_brown(None) == corpora / "brown.zip"
    finally:
        nltk.data.path.remove(str(tmp_path))


def test_truncated_zip_is_one_clear_error(tiny_brown_path: Path, tmp_path: Path) -> None:
    broken = tmp_path / "brown.zip"
    broken.write_bytes(half_of(tiny_brown_path))
    with pytest.raises(NplmError, match="corrupt or truncated zip"):
        prepare_brown(str(broken))


@pytest.mark.parametrize(
    "pack,said",
    [(gzip.compress, "a gzip file, not a zip: unpack it"), (bz2.compress, "a bzip2 file, not a zip: unpack it")],
)
def test_a_compressed_corpus_given_for_the_zip_says_what_it_is(
    pack: Callable[[bytes], bytes], said: str, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """zipfile's "File is not a zip file" (said twice) did not tell a damaged zip from a compressed one."""
    packed = tmp_path / "brown.zip"
    packed.write_bytes(pack(tiny_brown_path.read_bytes()))
    with pytest.raises(NplmError) as error:
        prepare_brown(str(packed))
    assert one_line(error.value) == f"{packed}: {said} and give the zip or folder it holds"


def test_zip_without_texts_is_one_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "brown.zip"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("brown/README", "nothing here")
    with pytest.raises(NplmError, match="no Brown texts"):
        prepare_brown(str(empty))


def test_corpus_smaller_than_the_splits_is_refused(tiny_brown_path: Path) -> None:
    with pytest.raises(NplmError, match="too few"):
        prepare_brown(str(tiny_brown_path), train=1_000_000, valid=200_000)


def half_of(path: Path) -> bytes:
    """The first half of a file: a zip cut there has lost its central directory."""
    data = path.read_bytes()
    return data[: len(data) // 2]


def brown_zip(path: Path, texts: dict[str, str | bytes]) -> str:
    """A zip laid out as NLTK's brown.zip, holding these texts."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in texts.items():
            archive.writestr(f"brown/{name}", text)
    return str(path)


@pytest.mark.parametrize(
    "case,message",
    [
        ("missing", "Brown corpus not found (looked in: {tmp}/nowhere.zip); "),
        pytest.param("truncated", "{tmp}/brown.zip: corrupt or truncated zip (", marks=pytest.mark.slow),
        pytest.param(
            "gzip",
            "{tmp}/brown.zip: a gzip file, not a zip: unpack it and give the zip or folder it holds",
            marks=pytest.mark.slow,
        ),
        pytest.param("no texts", "{tmp}/brown.zip: no Brown texts (ca01..cr09) found; ", marks=pytest.mark.slow),
        pytest.param("empty", "{tmp}/brown.zip: the corpus is empty (no words in 1 text)", marks=pytest.mark.slow),
        pytest.param("too small", "the corpus has 4 tokens, too few for the requested splits ", marks=pytest.mark.slow),
        pytest.param("corrupt member", "{tmp}/brown.zip: ca02 is not UTF-8 at byte 1: ", marks=pytest.mark.slow),
    ],
)
def test_bad_corpus_is_one_line_exit_2_and_no_run(
    case: str, message: str, tiny_brown_path: Path, tmp_path: Path
) -> None:
    """`nplm-train` as a user runs it: the corpus is read before the store is opened, so neither a run nor a store
    is left, whether the path is not there, not a zip, or found bad only once read."""
    corpus = tmp_path / "brown.zip"
    if case == "missing":
        corpus = tmp_path / "nowhere.zip"
    elif case == "truncated":
        corpus.write_bytes(half_of(tiny_brown_path))
    elif case == "gzip":
        corpus.write_bytes(gzip.compress(tiny_brown_path.read_bytes()))
    else:
        texts = {
            "no texts": {"README": "nothing"},
            "empty": {"ca01": "\n\n"},
            "too small": {"ca01": "a/at b/nn\n"},
            "corrupt member": {"ca01": "a/at b/nn\n", "ca02": b"a\xac\xff garbage"},
        }
        brown_zip(corpus, texts[case])
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "NLTK_DATA": str(tmp_path / "nltk")}  # not found elsewhere either
    result = run_script("nplm-train", f"data.path={corpus}", f"tracking.uri={uri}", cwd=tmp_path, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("nplm-train: error: " + message.format(tmp=tmp_path)), lines[-1]
    assert [line for line in lines if "error" in line.lower()] == [lines[-1]] and "Traceback" not in result.stderr
    assert not (tmp_path / "mlflow.db").exists()  # so no run either
    assert not list(tmp_path.glob("outputs/*/*/checkpoints"))


def test_tiny_brown_is_what_its_script_writes(tiny_brown_path: Path, tmp_path: Path) -> None:
    """tests/data/tiny_brown.zip holds what tests/data/make_tiny_brown.py writes (run it again after changing it),
    and the Brown reader takes it as it takes brown.zip: its texts, not its README, and words merged into <unk>."""
    script = tiny_brown_path.with_name("make_tiny_brown.py")
    again = tmp_path / "again.zip"
    result = subprocess.run([sys.executable, str(script), "--out", str(again)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    with zipfile.ZipFile(tiny_brown_path) as committed, zipfile.ZipFile(again) as written:
        assert committed.namelist() == written.namelist()
        assert all(committed.read(name) == written.read(name) for name in committed.namelist())
    tiny = prepare_brown(str(tiny_brown_path), train=6000, valid=2000)
    assert tiny.counts["texts"] == 21 and tiny.counts["unk_types"] > 0 and tiny.source == "tiny_brown.zip"


def test_a_path_that_is_a_symbolic_link_loop_or_dangling_says_so(tmp_path: Path) -> None:
    """A symlink loop was called "no such file or directory", as the OS calls it."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "gone").symlink_to(tmp_path / "nothing")
    said = {}
    for name in ("a", "gone", "none"):
        with pytest.raises(NplmError) as refused:
            source_path(str(tmp_path / name), "data.path")
        said[name] = str(refused.value).removeprefix(f"data.path={tmp_path / name}: ")
    assert said == {
        "a": "a symbolic link that loops back to itself",
        "gone": f"a symbolic link to {tmp_path / 'nothing'}, which does not exist",
        "none": "no such file or directory",
    }
    with pytest.raises(NplmError, match=r"looked in: \S+/a \(a symbolic link that loops back to itself\)"):
        find_brown(tmp_path / "a")
