"""Every token's score, kept by every run, and `nplm-score`: real runs on a slice of Brown in a real store."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from helpers import SLICE, Done, composed, run_script, slice_texts
from mlflow.tracking import MlflowClient

from nplm_repro.score import Tally, per_token_file
from nplm_repro.scores import ARTIFACT
from nplm_repro.serving.scoring import RunScorer
from nplm_repro.storage.kept import kept_scores
from nplm_repro.tracking import ledger

TINY = ["trainer.max_epochs=2", "trainer.limit_train_batches=5", "seed=3"]
ROWS = {"kn3": "Kneser-Ney back-off", "mlp5": "MLP5", "del_int": "Del. Int.", "mlp6": "MLP6"}


@pytest.fixture(scope="module")
def store(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, str]]:
    """kn3, MLP5 (two short epochs), Del. Int. and MLP6 mixing the two, on 28k tokens of Brown (its texts ca01..ca13 in
    a folder); and MLP1 stopped after 3 steps, before its first validation (so without weights), with MLP2 mixing it
    and Del. Int. Returns the folder, the store and each row's run id."""
    workdir = tmp_path_factory.mktemp("scores")
    uri = f"sqlite:///{workdir}/mlflow.db"
    slice_texts(brown_path, workdir)
    common = [f"data.path={workdir / 'brown'}", *SLICE, *TINY, f"tracking.uri={uri}"]
    common.append(f"callbacks.model_checkpoint.dirpath={workdir}/c")
    stopped = {"mlp1": ["model.h=16", "model.m=16", "trainer.max_steps=3"]}
    ids = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)  # MLflow keeps artifacts under ./mlruns
        for row in (*ROWS, "mlp1", "mlp2"):
            ids[row] = ledger.run(composed(f"experiment={row}", *common, *stopped.get(row, [])))[0]
    return workdir, uri, ids


def scores_file(uri: str, run_id: str) -> Path:
    """Where the store keeps a run's kept scores (a local artifact root)."""
    return Path(mlflow.MlflowClient(uri).get_run(run_id).info.artifact_uri.removeprefix("file://")) / ARTIFACT


@pytest.mark.slow  # over 10 s
@pytest.mark.parametrize("row", list(ROWS))
def test_kept_scores_give_the_logged_perplexities(store: tuple[Path, str, dict[str, str]], row: str) -> None:
    """exp(-mean ln P) of the kept scores is the run's valid_ppl and test_ppl (MLP, n-gram and mixed runs alike),
    and each token carries the Brown text it belongs to."""
    _, uri, ids = store
    client = MlflowClient(uri)
    kept = kept_scores(client, ids[row])
    metrics = client.get_run(ids[row]).data.metrics
    for split in ("valid", "test"):
        assert kept.splits[split].perplexity() == pytest.approx(metrics[f"{split}_ppl"], rel=1e-6)
        assert kept.splits[split].tokens == metrics[f"{split}_tokens"] == 4_000
        assert kept.splits[split].logprob.dtype == np.float32
    assert kept.texts[:2] == ("ca01", "ca02")
    assert [kept.texts[t] for t in np.unique(kept.splits["test"].text)] == ["ca11", "ca12", "ca13"]


def test_a_mixed_row_reads_its_mlps_kept_scores_and_loads_no_checkpoint(
    store: tuple[Path, str, dict[str, str]],
) -> None:
    _, uri, ids = store
    run = MlflowClient(uri).get_run(ids["mlp6"])
    assert run.data.tags["base_run_id"] == f"{ids['mlp5']},{ids['del_int']}"
    mlp = kept_scores(MlflowClient(uri), ids["mlp5"])
    assert run.data.metrics["component_1_test_ppl"] == pytest.approx(mlp.splits["test"].perplexity(), rel=1e-12)


@pytest.mark.parametrize("row", list(ROWS))
def test_scoring_a_run_again_reproduces_its_logged_perplexities(
    store: tuple[Path, str, dict[str, str]], row: str
) -> None:
    _, uri, ids = store
    scorer = RunScorer(uri, ids[row])
    metrics = scorer.run.data.metrics
    for split in ("valid", "test"):
        logprob = scorer.logprob(scorer.split(split))
        assert np.exp(-np.mean(logprob, dtype=np.float64)) == pytest.approx(metrics[f"{split}_ppl"], rel=1e-6)


@pytest.mark.parametrize(("row", "reach"), [("kn3", 2), ("mlp5", 4), ("del_int", 2), ("mlp6", 4)])
def test_a_long_text_is_scored_in_parts_each_token_as_in_the_whole_text(
    store: tuple[Path, str, dict[str, str]], tmp_path: Path, row: str, reach: int
) -> None:
    """A text longer than a part (`RunScorer.text`'s `part` tokens: a million for nplm-score) is scored a part at a
    time, each with the `reach` tokens before it that its family's scores read (eq. (1)'s n - 1, an n-gram's, the
    farthest of a mixture's parts): every score, count and per-token row is the whole text's, and the memory a 50 MB
    text takes no longer holds every token's arrays at once (docs/performance.md)."""
    _, uri, ids = store
    text = tmp_path / "long.txt"
    paragraphs = "The jury said the Zorblax election was held.\n\nIt said that Fulton County had no trouble.\n\n"
    text.write_text(paragraphs * 12)
    scorer = RunScorer(uri, ids[row])
    assert scorer.reach() == reach
    whole, parts = (list(scorer.text(text, part=part)) for part in (10**9, 23))
    assert len(whole) == 1 and len(parts) == -(-whole[0].size // 23)
    said, written = [], []
    for how in (whole, parts):
        tally, path = Tally(), tmp_path / f"{len(how)}.tsv"
        with per_token_file(path) as write:
            for tokens in how:
                logprob = scorer.logprob(tokens)
                tally.add(tokens, logprob)
                write(tokens, logprob)
        said.append(tally.summary(scorer))
        written.append(path.read_text())
    # 24 paragraphs of 9 words, each with its <eop>, then <eot>; "Zorblax" is outside the vocabulary
    assert said[0] == said[1] and "text long.txt: 241 tokens, 12 <unk> (4.98%), 1 text" in said[0]
    assert written[0] == written[1] and len(written[0].splitlines()) == 1 + 241


@pytest.mark.slow  # over 10 s
def test_nplm_score_prints_what_was_counted_and_writes_every_tokens_score(
    store: tuple[Path, str, dict[str, str]], tmp_path: Path
) -> None:
    workdir, uri, ids = store
    per_token = tmp_path / "test.tsv"
    done = run_script("nplm-score", ids["mlp5"], "--tracking-uri", uri, "--per-token", str(per_token), cwd=workdir)
    assert done.returncode == 0, done.stderr
    line = done.stdout.split("\n")[0]  # then the same without <unk>
    ppl = MlflowClient(uri).get_run(ids["mlp5"]).data.metrics["test_ppl"]
    assert line.startswith(f"run {ids['mlp5'][:12]} (MLP5 seed=3), split test: 4,000 tokens, ")
    assert line.endswith(f", 3 texts, logprob {-np.log(ppl) * 4000:,.2f} (ln), ppl {ppl:.3f}")
    rows = list(csv.DictReader(per_token.open(), delimiter="\t"))
    assert len(rows) == 4000 and {r["text"] for r in rows} == {"ca11", "ca12", "ca13"}
    assert np.exp(-np.mean([float(r["logprob"]) for r in rows])) == pytest.approx(ppl, rel=1e-5)


def test_nplm_score_reads_a_users_text_with_the_runs_reader_and_counts_unknown_words(
    store: tuple[Path, str, dict[str, str]], tmp_path: Path, score: Callable[..., Done]
) -> None:
    workdir, uri, ids = store
    text = tmp_path / "mine.txt"
    text.write_text("The jury said it was the .\n\nZorblax qwimbly said it .\n")
    for row in ROWS:
        done = score(workdir, ids[row], "--tracking-uri", uri, "--text", str(text))
        assert done.returncode == 0, done.stderr
        # 7 + 5 words, <eop> after each paragraph, <eot> at the end; the two made-up words are <unk>
        assert "text mine.txt: 15 tokens, 2 <unk> (13.33%), 1 text, logprob -" in done.stdout


def test_log_attaches_kept_scores_to_a_run_made_before_runs_kept_them(
    store: tuple[Path, str, dict[str, str]], score: Callable[..., Done]
) -> None:
    workdir, uri, ids = store
    client = MlflowClient(uri)
    before = client.get_run(ids["kn3"]).data.metrics
    kept = kept_scores(client, ids["kn3"])
    scores_file(uri, ids["kn3"]).unlink()  # as a run of before this change has none
    assert kept_scores(client, ids["kn3"]) is None
    done = score(workdir, ids["kn3"], "--tracking-uri", uri, "--log")
    assert done.returncode == 0, done.stderr
    assert "kept scores attached (valid " in done.stdout
    again = kept_scores(client, ids["kn3"])
    np.testing.assert_array_equal(again.splits["test"].logprob, kept.splits["test"].logprob)
    assert client.get_run(ids["kn3"]).data.metrics == before  # the run's numbers unchanged
    done = score(workdir, ids["kn3"], "--tracking-uri", uri, "--log")
    assert done.returncode == 0 and "already keeps its scores: nothing to do" in done.stdout


def test_a_mixed_row_mixes_an_mlp_stopped_before_its_first_validation_which_cannot_be_scored_again(
    store: tuple[Path, str, dict[str, str]], score: Callable[..., Done]
) -> None:
    """Such an MLP has no best.ckpt: it was scored with its last weights, and its kept scores are what MLP2 mixes.
    Once its kept scores are gone it cannot be scored again, and nplm-score says why in one line."""
    workdir, uri, ids = store
    client = MlflowClient(uri)
    base = client.get_run(ids["mlp2"]).data.tags["base_run_id"].split(",")[0]
    assert base == ids["mlp1"]
    assert "checkpoints" not in {f.path for f in client.list_artifacts(base)}
    mixed = client.get_run(ids["mlp2"]).data.metrics["component_1_test_ppl"]
    assert mixed == pytest.approx(client.get_run(base).data.metrics["test_ppl"], rel=1e-6)
    scores_file(uri, base).unlink()
    done = score(workdir, base, "--tracking-uri", uri, "--log")
    assert done.returncode == 2 and "has no weights, neither a Model nor checkpoints/best.ckpt" in done.stderr, (
        done.stderr
    )


def test_bad_input_is_one_line_and_exit_2(
    store: tuple[Path, str, dict[str, str]], tmp_path: Path, score: Callable[..., Done]
) -> None:
    workdir, uri, ids = store
    client = MlflowClient(uri)
    running = client.create_run(client.get_run(ids["kn3"]).info.experiment_id, tags={"data_fingerprint": "x"})
    foreign = client.create_run(client.get_run(ids["kn3"]).info.experiment_id).info.run_id
    cases = {
        "0" * 32: f"no run {'0' * 32} in the store",
        running.info.run_id: "is RUNNING, not FINISHED",
        foreign: "is not an nplm-repro run",
    }
    for run_id, words in cases.items():
        done = score(workdir, run_id, "--tracking-uri", uri)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    done = score(workdir, ids["kn3"], "--tracking-uri", uri, "--text", str(tmp_path / "absent.txt"))
    assert done.returncode == 2 and "absent.txt: cannot read" in done.stderr and done.stderr.count("\n") == 1
    done = score(workdir, ids["kn3"], "--tracking-uri", f"sqlite:///{tmp_path}/none.db")
    assert done.returncode == 2 and "no tracking store at" in done.stderr
    assert not (tmp_path / "none.db").exists()


def test_generate_continues_a_prompt_the_same_for_a_seed(
    store: tuple[Path, str, dict[str, str]], ask: Callable[..., Done]
) -> None:
    workdir, uri, ids = store
    args = ["generate", ids["mlp5"], "--tracking-uri", uri, "--prompt", "The jury said", "--words", "12"]
    first, again, other = (ask(workdir, *args, "--draw-seed", seed) for seed in ("1", "1", "2"))
    assert first.returncode == 0, first.stderr
    head, text = first.stdout.strip().split("\n")
    assert head.endswith("12 words, temperature 1, draw seed 1:") and text.startswith("The jury said | ")
    assert len(text.split(" | ")[1].split()) == 12
    assert again.stdout == first.stdout and other.stdout != first.stdout
    greedy = ask(workdir, *args, "--temperature", "0", "--no-unk")
    assert "most probable words" in greedy.stdout and "<unk>" not in greedy.stdout.split(" | ")[1]
    by_row = ask(workdir, "generate", "--row", "MLP5", "--study", "", "--tracking-uri", uri)
    assert by_row.returncode == 2  # --study names a study: the empty one is refused


def test_neighbours_are_the_nearest_rows_of_c_by_centred_cosine(
    store: tuple[Path, str, dict[str, str]], ask: Callable[..., Done]
) -> None:
    workdir, uri, ids = store
    done = ask(workdir, "neighbours", ids["mlp5"], "the", "of", "--k", "3", "--tracking-uri", uri)
    assert done.returncode == 0, done.stderr
    head, the, of = done.stdout.strip().split("\n")
    assert head.endswith("3 nearest words by centred cosine similarity of the word features:")
    module = RunScorer(uri, ids["mlp5"]).model()
    vocab = RunScorer(uri, ids["mlp5"]).corpus.vocab
    C = module.model.C.detach()
    unit = torch.nn.functional.normalize(C - C.mean(dim=0), dim=1)  # centred: the rows' mean direction removed
    similarity = unit @ unit[vocab.index("the")]
    similarity[vocab.index("the")] = -1
    best = [vocab[i] for i in similarity.topk(3).indices.tolist()]
    assert [item.rsplit(" ", 1)[0] for item in the.removeprefix("the: ").split(", ")] == best
    assert of.startswith("of: ")


def test_ask_refuses_unknown_words_runs_and_n_grams_in_one_line(
    store: tuple[Path, str, dict[str, str]], ask: Callable[..., Done]
) -> None:
    workdir, uri, ids = store
    cases = {
        ("neighbours", ids["mlp5"], "thw"): "'thw' is not in the run's vocabulary",
        ("generate", ids["mlp5"], "--prompt", "The jurry"): "'jurry' is not in the run's vocabulary",
        ("neighbours", ids["kn3"], "the"): "is a counted run: generate and neighbours ask a trained model",
        ("neighbours", "0" * 32, "the"): f"no run {'0' * 32} in the store",
        ("neighbours", ids["mlp5"]): "name at least one word",
    }
    for args, words in cases.items():
        done = ask(workdir, *args, "--tracking-uri", uri)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert "the" in ask(workdir, "neighbours", ids["mlp5"], "thw", "--tracking-uri", uri).stderr.split("closest: ")[1]
