"""A user's plain-text corpus and the AP preprocessing: tokenisation, mappings, reading, errors, splits, the WSJ
sample of $NPLM_SHARED/data/treebank.zip (raw and tagged), Brown read as text, and the ap_table2 sweep on WSJ."""

import re
import zipfile
from pathlib import Path

import mlflow
import pytest
from helpers import composed, run_script

from nplm_repro.data.brown import read_brown
from nplm_repro.data.corpus import END_OF_PARAGRAPH, END_OF_TEXT, UNK
from nplm_repro.data.text import AP_SPLIT, PROPER, TextCorpus, number_symbol, prepare_text, tokenize
from nplm_repro.errors import NplmError
from nplm_repro.tracking.config_checks import check_config

AP = {"numbers": True, "proper_nouns": True, "lowercase": True, "drop_lines": [".START"]}
SPLIT = {"train": 40, "valid": 5}  # test: the rest


def words(corpus: TextCorpus, split: str | None = None) -> list[str]:
    start, end = corpus.bounds[split] if split else (0, len(corpus.ids))
    return [corpus.vocab[i] for i in corpus.ids[start:end]]


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(
    "line,tokens",
    [
        (
            "Mr. Smith's U.S. unit paid $1,000.50 -- on Nov. 29th.",
            ["Mr", ".", "Smith's", "U.S.", "unit", "paid", "$", "1,000.50", "-", "-", "on", "Nov", ".", "29th", "."],
        ),
        (
            "A state-of-the-art 10-year plan, don't you think?",
            ["A", "state-of-the-art", "10-year", "plan", ",", "don't", "you", "think", "?"],
        ),
        (
            "In the 1990s, 1/2 of it (at 10:30)...",
            ["In", "the", "1990s", ",", "1/2", "of", "it", "(", "at", "10:30", ")", ".", ".", "."],
        ),
        ("«Café» l’été: 5%", ["«", "Café", "»", "l’été", ":", "5", "%"]),
    ],
)
def test_tokenize_splits_words_and_punctuation(line: str, tokens: list[str]) -> None:
    assert tokenize(line) == tokens


@pytest.mark.parametrize(
    "token,symbol",
    [
        ("1995", "<year>"),
        ("1990s", "<year>"),
        ("21st", "<ordinal>"),
        ("3RD", "<ordinal>"),
        ("1/2", "<fraction>"),
        ("3.5", "<decimal>"),
        ("1,000.25", "<decimal>"),
        ("61", "<int>"),
        ("1,000", "<int>"),
        ("1400", "<int>"),
        ("10-year", None),
        ("10:30", None),
        ("A300", None),
    ],
)
def test_numeric_forms_and_their_symbols(token: str, symbol: str | None) -> None:
    assert number_symbol(token) == symbol


def test_ap_mappings_on_small_text(tmp_path: Path) -> None:
    """Numbers first, then proper nouns (capitalised inside a sentence, never lower case), then lower case."""
    text = (
        ".START\n\nThe board met Vinken in 1995 .\nLater the New board paid 3.5 million to Vinken .\n\n"
        "It was the 2nd new deal , I think .\n"
    )
    corpus = prepare_text(str(write(tmp_path / "news.txt", text)), **AP, train=28, valid=1)
    assert words(corpus)[:8] == ["the", "board", "met", PROPER, "in", "<year>", ".", "later"]
    # New occurs lower-cased (new deal), I is one letter, The/Later/It only start sentences
    assert words(corpus)[8:18] == ["the", "new", "board", "paid", "<decimal>", "million", "to", PROPER, ".", "<eop>"]
    assert words(corpus)[19:22] == ["was", "the", "<ordinal>"] and "i" in words(corpus)
    c = corpus.counts
    assert (c["year_tokens"], c["decimal_tokens"], c["ordinal_tokens"], c["int_tokens"]) == (1, 1, 1, 0)
    assert (c["proper_tokens"], c["proper_types"], c["paragraphs"], c["files"]) == (2, 1, 2, 1)
    assert corpus.count_tags()["count.proper_tokens"] == "2" and corpus.count_tags()["data_source"] == "news.txt"
    assert "<proper> 2 tokens (1 types)" in corpus.summary() and "<year> 1" in corpus.summary()


def test_each_mapping_switches_off_and_changes_the_fingerprint(tmp_path: Path) -> None:
    path = str(write(tmp_path / "news.txt", "Stocks rose in 1995 and Vinken said so .\n" * 8))
    on = prepare_text(path, **AP, **SPLIT)
    assert {"<year>", PROPER, "stocks"} <= set(on.vocab)
    seen = {on.fingerprint}
    for step, said, absent, present in (
        ("numbers", "numbers", "<year>", "1995"),
        ("proper_nouns", "proper nouns", PROPER, "vinken"),
        ("lowercase", "lower-casing", "stocks", "Stocks"),
    ):
        off = prepare_text(path, **(AP | {step: False}), **SPLIT)
        assert absent not in off.vocab and present in off.vocab and f"{said}: off" in off.summary()
        seen.add(off.fingerprint)
    plain = prepare_text(path, **SPLIT)
    assert plain.vocab == prepare_text(path, **SPLIT, tags=False).vocab
    assert len(seen | {plain.fingerprint}) == 5
    assert "numbers: off; proper nouns: off; lower-casing: off" in plain.summary()


def test_tagged_words_are_proper_by_their_tags(tmp_path: Path) -> None:
    pos = (
        "[ Pierre/NNP Vinken/NNP ]\n,/, \n[ 61/CD years/NNS ]\nold/JJ ./. \n\n======\n[ Mr./NNP Vinken/NNP ]\nis/VBZ \n"
    )
    corpus = prepare_text(
        str(write(tmp_path / "wsj_0001.pos", pos)), **AP, paragraphs=False, vocab_from="stream", train=9, valid=1
    )
    assert words(corpus) == [PROPER, PROPER, ",", "<int>", "years", "old", ".", PROPER, PROPER, "is", END_OF_TEXT]
    assert corpus.counts["tagged_files"] == 1 and corpus.counts["proper_types"] == 3
    with pytest.raises(NplmError, match=r"wsj_0002.pos: 'plain' is not word/TAG"):
        prepare_text(str(write(tmp_path / "more" / "wsj_0002.pos", "a/DT plain text\n")), tags=True, train=1, valid=1)


def test_vocabulary_size_keeps_punctuation_and_marks(tmp_path: Path) -> None:
    text = "a a a a b b b c c ; d !\n\n" * 4
    corpus = prepare_text(str(write(tmp_path / "t.txt", text)), vocab_size=6, train=40, valid=10)
    # |V| = 6: <eop> <eot> ; ! always, <unk> last, one word left: the most frequent
    assert set(corpus.vocab) == {"a", ";", "!", END_OF_PARAGRAPH, END_OF_TEXT, UNK} and corpus.vocab[-1] == UNK
    assert corpus.counts["unk_types"] == 3 and corpus.counts["punctuation_types"] == 2
    with pytest.raises(NplmError, match=r"^data.vocab_size=4 is smaller than the 5 marks"):
        prepare_text(str(tmp_path / "t.txt"), vocab_size=4, train=40, valid=10)


def test_directory_and_zip_read_the_same_files_in_sorted_order(tmp_path: Path) -> None:
    write(tmp_path / "news" / "b.txt", "second text .\n")
    write(tmp_path / "news" / "a.txt", "first text .\n\nnew paragraph .\n")
    write(tmp_path / "news" / "sub" / "c.txt", "third .\n")
    write(tmp_path / "news" / ".hidden", "never read\n")
    with zipfile.ZipFile(tmp_path / "news.zip", "w") as archive:
        for name in ("sub/c.txt", "b.txt", "a.txt"):
            archive.write(tmp_path / "news" / name, f"news/{name}")
    folder = prepare_text(str(tmp_path / "news"), train=10, valid=2)
    packed = prepare_text(str(tmp_path / "news.zip"), train=10, valid=2)
    assert words(folder)[:5] == ["first", "text", ".", END_OF_PARAGRAPH, "new"]
    assert words(folder) == words(packed) and folder.fingerprint == packed.fingerprint
    assert folder.counts["files"] == 3 and words(folder).count(END_OF_TEXT) == 3 and "never" not in words(folder)
    assert packed.source == "news.zip"
    only = prepare_text(str(tmp_path / "news.zip"), members="news/sub/", train=2, valid=1)
    assert words(only) == ["third", ".", END_OF_PARAGRAPH, END_OF_TEXT] and only.source == "news.zip (news/sub/*)"


def test_undecodable_text_names_the_file_and_byte_offset(tmp_path: Path) -> None:
    write(tmp_path / "news" / "a.txt", "fine .\n")
    write(tmp_path / "news" / "b.txt", b"caf\xc3\xa9 ok \xe9t\xe9\n")
    with pytest.raises(NplmError, match=r"^news/b.txt is not utf-8 at byte 9; .*data.encoding") as error:
        prepare_text(str(tmp_path / "news"), train=1, valid=1)
    assert "\n" not in str(error.value)
    assert (
        "été"
        in words(prepare_text(str(tmp_path / "news"), encoding="latin-1", vocab_from="stream", train=1, valid=1))[-3]
    )


def test_invisible_characters_are_dropped_as_a_corpus_is_read(tmp_path: Path) -> None:
    """A zero-width joiner, a zero-width space, a soft hyphen, a BOM inside a file and a variation selector (U+FE0F)
    each read as a word type of its own, or cut a word: the corpus reads as it would without them, its fingerprint
    too."""
    invisible = "Fam\u00adily \U0001f468\u200d\U0001f469 met in a data\u200bbase \u2764\ufe0f .\n\ufeffThey met .\n"
    seen = "Family \U0001f468\U0001f469 met in a database \u2764 .\nThey met .\n"
    how = {"vocab_from": "stream", "train": 10, "valid": 2}
    for encoding in ("utf-8", "utf-16"):
        read = prepare_text(str(write(tmp_path / "a.txt", invisible.encode(encoding))), encoding=encoding, **how)
        plain = prepare_text(str(write(tmp_path / "b.txt", seen.encode(encoding))), encoding=encoding, **how)
        assert words(read) == words(plain) and read.fingerprint == plain.fingerprint
    assert words(read)[:8] == ["Family", "\U0001f468", "\U0001f469", "met", "in", "a", "database", "\u2764"]


@pytest.mark.parametrize(
    "encoding,raw,at",
    [
        ("utf-8", "café ok\x00 .\n".encode(), 8),  # "café ok": 8 bytes
        ("utf-16", "ab\x00 .\n".encode("utf-16"), 6),  # the byte-order mark and "ab": 6 bytes
    ],
)
def test_a_nul_in_text_names_the_file_and_byte_offset(encoding: str, raw: bytes, at: int, tmp_path: Path) -> None:
    """A NUL decodes without error and used to become a word type of its own ('\\x00')."""
    write(tmp_path / "news" / "a.txt", "fine .\n".encode(encoding))
    write(tmp_path / "news" / "b.txt", raw)
    with pytest.raises(NplmError) as error:
        prepare_text(str(tmp_path / "news"), encoding=encoding, train=1, valid=1)
    assert str(error.value) == (
        f"news/b.txt has a NUL character at byte {at}: not {encoding} text; fix the file or set data.encoding "
        "(e.g. utf-16)"
    )


@pytest.mark.parametrize("key", ["data.path", pytest.param("data.split.valid_path", marks=pytest.mark.slow)])
def test_a_missing_text_corpus_is_one_line_and_no_store(key: str, tmp_path: Path) -> None:
    """The corpus is read after the store is opened: a path that is not there used to leave an empty store."""
    paths = {"data.path": write(tmp_path / "t.txt", "a b c .\n"), "data.split.valid_path": tmp_path / "v.txt"}
    paths["data.split.test_path"] = paths["data.path"]
    paths[key] = tmp_path / "nowhere"
    split = ["data.split.train=null", "data.split.valid=null"]
    overrides = ["data=text", "experiment=kn3", *split, *(f"{k}={v}" for k, v in paths.items())]
    result = run_script("nplm-train", *overrides, f"tracking.uri=sqlite:///{tmp_path}/m.db", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"nplm-train: error: {key}={tmp_path}/nowhere: no such file or directory"
    ]
    assert not (tmp_path / "m.db").exists()


def test_split_defaults_to_the_papers_ap_proportions(tmp_path: Path) -> None:
    corpus = prepare_text(str(write(tmp_path / "t.txt", "one two three four five six seven .\n" * 2500)))
    total = len(corpus.ids)
    train, valid = (round(total * part / sum(AP_SPLIT)) for part in AP_SPLIT[:2])
    assert corpus.bounds == {"train": (0, train), "valid": (train, train + valid), "test": (train + valid, total)}
    assert corpus.size("valid") / corpus.size("train") == pytest.approx(963_138 / 13_994_528, rel=2e-3)


def test_split_by_separate_files(tmp_path: Path) -> None:
    train, valid, test = (
        write(tmp_path / f"{s}.txt", f"{s} words here .\n" * k) for s, k in (("tr", 5), ("va", 2), ("te", 1))
    )
    corpus = prepare_text(str(train), valid_path=str(valid), test_path=str(test), vocab_from="stream")
    assert [corpus.size(s) for s in ("train", "valid", "test")] == [22, 10, 6]  # + <eop> + <eot> each
    assert words(corpus, "valid")[0] == "va" and words(corpus, "test")[0] == "te"
    with pytest.raises(NplmError, match="give both, with data.split.train, valid and test null"):
        prepare_text(str(train), valid_path=str(valid), test_path=str(test), train=10, valid=2)


@pytest.mark.parametrize(
    "make,kwargs,message",
    [
        (None, {}, r"^data.path=.*nowhere: no such file or directory$"),
        ("\n\n  \n", {}, r"^data.path=.*: the corpus is empty \(no words in 1 file\)$"),
        ("a b c .\n", {"train": 4, "valid": 2}, r"^the corpus has 6 tokens, too few for the requested splits"),
        ("a b c .\n", {"train": 3}, r"^data.split.train and data.split.valid: give both"),
        ("a b c .\n", {"encoding": "klingon"}, r"^data.encoding='klingon' is not an encoding"),
        ("a b c .\n", {"members": "x/"}, r"no files whose name starts with data.members='x/'$"),
    ],
)
def test_bad_input_is_one_line_naming_the_key_or_file(
    make: str | None, kwargs: dict, message: str, tmp_path: Path
) -> None:
    path = write(tmp_path / "dir" / "t.txt", make).parent if make is not None else tmp_path / "nowhere"
    with pytest.raises(NplmError, match=message):
        prepare_text(str(path), **kwargs)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["data=ap"], r"^data.path=None is invalid: expected a UTF-8 text file"),
        (["data=text", "data.path=x", "data.tags=maybe"], r"^data.tags='maybe' is invalid"),
        (["data=ap", "data.path=x", "data.vocab_size=1"], r"^data.vocab_size=1 is invalid"),
        (["data=ap", "data.path=x", "data.lowercase=yes"], r"^data.lowercase='yes' is invalid"),
        (["data.corpus=wiki"], r"^data.corpus='wiki' is invalid: expected brown or text or ap"),
    ],
)
def test_config_rules_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(NplmError, match=message):
        check_config(composed(*overrides))


def test_ap_config_is_the_papers_setting() -> None:
    data = composed("data=ap", "data.path=x").data
    assert (data.corpus, data.vocab_size, data.numbers, data.proper_nouns, data.lowercase) == (
        "ap",
        17964,
        True,
        True,
        True,
    )
    assert data.split.train is None and data.vocab_from == "train"
    check_config(composed("data=ap", "data.path=x", "experiment=ap_mlp10"))


@pytest.fixture(scope="module")
def wsj(treebank: Path) -> dict[str, TextCorpus]:
    """The WSJ sample with the AP preprocessing: raw text (one file has two latin-1 bytes) and word/TAG."""
    return {
        "raw": prepare_text(
            str(treebank), "ap", "treebank/raw/wsj_", "latin-1", **AP, max_unk_freq=3, vocab_size=17964
        ),
        "tagged": prepare_text(
            str(treebank), "ap", "treebank/tagged/wsj_", paragraphs=False, **AP, max_unk_freq=3, vocab_size=17964
        ),
    }


def test_wsj_sample_raw_and_tagged(wsj: dict[str, TextCorpus]) -> None:
    raw, tagged = wsj["raw"], wsj["tagged"]
    assert raw.counts["files"] == tagged.counts["files"] == tagged.counts["tagged_files"] == 199
    assert raw.counts["tagged_files"] == 0
    assert tagged.counts["words"] == 94_200  # every word/TAG item of the .pos files
    assert tagged.counts["proper_tokens"] == 9_428 + 244  # NNP + NNPS
    assert words(tagged)[:9] == [PROPER, PROPER, ",", "<int>", "years", "old", ",", "will", "join"]
    assert words(raw)[:9] == [UNK, PROPER, ",", "<int>", "years", "old", ",", "will", "join"]
    # Pierre only starts a sentence (rare: <unk>); the heuristic finds most of what the tags call proper
    assert 0.6 < raw.counts["proper_tokens"] / tagged.counts["proper_tokens"] < 1.1
    for corpus in (raw, tagged):
        assert corpus.size("valid") / corpus.size("train") == pytest.approx(963_138 / 13_994_528, rel=1e-3)
        assert corpus.counts["year_tokens"] > 100 and corpus.counts["int_tokens"] > 1000
        assert all(w == w.lower() for w in corpus.vocab)


def test_brown_read_as_text_is_the_brown_stream(brown_path: Path, tmp_path: Path) -> None:
    """Brown's word/tag files through the text reader: the Brown reader's tokens, paragraphs and texts. Its words
    without their tags, as plain text: the same stream, each word cut by `tokenize` (quotes and abbreviations' dots
    apart). `data.tags=false` on the word/tag files reads them as plain text too: the tags become words."""
    names = ("brown/ca01", "brown/ca02", "brown/cb01")
    with zipfile.ZipFile(brown_path) as archive:
        for name in names:
            raw = archive.read(name)
            write(tmp_path / name, raw)
            untagged = (" ".join(i.rsplit("/", 1)[0] for i in line.split()) for line in raw.decode().splitlines())
            write(tmp_path / "plain" / name, "\n".join(untagged))
    tokens, counted, _ = read_brown(tmp_path / "brown")
    corpus = prepare_text(str(tmp_path / "brown"), max_unk_freq=0, vocab_from="stream", train=5000, valid=1000)
    assert words(corpus) == tokens and corpus.counts["tagged_files"] == 3
    assert (corpus.counts["paragraphs"], corpus.counts["words"]) == (counted["paragraphs"], counted["words"])
    proper = prepare_text(str(tmp_path / "brown"), proper_nouns=True, train=5000, valid=1000)
    assert words(proper)[:4] == ["The", PROPER, "County", "Grand"]  # The/at Fulton/np-tl County/nn-tl: tags decide

    plain = prepare_text(str(tmp_path / "plain" / "brown"), max_unk_freq=0, vocab_from="stream", train=5000, valid=1000)
    marks = (END_OF_PARAGRAPH, END_OF_TEXT)
    assert words(plain) == [t for w in tokens for t in ([w] if w in marks else tokenize(w))]
    assert plain.counts["tagged_files"] == 0 and plain.counts["paragraphs"] == counted["paragraphs"]
    assert sum(tokenize(w) == [w] for w in tokens if w not in marks) / counted["words"] > 0.95  # `` '' -- Sen. J.
    as_text = prepare_text(str(tmp_path / "brown"), tags=False, train=5000, valid=1000)
    assert words(as_text)[:7] == ["The", "/", "at", "Fulton", "/", "np-tl", "County"]
    assert as_text.counts["tagged_files"] == 0 and as_text.counts["paragraphs"] == counted["paragraphs"]
    assert words(as_text).count("/") >= counted["words"]  # every word/tag item cut at its slash


@pytest.mark.slow
def test_ap_table2_sweep_on_wsj_reports_our_rows_beside_the_papers(
    treebank: Path, wsj: dict[str, TextCorpus], tmp_path: Path
) -> None:
    """The README's one command for Table 2 (`nplm-train -m study=ap_table2`) on the WSJ sample, narrowed to
    MLP10 (a tiny MLP, Del. Int., then their mixture) and Kneser-Ney n=3: the jobs land in experiment `ap` with
    what was counted, and the sweep ends by writing reports/ap_table2.* with our numbers, the paper's beside them,
    and the corpus it ran on named."""
    uri, out = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "out"
    command = ["-m", "study=ap_table2"]
    command += [f"data.path={treebank}", "data.members=treebank/raw/wsj_", "data.encoding=latin-1"]
    command += ["experiment=ap_mlp,del_int,kn3,ap_mlp10", "trainer.max_epochs=1", "trainer.limit_train_batches=5"]
    command += [f"tracking.uri={uri}", f"report={out}"]
    result = run_script("nplm-train", *command, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["ap"])
    assert (runs["status"] == "FINISHED").all() and (runs["tags.sweep"] == "true").sum() == 1
    jobs = runs[runs["tags.row"].notna()].set_index("tags.row")
    assert sorted(jobs.index) == ["Del. Int.", "Kneser-Ney back-off", "MLP n=6 h=60 m=100", "MLP10"]
    corpus = wsj["raw"]
    assert (jobs["tags.data_fingerprint"] == corpus.fingerprint).all() and (jobs["tags.corpus"] == "ap").all()
    assert (jobs["tags.data_source"] == "treebank.zip (treebank/raw/wsj_*)").all()
    assert (jobs["tags.count.proper_tokens"] == str(corpus.counts["proper_tokens"])).all()
    assert (jobs["metrics.test_tokens"] == corpus.size("test")).all()

    assert {p.name for p in out.iterdir()} >= {f"ap_table2.{ext}" for ext in ("md", "tex", "csv", "html")}
    md = (out / "ap_table2.md").read_text()
    assert "our runs on corpus ap, read from treebank.zip (treebank/raw/wsj_*)" in md
    assert "the paper's numbers are on AP News 1995-96" in md
    header = [c.strip() for c in next(line for line in md.splitlines() if line.startswith("| row ")).split("|")]
    paper = {"MLP10": (104, 109), "Del. Int.": (126, 132), "Kneser-Ney back-off": (121, 127)}  # Table 2, p. 1150
    for row, (paper_valid, paper_test) in paper.items():
        line = next(
            line for line in md.splitlines() if re.match(rf"\| {row}( \(\+dirty\))? +\| +(6|3) \|", line)
        )  # +dirty: from this tree
        cells = [c.strip() for c in line.split("|")]
        ours = jobs.loc[row]
        for split, paper_ppl in (("valid", paper_valid), ("test", paper_test)):
            at = header.index(split)  # ours, its 95% interval over texts, the paper's
            low, high = map(float, cells[at + 1].split("-"))
            assert float(cells[at]) == round(ours[f"metrics.{split}_ppl"], 1) and cells[at + 2] == str(paper_ppl)
            assert low < ours[f"metrics.{split}_ppl"] < high
        assert 1 < ours["metrics.test_ppl"] < corpus.vocab_size
    assert "## Missing (no run)\n\n- Kneser-Ney back-off n=4\n- Kneser-Ney back-off n=5\n" in md


def test_an_empty_file_in_a_directory_corpus_is_read_as_an_empty_text(tmp_path: Path) -> None:
    """Counted as a file, and it adds only the end-of-text mark a text ends with: no error, no words."""
    write(tmp_path / "dir" / "a.txt", "the cat sat .\n\nthe dog ran .\n" * 10)
    without = prepare_text(str(tmp_path / "dir"), train=60, valid=10)
    write(tmp_path / "dir" / "b.txt", "")
    with_empty = prepare_text(str(tmp_path / "dir"), train=60, valid=10)
    assert (with_empty.count_tags()["count.files"], without.count_tags()["count.files"]) == ("2", "1")
    assert with_empty.count_tags()["count.words"] == without.count_tags()["count.words"]
    assert len(with_empty.ids) == len(without.ids) + 1 and with_empty.vocab == without.vocab
