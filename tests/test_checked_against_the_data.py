"""Values that only make sense against the data, or against one another, refused before the store is touched (issue
55): a Transformer window longer than the training split, a sampled learning rate whose weight decay would flip the
weights' sign, more word classes than the training split has words. Each was an exception from deep inside a run,
exit 1 or a FAILED run left in the store; now one line naming the keys, exit 2, no store. And `optim=sampled`'s
quarter of validation, less than one batch on a small split, validates on one batch instead of stopping Lightning.
Real Hydra composition, real commands on tests/data/tiny_brown.zip, real MLflow stores."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from helpers import composed, data_slice, run_script

from nplm_repro.errors import NplmError
from nplm_repro.tracking import ledger
from nplm_repro.tracking.config_checks import check_config

TINY = data_slice(7_000, 1_500, 1_500)  # of tiny_brown.zip's 10,973 tokens: 371 distinct words in training


def tiny(tiny_brown_path: Path, tmp_path: Path, *overrides: str) -> list[str]:
    """The job's overrides on the tiny corpus, one short epoch, its store in tmp_path."""
    store = f"tracking.uri=sqlite:///{tmp_path}/m.db"
    return [*overrides, f"data.path={tiny_brown_path}", *TINY, "trainer.max_epochs=1", store]


def refused(tmp_path: Path, args: list[str]) -> str:
    """nplm-train's one line for bad input (exit 2), with no store made; without its `nplm-train: error: `."""
    done = run_script("nplm-train", *args, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert not (tmp_path / "m.db").exists()
    return lines[0].removeprefix("nplm-train: error: ")


WINDOW = (
    "model.context=100000 is longer than the training split (data.split.train=7000): training reads windows of "
    "model.context tokens"
)


@pytest.mark.slow  # commands in subprocesses: about 7-10 s
def test_a_transformer_window_longer_than_the_training_split_is_refused(tiny_brown_path: Path, tmp_path: Path) -> None:
    """It was `ValueError: 7000 tokens cannot fill one window of 100000` once training started, and a FAILED run.
    A window of the whole split is one the data can fill."""
    assert refused(tmp_path, tiny(tiny_brown_path, tmp_path, "experiment=transformer", "model.context=100000")) == (
        WINDOW
    )
    check_config(composed("experiment=transformer", "model.context=7000", *TINY))


@pytest.mark.slow  # a sweep's start (about 6 s); the single run above is the default suite's
def test_a_sweep_refuses_a_transformer_window_longer_than_the_training_split_before_it_starts(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    args = tiny(tiny_brown_path, tmp_path, "experiment=transformer", "model.context=128,100000")
    line = refused(tmp_path, ["-m", "hydra/launcher=basic", *args])
    assert line == f"{WINDOW}, in 1 of 2 jobs: model.context=100000 (nothing was run)"


def test_a_stream_too_short_for_the_lstms_rows_is_refused_naming_the_batch() -> None:
    """The LSTM's training reads optim.batch_size parallel rows of the stream: `N tokens cannot fill R rows` is a
    batch larger than the training split, which the common rule refuses."""
    with pytest.raises(NplmError, match=r"^optim.batch_size=8000 is larger than the training split"):
        check_config(composed("experiment=lstm", "optim.batch_size=8000", *TINY))


@pytest.mark.slow  # commands in subprocesses: about 7-10 s
def test_a_sampled_rate_whose_decay_would_flip_the_weights_is_refused(tiny_brown_path: Path, tmp_path: Path) -> None:
    """SparseSGD decays a weight by 1 - lr x batch_size x weight_decay a step and keeps the log of it: at lr=1e6
    that was `ValueError: math domain error`. The bound is the step's, so a rate just under it is taken."""
    line = refused(tmp_path, tiny(tiny_brown_path, tmp_path, "experiment=mlp9", "optim=sampled", "optim.lr=1e6"))
    assert line == (
        "optim.lr=1000000.0 x optim.batch_size=256 x optim.weight_decay=0.0001 = 2.56e+04: sampled training decays "
        "the weights by 1 - that product a step, so it must be < 1 (optim.lr < 39.06 here)"
    )
    check_config(composed("experiment=mlp9", "optim=sampled", "optim.lr=39"))
    with pytest.raises(NplmError, match=r"^optim.lr=39.0625 x optim.batch_size=256 x optim.weight_decay=0.0001 = 1: "):
        check_config(composed("experiment=mlp9", "optim=sampled", "optim.lr=39.0625"))
    check_config(composed("experiment=mlp9", "optim=sampled", "optim.lr=1e6", "optim.weight_decay=0"))
    check_config(composed("experiment=mlp9", "optim=fast", "optim.lr=1e6"))  # eager SGD keeps no log of it


def test_sampled_training_on_a_validation_split_of_two_batches_validates_on_one(
    tiny_brown_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`optim=sampled` watches a quarter of validation's batches (trainer.limit_val_batches=0.25): a quarter of
    1,500 tokens in batches of 1,024 is less than one batch, where Lightning stopped with `0.25 * 2 < 1` and left a
    FAILED run. It validates on one batch; the run's valid and test perplexities are every token's, as always."""
    monkeypatch.chdir(tmp_path)  # MLflow keeps artifacts under ./mlruns
    args = tiny(tiny_brown_path, tmp_path, "experiment=mlp9", "optim=sampled", "optim.samples=50")
    cfg = composed(*args, "trainer.limit_train_batches=3", f"callbacks.model_checkpoint.dirpath={tmp_path}/c")
    run_id, metrics = ledger.run(cfg)
    run = mlflow.MlflowClient(cfg.tracking.uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["trainer.limit_val_batches"] == "0.25"
    assert "valid_ppl_epoch" in run.data.metrics and (metrics["valid_tokens"], metrics["test_tokens"]) == (1500, 1500)


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (
            ["experiment=mlp5", "model.output=classes", "model.classes=100000"],
            (
                "model.classes=100000 is more classes than the training split has distinct words (371): "
                "expected an integer from 2 to 371"
            ),
        ),
        (
            ["experiment=class_n3_c150", "model.c=100000"],
            (
                "model.c=100000 is more classes than the training split has distinct words (371): "
                "expected an integer from 1 to 371"
            ),
        ),
    ],
)
def test_more_classes_than_training_words_is_refused_naming_the_key_before_the_store(
    overrides: list[str], error: str, tiny_brown_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The output layer's `model.classes=100000` said `model.c=100000 ... c must be in 1..371` (the back-off's key,
    and a range that contradicts model.classes >= 2), both after a run was opened, which was left FAILED. The words
    are counted once the corpus is read, before the store is opened."""
    monkeypatch.chdir(tmp_path)
    checkpoints = f"callbacks.model_checkpoint.dirpath={tmp_path}/c"
    with pytest.raises(NplmError) as refusal:
        ledger.run(composed(*tiny(tiny_brown_path, tmp_path, *overrides), checkpoints))
    assert str(refusal.value) == error
    assert not (tmp_path / "m.db").exists()


@pytest.mark.slow  # a start of nplm-train (about 6 s): the test above checks the same refusal in this process
def test_the_output_layers_classes_are_refused_in_one_line_by_the_command(
    tiny_brown_path: Path, tmp_path: Path
) -> None:
    args = tiny(tiny_brown_path, tmp_path, "experiment=mlp5", "model.output=classes", "model.classes=100000")
    assert refused(tmp_path, args).startswith("model.classes=100000 is more classes than the training split has")


@pytest.mark.parametrize(
    ("override", "key"),
    [("model.c=0", "model.c"), ("model.max_passes=-1", "model.max_passes"), ("model.method=x", "model.method")],
)
def test_the_class_based_back_offs_values_are_checked_with_the_config(override: str, key: str) -> None:
    """`model.c=0` was an InstantiationException (exit 1) once the store was open."""
    with pytest.raises(NplmError, match=rf"^{key}="):
        check_config(composed("experiment=class_n3_c150", override))
