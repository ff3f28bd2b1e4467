"""The paper's section 5 output layers: the energy-minimization network (§5.1, model.output=energy) and a word-class
output layer (§5.2, model.output=classes). Their distributions are exact and normalised, they match the paper's
formulas written out by hand, and they run as any row does: a real run on a slice of Brown, scored again by
nplm-score's code, its Model loaded in a fresh process, text continued by nplm-ask."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from helpers import SLICE, Done, composed, slice_texts
from torch.nn import functional as F

from nplm_repro.data.clustering import frequency_bins, output_classes
from nplm_repro.data.load import load_corpus
from nplm_repro.errors import NplmError
from nplm_repro.models.classes import ClassOutput
from nplm_repro.models.energy import EnergyNPLM
from nplm_repro.models.lightning_module import LanguageModule, NPLMModule
from nplm_repro.models.nplm import NPLM
from nplm_repro.models.outputs import TRAININGS, output_of, outputs_for, training_of
from nplm_repro.models.sampled_loss import Proposal, draw, sampled_cross_entropy
from nplm_repro.perplexity import perplexity_of
from nplm_repro.serving.scoring import RunScorer
from nplm_repro.tracking import ledger
from nplm_repro.tracking.config_checks import check_config
from nplm_repro.tracking.keys import config_key

V, N, M, H = 40, 4, 3, 5


def contexts(rows: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(V, (rows, N - 1), generator=generator), torch.randint(V, (rows,), generator=generator)


@pytest.mark.parametrize("direct", [False, True])
def test_the_energy_network_is_the_papers_formula_normalised_over_the_output_word(direct: bool) -> None:
    torch.manual_seed(0)
    net = EnergyNPLM(V, N, M, H, direct)
    with torch.no_grad():
        net.b.normal_()
        net.d.normal_()
    context, _ = contexts()
    with torch.no_grad():
        logp = F.log_softmax(net(context), 1)
        # E(w, context) = v . tanh(d + H x) + sum_{i=0}^{n-1} b_{w_{t-i}}, x = (C(w_t), C(w_{t-1}), ...), by hand;
        # the columns of H: the context's first, then the output word's
        for row, ctx in enumerate(context):
            energies = []
            for w in range(V):
                x = torch.cat([net.C[ctx].flatten(), net.C[w]])
                e = net.v @ torch.tanh(net.d + net.H @ x) + net.b[w] + net.b[ctx].sum()
                if direct:
                    e = e - net.W[w] @ net.C[ctx].flatten()  # direct connections enter -E as in eq. (1)
                energies.append(e)
            torch.testing.assert_close(logp[row], F.log_softmax(-torch.stack(energies), 0), rtol=1e-5, atol=1e-5)
    assert torch.allclose(logp.exp().sum(1), torch.ones(len(context)))


def test_the_energy_networks_sampled_outputs_are_its_exact_ones_and_train_it() -> None:
    torch.manual_seed(0)
    net = EnergyNPLM(V, N, M, H, direct=True)
    context, target = contexts(32)
    words = torch.tensor([0, 3, 7, 39])
    y_t, y_s = net.sampled_outputs(context, target, words)
    with torch.no_grad():
        y = net(context)
    torch.testing.assert_close(y_t, y[torch.arange(len(target)), target])
    torch.testing.assert_close(y_s, y[:, words])
    # sampled training lowers the exact loss of the batch it trains on
    q = Proposal(target[:-1], target[1:], V).distribution(context[:, 0])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    before = F.cross_entropy(net(context), target).item()
    for _ in range(30):
        optimizer.zero_grad()
        outputs = functools.partial(net.sampled_outputs, context, target)
        sampled_cross_entropy(outputs, target, q, draw(q, 20)).backward()
        optimizer.step()
    assert F.cross_entropy(net(context), target).item() < before - 0.1


@pytest.mark.parametrize("direct", [False, True])
def test_a_class_output_layer_is_an_exact_distribution_whose_token_terms_are_its_own(direct: bool) -> None:
    torch.manual_seed(0)
    net = NPLM(V, N, M, H, direct)
    classes = torch.tensor([0] * 3 + [1] * 20 + [2] * 9 + [3] * 8)[torch.randperm(V)]  # uneven, shuffled ids
    widths = [(N - 1) * M] * direct + [H]
    layer = ClassOutput(V, 4, widths, classes)
    context, target = contexts(50)
    terms = net.output_terms(context)
    logp = layer.log_probs(terms, net.b).detach()
    assert torch.allclose(logp.exp().sum(1), torch.ones(len(context)), atol=1e-5)
    torch.testing.assert_close(
        layer.token_logprob(terms, net.b, target).detach(), logp[torch.arange(len(target)), target]
    )
    # by hand: P(class | context) from the class layer, P(w | class, context) from eq. (1)'s y over the class only
    y, row, w = net(context)[0].detach(), 0, int(target[0])
    k = int(classes[w])
    class_y = layer.bc + sum(inputs[row] @ weight.T for (inputs, _), weight in zip(terms, layer.Kc))
    by_hand = F.log_softmax(class_y, 0)[k] + y[w] - torch.logsumexp(y[classes == k], 0)
    torch.testing.assert_close(logp[row, w].detach(), by_hand.detach())
    # its gradient, class by class, is that of the whole distribution's
    (layer.token_logprob(terms, net.b, target).sum()).backward()
    fast = {name: p.grad.clone() for name, p in [*net.named_parameters(), *layer.named_parameters()]}
    net.zero_grad()
    layer.zero_grad()
    layer.log_probs(net.output_terms(context), net.b)[torch.arange(len(target)), target].sum().backward()
    for name, p in [*net.named_parameters(), *layer.named_parameters()]:
        torch.testing.assert_close(fast[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
    # a state dict restores the classes into a placeholder
    again = ClassOutput(V, 4, widths)
    again.load_state_dict(layer.state_dict())
    torch.testing.assert_close(again.log_probs(terms, net.b).detach(), logp)


def test_frequency_bins_fill_classes_by_share_of_tokens_most_frequent_first() -> None:
    counts = np.array([1, 50, 1, 20, 10, 10, 4, 4])  # 100 tokens
    # by frequency: 50 (class 0 closes at 50% > 1/4), 20 (70% > 2/4: closes 1), 10 (80% > 3/4: closes 2), then 3
    assert frequency_bins(counts, 4).tolist() == [3, 0, 3, 1, 2, 3, 3, 3]
    assert frequency_bins(counts, 1).tolist() == [0] * 8


@pytest.mark.parametrize("method", ["exchange", "frequency"])
def test_every_word_has_an_output_class_and_no_class_is_empty(
    method: str, brown_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPLM_CACHE", str(tmp_path))
    corpus = load_corpus(composed(f"data.path={slice_texts(brown_path, tmp_path)}", *SLICE).data)
    classes = output_classes(corpus, 20, method)
    assert len(classes) == corpus.vocab_size
    assert np.bincount(classes).min() >= 1 and classes.max() < 20
    with pytest.raises(NplmError, match="class_method='tree' is not known"):
        output_classes(corpus, 20, "tree")


def test_the_new_knobs_leave_every_eq1_runs_key_as_it_was() -> None:
    """`model.output=standard` (and the class keys it does not use) are not in the key: stored runs keep matching."""
    base = composed("experiment=mlp5")
    assert config_key(composed("experiment=mlp5", "model.output=standard", "model.classes=7"), "f") == config_key(
        base, "f"
    )
    assert config_key(composed("experiment=mlp5", "model.output=energy"), "f") != config_key(base, "f")
    classes = [composed("experiment=mlp5", "model.output=classes", f"model.class_method={m}") for m in ("exchange",)]
    assert config_key(classes[0], "f") != config_key(
        composed("experiment=mlp5", "model.output=classes", "model.class_method=frequency"), "f"
    )


def test_each_outputs_key_is_read_in_one_place_that_says_what_its_value_is() -> None:
    """models/outputs.py's words: a family's rule lists the outputs it builds, a config from before a key existed
    reads as the softmax trained exactly, and each output and training says what the code around it asks."""
    assert outputs_for("mlp") == ("standard", "energy", "classes") and outputs_for("lstm") == ("standard", "classes")
    assert output_of({}) is output_of({"output": "standard"}) and training_of({}) is TRAININGS["exact"]
    energy, classes = output_of({"output": "energy"}), output_of({"output": "classes"})
    assert energy.trains_sampled and energy.own_scores and not energy.plain_loop and not energy.scores_train
    assert not classes.trains_sampled and classes.word_classes and not classes.own_scores
    assert TRAININGS["sampled"].sampled and TRAININGS["sampled"].precision == "32-true"
    assert not TRAININGS["exact"].sampled and TRAININGS["exact"].precision is None


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["model.output=classes", "optim=sampled"], "model.output=classes trains exactly"),
        (["model.output=energy", "model.h=0"], "model.output=energy needs model.h >= 1"),
        (["model.output=tree"], "model.output"),
        (["model.output=classes", "model.class_method=tree"], "model.class_method"),
        (["model.output=classes", "model.classes=1"], "model.classes"),
    ],
)
def test_an_output_that_cannot_be_is_refused_in_one_line(overrides: list[str], error: str) -> None:
    with pytest.raises(NplmError, match=error):
        check_config(composed("experiment=mlp5", *overrides))


OUTPUTS = {
    "energy": ["model.output=energy", "optim=sampled", "optim.samples=50", "trainer.limit_val_batches=1.0"],
    "classes": ["model.output=classes", "model.class_method=frequency"],
}
PROMPT = "The jury said that it"


def short_run(workdir: Path, texts: Path, *overrides: str) -> tuple[str, str]:
    """A short run on the Brown slice (`texts`: its 13 texts, `slice_texts`; one epoch of at most 10 steps, then
    validation) in a real store, `workdir`'s: its store and run id."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        patch.setenv("NPLM_CACHE", str(workdir))
        cfg = composed(
            f"data.path={texts}",
            *SLICE,
            "trainer.max_epochs=1",
            "trainer.limit_train_batches=10",
            *overrides,
            f"tracking.uri={uri}",
            f"callbacks.model_checkpoint.dirpath={workdir}/c",
        )
        run_id, _ = ledger.run(cfg)
    return uri, run_id


def scored_again(uri: str, run_id: str) -> LanguageModule:
    """The run's test split scored again by nplm-score's code, to a millionth of its logged perplexity, and its module's
    distribution after a prompt (generation's, the Model's) normalised over all of V: the module."""
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    scorer = RunScorer(uri, run_id)
    again = perplexity_of(np.exp(scorer.logprob(scorer.split("test")).astype(np.float64)))
    assert again == pytest.approx(run.data.metrics["test_ppl"], rel=1e-6)
    module = scorer.model()
    with torch.no_grad():
        logp = module.next_logprobs([scorer.words(PROMPT)])[0].double()
    assert float(logp.exp().sum()) == pytest.approx(1.0, abs=1e-5)
    return module


@pytest.fixture(scope="module")
def rows(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """A short MLP5 run of each output layer, in one real store: its store and run id by output."""
    workdir = tmp_path_factory.mktemp("outputs")
    texts = slice_texts(brown_path, workdir)
    return {output: short_run(workdir, texts, "experiment=mlp5", *OUTPUTS[output]) for output in sorted(OUTPUTS)}


@pytest.mark.slow  # over 10 s
@pytest.mark.parametrize("output", sorted(OUTPUTS))
def test_its_run_is_scored_again_to_a_millionth_and_says_its_output(
    rows: dict[str, tuple[str, str]], output: str
) -> None:
    uri, run_id = rows[output]
    assert mlflow.MlflowClient(uri).get_run(run_id).data.params["model.output"] == output
    module = scored_again(uri, run_id)
    assert isinstance(module, NPLMModule) and module.output.name == output
    assert (module.classes is not None) == (module.layer.name == "word classes") == module.output.word_classes


@pytest.mark.parametrize("output", sorted(OUTPUTS))
def test_nplm_ask_continues_a_prompt_with_it(
    rows: dict[str, tuple[str, str]], output: str, ask: Callable[..., Done], tmp_path: Path
) -> None:
    uri, run_id = rows[output]
    args = ["generate", run_id, "--prompt", PROMPT, "--words", "6", "--draw-seed", "1", "--tracking-uri", uri]
    first, second = ask(tmp_path, *args), ask(tmp_path, *args)
    assert first.returncode == 0 and first.stdout == second.stdout and first.stdout.strip()


LOAD = """
import json, sys, mlflow, pandas as pd
mlflow.set_tracking_uri(sys.argv[1])
context = sys.argv[2]
for run_id in sys.argv[3:]:
    model = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    out = model.predict(pd.DataFrame({"context": [context], "next_word": ["the"]}), params={"k": 3})
    print(json.dumps({"words": list(out["words"][0]), "logprob": float(out["logprob"][0])}))
"""


@pytest.mark.slow  # a fresh Python process that imports mlflow and torch: about 15 s
def test_a_fresh_process_loads_each_outputs_model_and_gets_the_exact_distribution(
    rows: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    """Each run's MLflow Model, loaded in one fresh Python process as a user loads it (the runs share a store),
    answers for the prompt what the run rebuilt in this process computes: ln P(the) and the 3 most probable next
    words."""
    (uri,) = {uri for uri, _ in rows.values()}
    run_ids = [run_id for _, run_id in rows.values()]
    found = subprocess.run(
        [sys.executable, "-c", LOAD, uri, PROMPT, *run_ids], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    answers = [json.loads(line) for line in found.stdout.strip().splitlines()[-len(run_ids) :]]
    assert len(answers) == len(run_ids) == 2
    for run_id, answer in zip(run_ids, answers):
        scorer = RunScorer(uri, run_id)
        with torch.no_grad():
            logp = scorer.model().next_logprobs([scorer.words(PROMPT)])[0].double()
        assert answer["logprob"] == pytest.approx(float(logp[scorer.corpus.vocab.index("the")]), rel=1e-5)
        assert answer["words"] == [scorer.corpus.vocab[i] for i in logp.topk(3).indices]


def test_a_class_layer_with_classes_of_every_padded_size_has_the_whole_distributions_gradient() -> None:
    """Classes from 3 to 700 words fall in buckets of different padded sizes, the largest above BUCKET_LIMIT."""
    torch.manual_seed(1)
    sizes = [3, 17, 40, 130, 300, 700]
    vocab = sum(sizes)
    classes = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))[torch.randperm(vocab)]
    layer = ClassOutput(vocab, len(sizes), [7, 4], classes)
    weights = [torch.randn(vocab, 7, requires_grad=True), torch.randn(vocab, 4, requires_grad=True)]
    b = torch.randn(vocab, requires_grad=True)
    inputs = [torch.randn(300, 7), torch.randn(300, 4)]
    target = torch.randint(vocab, (300,))
    terms = list(zip(inputs, weights))
    fast = layer.token_logprob(terms, b, target)
    grads = torch.autograd.grad(fast.sum(), [b, *weights])
    whole = layer.log_probs(terms, b)[torch.arange(300), target]
    torch.testing.assert_close(fast, whole, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, torch.autograd.grad(whole.sum(), [b, *weights])):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # a real LSTM run on a slice of Brown and its scoring again: about 8 s
def test_an_lstm_with_word_classes_trains_and_is_scored_exactly(brown_path: Path, tmp_path: Path) -> None:
    """`nplm-train experiment=lstm model.output=classes`: a real run on a slice of Brown, scored again to a millionth,
    its distribution over all of V normalised."""
    overrides = ("experiment=lstm", "model.width=32", "model.output=classes", "model.class_method=frequency")
    uri, run_id = short_run(tmp_path, slice_texts(brown_path, tmp_path), *overrides)
    assert mlflow.MlflowClient(uri).get_run(run_id).data.params["model.output"] == "classes"
    module = scored_again(uri, run_id)
    assert module.classes is not None and module.layer.name == "word classes"
