"""What `nplm-score`, `nplm-ask` and a run's MLflow Model are given: a user's plain text read as Brown is cut, what
was counted printed as SRILM prints it, and bad input (no text, a run id that is none, a --per-token file that
cannot be written) refused in one line before any work. A real short MLP run on a slice of Brown, in a real store."""

from __future__ import annotations

import codecs
import csv
import math
from collections.abc import Callable
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from helpers import SLICE, Done, composed, slice_texts
from mlflow.exceptions import MlflowException

from nplm_repro.tracking import ledger

Run = tuple[Path, str, str]  # the folder, the store and the run id


@pytest.fixture(scope="module")
def mlp(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One short MLP5 run (a validation, so a Model) on 28k tokens of Brown, its texts ca01..ca13 in a folder."""
    workdir = tmp_path_factory.mktemp("score_input")
    uri = f"sqlite:///{workdir}/mlflow.db"
    slice_texts(brown_path, workdir)
    overrides = [f"data.path={workdir / 'brown'}", *SLICE, "trainer.max_epochs=1", "trainer.limit_train_batches=5"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)  # MLflow keeps artifacts under ./mlruns
        checkpoints = f"callbacks.model_checkpoint.dirpath={workdir}/c"
        cfg = composed("experiment=mlp5", *overrides, f"tracking.uri={uri}", checkpoints)
        run_id, _ = ledger.run(cfg)
    return workdir, uri, run_id


def test_a_plain_text_is_cut_as_brown_is_and_what_was_counted_is_printed(
    mlp: Run, tmp_path: Path, score: Callable[..., Done]
) -> None:
    workdir, uri, run_id = mlp
    text = tmp_path / "plain.txt"
    text.write_text('The jury said, "Zorblax\'s election was held."\n\nZorblax, the jury said.\n')
    per_token = tmp_path / "plain.tsv"
    done = score(workdir, run_id, "--tracking-uri", uri, "--text", str(text), "--per-token", str(per_token))
    assert done.returncode == 0, done.stderr
    first, without, unknown = done.stdout.strip().split("\n")
    rows = list(csv.DictReader(per_token.open(), delimiter="\t"))
    # The jury said , `` Zorblax's election was fine '' . <eop> Zorblax , the jury said . <eop> <eot>
    assert [r["token"] for r in rows][:5] == ["The", "jury", "said", ",", "``"] and len(rows) == 20
    assert [r["token"] for r in rows][-4:] == ["said", ".", "<eop>", "<eot>"]
    assert "text plain.txt: 20 tokens, 2 <unk> (10.00%), 1 text, logprob -" in first
    known = [float(r["logprob"]) for r in rows if r["token"] != "<unk>"]
    assert without.startswith(f"without <unk>: 18 tokens, logprob {sum(known):,.2f} (ln), ")
    assert without.endswith(f"ppl {math.exp(-sum(known) / 18):.3f}")
    assert unknown == "<unk> words, the 2 most frequent of 2: Zorblax's 1, Zorblax 1"


def test_invisible_characters_in_a_text_are_no_tokens(mlp: Run, tmp_path: Path, score: Callable[..., Done]) -> None:
    """Zero-width joiners inside an emoji family, an emoji's presentation selector (U+FE0F), a zero-width space and a
    soft hyphen inside a word, a BOM: each was a token of its own, `<unk>`, or cut a word in two."""
    workdir, uri, run_id = mlp
    text = tmp_path / "emoji.txt"
    text.write_text(
        "\ufeffThe jury \U0001f468\u200d\U0001f469\u200d\U0001f467 said \u2764\ufe0f\u2764\ufe0f, in\u200bto "
        "the elec\u00adtion.\n"
    )
    per_token = tmp_path / "emoji.tsv"
    done = score(workdir, run_id, "--tracking-uri", uri, "--text", str(text), "--per-token", str(per_token))
    assert done.returncode == 0, done.stderr
    tokens = [r["token"] for r in csv.DictReader(per_token.open(), delimiter="\t")]
    assert tokens == "The jury <unk> <unk> <unk> said <unk> <unk> , into the election . <eop> <eot>".split()
    assert "text emoji.txt: 15 tokens, 5 <unk> (33.33%)" in done.stdout
    unknown = "<unk> words, the 4 most frequent of 4: \u2764 2, \U0001f468 1, \U0001f469 1, \U0001f467 1"
    assert done.stdout.strip().split("\n")[-1] == unknown


def test_tokens_and_brown_files_are_read_as_they_are(mlp: Run, tmp_path: Path, score: Callable[..., Done]) -> None:
    workdir, uri, run_id = mlp
    tokens, tagged = tmp_path / "tokens.txt", tmp_path / "tagged.txt"
    tokens.write_text("The jury said, it .\n")
    tagged.write_text("The/at jury/nn said/vbd ,/, it/pps ./.\n")
    done = score(workdir, run_id, "--tracking-uri", uri, "--text", str(tokens), "--tokenized")
    assert done.returncode == 0 and "7 tokens, 1 <unk> (14.29%)" in done.stdout, done.stderr
    assert done.stdout.strip().endswith(": said, 1")
    done = score(workdir, run_id, "--tracking-uri", uri, "--text", str(tagged))
    assert done.returncode == 0 and "8 tokens, 0 <unk> (0.00%)" in done.stdout, done.stderr
    assert len(done.stdout.strip().split("\n")) == 2  # no word outside the vocabulary to list


def test_a_text_with_no_words_or_no_text_is_refused(mlp: Run, tmp_path: Path, score: Callable[..., Done]) -> None:
    workdir, uri, run_id = mlp
    cases = {
        b"": "no words in it",
        b" \n\n\t\n": "no words in it",
        b"\x00\x00\x00": "has a NUL byte at byte 0: binary data, not text, or UTF-16 text with no byte-order mark",
        "The jury".encode("utf-16-le"): "has a NUL byte at byte 1: binary data, not text, or UTF-16 text with no byte",
        b"The jury \xff\xfe said": "not utf-8 text at byte 9 and it has no byte-order mark: give its encoding (",
    }
    for i, (raw, words) in enumerate(cases.items()):
        path = tmp_path / f"{i}.txt"
        path.write_bytes(raw)
        for how in ((), ("--tokenized",)):
            done = score(workdir, run_id, "--tracking-uri", uri, "--text", str(path), *how)
            assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
            assert f"--text {path}" in done.stderr and words in done.stderr, done.stderr


def test_a_text_in_utf16_or_with_a_bom_or_in_the_encoding_given_scores_as_its_utf8(
    mlp: Run, tmp_path: Path, score: Callable[..., Done]
) -> None:
    """A UTF-16 file (Notepad's "Unicode") was "not utf-8 text (byte 0): a binary file?"; a byte-order mark names
    its encoding, and --encoding any other."""
    workdir, uri, run_id = mlp
    words = "The jury said, \u201cthe caf\u00e9 was closed.\u201d\n"
    files = {"utf-8": (words.encode(), ()), "utf-16": (words.encode("utf-16"), ())}
    files["utf-8-sig"] = (words.encode("utf-8-sig"), ())
    files["utf-16-be"] = (codecs.BOM_UTF16_BE + words.encode("utf-16-be"), ())
    files["cp1252"] = (words.encode("cp1252"), ("--encoding", "cp1252"))
    printed = {}
    for name, (raw, how) in files.items():
        path = tmp_path / f"{name}.txt"
        path.write_bytes(raw)
        done = score(workdir, run_id, "--tracking-uri", uri, "--text", str(path), *how)
        assert done.returncode == 0, done.stderr
        printed[name] = done.stdout.replace(path.name, "text.txt")
    assert all(text == printed["utf-8"] for text in printed.values()), printed
    assert "text text.txt: 13 tokens, 2 <unk> " in printed["utf-8"] and ": café 1, closed 1" in printed["utf-8"]
    done = score(workdir, run_id, "--tracking-uri", uri, "--text", str(tmp_path / "cp1252.txt"))
    assert done.returncode == 2 and "not utf-8 text at byte 15 and it has no byte-order mark" in done.stderr


def test_a_prompt_and_a_models_context_are_cut_as_brown_is(mlp: Run, ask: Callable[..., Done]) -> None:
    workdir, uri, run_id = mlp
    done = ask(workdir, "generate", run_id, "--tracking-uri", uri, "--prompt", 'The jury said, "it', "--words", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[1].startswith("The jury said , `` it | ")
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    brown = ["The", "jury", "said", ",", "``", "it's", "Mr.", "Smith's", "''", "."]
    assert model.unwrap_python_model().tokens("The jury said, \"it's Mr. Smith's.\"") == brown
    with pytest.raises(MlflowException, match="NUL byte") as raised:
        model.predict(pd.DataFrame({"context": ["the jury said \x00 that"]}))
    assert raised.value.error_code == "INVALID_PARAMETER_VALUE"


def test_what_cannot_be_done_is_refused_before_any_work(tmp_path: Path, score: Callable[..., Done]) -> None:
    """A run id that is none, and a --per-token file that cannot be written, are refused before the store is opened
    (here it does not exist: that would be the error otherwise) and before any scoring."""
    none = f"sqlite:///{tmp_path}/none.db"
    run_id = "0123456789abcdef" * 2
    cases = {
        ("../../etc/passwd",): "'../../etc/passwd' is not a run id: MLflow's run ids are 32 lowercase hex digits",
        (run_id[:12],): f"'{run_id[:12]}' is not a run id",
        (run_id.upper(),): "is not a run id",
        (run_id, "--per-token", "/proc/x.tsv"): "--per-token /proc/x.tsv: cannot write in /proc (",
        (run_id, "--tokenized"): "--tokenized says how --text is read: give --text",
        (run_id, "--encoding", "utf-16"): "--encoding says how --text is read: give --text",
        (run_id, "--encoding", "klingon", "--text", "x.txt"): "--encoding klingon: not an encoding Python knows (",
    }
    for args, words in cases.items():
        done = score(tmp_path, *args, "--tracking-uri", none)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # no store made, nothing written
    assert "no tracking store at" in score(tmp_path, run_id, "--tracking-uri", none).stderr
