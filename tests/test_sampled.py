"""Sampled training: the estimator against the exact gradient, the proposals, the sparse update, and a real run."""

from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch
from helpers import composed, data_slice, run_script
from torch.nn import functional as F

from nplm_repro.errors import NplmError
from nplm_repro.models.nplm import NPLM
from nplm_repro.models.sampled_loss import (
    Proposal,
    SparseSGD,
    dense_rows,
    draw,
    layer_outputs,
    sampled_cross_entropy,
    sparse_rows,
)
from nplm_repro.tracking.config_checks import check_config
from nplm_repro.tracking.keys import config_key, model_key


def _gradients(model: NPLM, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.to_dense().flatten() for p in model.parameters()])


def mean_sampled_gradient_error(samples: int, draws: int, estimator: str = "importance") -> float:
    """|mean over `draws` of the sampled gradient - exact gradient| / |exact gradient|, float64, V = 60."""
    torch.manual_seed(0)
    model = NPLM(vocab_size=60, n=3, m=4, h=8, direct=True).double()
    context, target = torch.randint(0, 60, (32, 2)), torch.randint(0, 60, (32,))
    exact = _gradients(model, F.cross_entropy(model(context), target))
    q = torch.distributions.Dirichlet(torch.ones(60)).sample().double() * 0.5 + 0.5 / 60  # far from P
    total = torch.zeros_like(exact)
    for _ in range(draws):
        terms = model.output_terms(context, sparse_rows)
        total += _gradients(
            model,
            sampled_cross_entropy(layer_outputs(terms, model.b, target), target, q, draw(q, samples), estimator),
        )
    return float((total / draws - exact).norm() / exact.norm())


@pytest.mark.parametrize("estimator", ["importance", pytest.param("sampled_softmax", marks=pytest.mark.slow)])
def test_sampled_gradient_approaches_the_exact_one_as_k_grows(estimator: str) -> None:
    """Self-normalised importance sampling is biased by O(1/k): the mean over many draws closes on the exact
    gradient as k grows (measured 0.28, 0.066, 0.018 for importance at k = 4, 32, 512; 0.32, 0.071, 0.020 for
    the sampled softmax)."""
    errors = [mean_sampled_gradient_error(k, draws=100, estimator=estimator) for k in (4, 32, 512)]
    assert errors[0] > 2 * errors[1] > 4 * errors[2]
    assert errors[2] < 0.04


def test_unigram_proposal_is_the_training_frequencies() -> None:
    target = torch.tensor([0, 0, 0, 1, 2, 2])
    q = Proposal(torch.zeros_like(target), target, vocab_size=4).distribution(torch.tensor([0]))
    torch.testing.assert_close(q, torch.tensor([4.0, 2.0, 3.0, 1.0]) / 10)  # add-one: word 3 can be drawn


def test_bigram_proposal_is_the_batch_mean_of_interpolated_bigrams() -> None:
    previous, target = torch.tensor([0, 0, 1, 2, 0]), torch.tensor([1, 2, 2, 0, 1])
    proposal = Proposal(previous, target, vocab_size=4, kind="bigram")
    unigram = torch.tensor([2.0, 3.0, 3.0, 1.0]) / 9
    after_0, after_3 = torch.tensor([0, 2 / 3, 1 / 3, 0]), unigram  # word 3 never precedes: its rows are unigram
    q = proposal.distribution(torch.tensor([0, 3, 0, 0]))
    expected = 0.75 * (0.1 * unigram + 0.9 * after_0) + 0.25 * after_3
    torch.testing.assert_close(q, expected)
    assert q.sum().item() == pytest.approx(1.0)


def test_sparse_sgd_takes_the_same_step_as_sgd() -> None:
    torch.manual_seed(0)
    dense, sparse = (NPLM(vocab_size=40, n=3, m=4, h=5, direct=True) for _ in range(2))
    sparse.load_state_dict(dense.state_dict())
    context, target = torch.randint(0, 40, (16, 2)), torch.randint(0, 40, (16,))
    q, steps = torch.full((40,), 1 / 40), []
    for model, sparse_grads, make in ((dense, False, torch.optim.SGD), (sparse, True, SparseSGD)):
        groups = [{"params": model.decayed(), "weight_decay": 0.1}, {"params": model.biases(), "weight_decay": 0.0}]
        optimizer = make(groups, lr=0.5)
        rows = optimizer.rows if sparse_grads else dense_rows
        torch.manual_seed(1)  # the same draws
        terms = model.output_terms(context, rows)
        sampled_cross_entropy(layer_outputs(terms, model.b, target, rows), target, q, draw(q, 8)).backward()
        for p in model.parameters():  # the reference: torch's SGD on the same gradient, dense
            p.grad = p.grad if sparse_grads else p.grad.to_dense()
        optimizer.step()
        steps.append(model.state_dict())
    for name, value in steps[0].items():
        torch.testing.assert_close(steps[1][name], value, msg=name)


def test_lazy_decay_gives_the_weights_of_eager_decay_through_a_learning_rate_drop() -> None:
    """SparseSGD keeps its lazy weights (C, U, W) as p / s, a step decaying s alone, and settles them before they
    are read whole: after 300 sampled steps, each reading its rows through `rows`, the learning rate cut to a fifth
    at step 150 as a plateau does, the weights are eager decay's to float32 rounding. Unsettled, the kept weights
    are 1 / s times the true ones (s = 1e-3 after 300 steps at lr 0.9, decay 0.1)."""
    vocab = 400
    torch.manual_seed(0)
    eager, lazy = (NPLM(vocab_size=vocab, n=3, m=4, h=6, direct=True) for _ in range(2))
    lazy.load_state_dict(eager.state_dict())
    q = torch.full((vocab,), 1 / vocab)
    runs = []
    for model, lazy_groups in ((eager, False), (lazy, True)):
        groups = [{"params": model.decayed(), "weight_decay": 0.1}, {"params": model.biases(), "weight_decay": 0.0}]
        optimizer = SparseSGD(groups, lr=0.9, lazy=model.word_rows() if lazy_groups else ())
        plateau = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[150], gamma=0.2)
        torch.manual_seed(1)  # the same batches and draws
        for _ in range(300):
            context, target = torch.randint(0, vocab // 8, (8, 2)), torch.randint(0, vocab // 8, (8,))
            sample = draw(q, 4)
            model.zero_grad()
            terms = model.output_terms(context, optimizer.rows)  # as the sampled output layer reads them
            sampled_cross_entropy(layer_outputs(terms, model.b, target, optimizer.rows), target, q, sample).backward()
            optimizer.step()
            plateau.step()
        owed = model.C.detach().clone()  # before settling: the kept weight, the true one / s
        optimizer.state_dict()  # settles every row first, as a checkpoint does
        runs.append((owed, model.state_dict()))
    (_, expected), (owed, settled) = runs
    assert not torch.allclose(owed, expected["C"], rtol=1e-3)
    for name, value in expected.items():
        torch.testing.assert_close(settled[name], value, msg=name)


def test_a_checkpoint_of_eager_decay_resumes_under_lazy_decay() -> None:
    """The lazy weights are marked, not grouped apart: an optimiser state saved with every weight decayed eagerly (a
    run killed before lazy decay existed) loads, and training goes on from it."""
    torch.manual_seed(0)
    model = NPLM(vocab_size=40, n=3, m=4, h=5, direct=True)
    groups = [{"params": model.decayed(), "weight_decay": 0.1}, {"params": model.biases(), "weight_decay": 0.0}]
    saved = SparseSGD(groups, lr=0.5).state_dict()
    optimizer = SparseSGD(groups, lr=0.5, lazy=model.word_rows())
    optimizer.load_state_dict(saved)
    context, target = torch.randint(0, 40, (16, 2)), torch.randint(0, 40, (16,))
    q = torch.full((40,), 1 / 40)
    before = model.C.detach().clone()
    sample = draw(q, 8)
    terms = model.output_terms(context, optimizer.rows)
    sampled_cross_entropy(layer_outputs(terms, model.b, target, optimizer.rows), target, q, sample).backward()
    optimizer.step()
    optimizer.settle()
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[context.flatten()] = False
    torch.testing.assert_close(model.C.detach()[untouched], before[untouched] * (1 - 0.5 * 0.1))


def test_sampled_config_is_checked_and_keyed_apart_from_exact() -> None:
    corpus = SimpleNamespace(fingerprint="f")
    exact, sampled = composed("experiment=mlp5"), composed("experiment=mlp5", "optim=sampled")
    check_config(sampled)
    assert sampled.optim.output == "sampled" and sampled.trainer.limit_val_batches == 0.25
    assert config_key(exact, corpus.fingerprint) != config_key(sampled, corpus.fingerprint) and model_key(
        exact, corpus.fingerprint
    ) != model_key(sampled, corpus.fingerprint)
    for override, key in [
        ("optim.samples=0", "optim.samples"),
        ("optim.proposal=zipf", "optim.proposal"),
        ("optim.estimator=magic", "optim.estimator"),
        ("trainer.precision=bf16-mixed", "trainer.precision"),  # sampled training computes in float32
    ]:
        with pytest.raises(NplmError, match=rf"^{key}="):
            check_config(composed("optim=sampled", override))


@pytest.mark.slow  # about 8-16 s: outside the default suite's 5 minutes
def test_sampled_run_is_scored_exactly_on_every_token(brown_path: Path, tmp_path: Path) -> None:
    """A sampled MLP9 into a real SQLite store: it records what it used, and its perplexities are the exact
    softmax over every token of each split (early stopping watched a quarter of validation)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = run_script(
        "nplm-train",
        f"data.path={brown_path}",
        *data_slice(40_000, 10_000, 5_000),
        "experiment=mlp9",
        "optim=sampled",
        "optim.samples=200",
        "trainer.max_epochs=2",
        f"tracking.uri={uri}",
        f"hydra.run.dir={tmp_path}/out",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
    params, metrics = run.data.params, run.data.metrics
    assert run.info.status == "FINISHED"
    assert (run.data.tags["family"], run.data.tags["key_version"]) == ("mlp", "1")  # identity by family, not path
    assert (params["optim.output"], params["optim.samples"], params["optim.proposal"]) == ("sampled", "200", "bigram")
    assert params["optim.estimator"] == "importance" and params["trainer.precision"] == "32-true"
    assert (metrics["train_tokens"], metrics["valid_tokens"], metrics["test_tokens"]) == (40000, 10000, 5000)
    assert 1 < metrics["valid_ppl"] < 2000
    epochs = client.get_metric_history(run.info.run_id, "valid_ppl_epoch")
    assert len(epochs) == 2  # validated every epoch, on the first quarter of the split
    assert min(m.value for m in epochs) != pytest.approx(metrics["valid_ppl"], rel=1e-6)


def test_a_lazy_weight_is_settled_before_its_scale_grows_small() -> None:
    """At lr wd = 0.5 each step halves a lazy weight's scale s: 30 steps would leave it at 1e-9 and the kept weight
    a billion times the true one. SparseSGD settles a weight whose s falls below 1e-6, so the kept weight never
    exceeds the true one by more than a million, and the weights stay eager decay's."""
    torch.manual_seed(0)
    eager, lazy = (NPLM(vocab_size=40, n=3, m=4, h=5, direct=True) for _ in range(2))
    lazy.load_state_dict(eager.state_dict())
    q = torch.full((40,), 1 / 40)
    largest, settled = [], []
    for model, marked in ((eager, ()), (lazy, lazy.word_rows())):
        groups = [{"params": model.decayed(), "weight_decay": 1.0}, {"params": model.biases(), "weight_decay": 0.0}]
        optimizer = SparseSGD(groups, lr=0.5, lazy=marked)
        torch.manual_seed(1)
        for _ in range(30):
            context, target = torch.randint(0, 40, (8, 2)), torch.randint(0, 40, (8,))
            model.zero_grad()
            terms = model.output_terms(context, optimizer.rows)
            sampled_cross_entropy(
                layer_outputs(terms, model.b, target, optimizer.rows), target, q, draw(q, 4)
            ).backward()
            optimizer.step()
            largest.append(model.U.detach().abs().max().item())
        optimizer.state_dict()
        settled.append(model.state_dict())
    true_size, kept_size = max(largest[:30]), max(largest[30:])
    assert 1e3 * true_size < kept_size < 1e6 * true_size  # kept apart from the true weight, but never far
    for name, value in settled[0].items():
        torch.testing.assert_close(settled[1][name], value, msg=name)
