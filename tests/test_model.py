"""Eq. (1) against a hand computation, and the distribution it defines."""

import math

import pytest
import torch

from nplm_repro.models.nplm import NPLM


def hand_logits(model: NPLM, context: list[int]) -> list[float]:
    """y_i = b_i + sum_k W_ik x_k + sum_j U_ij tanh(d_j + sum_k H_jk x_k), one scalar at a time."""
    x = [float(v) for word in context for v in model.C[word]]
    hidden = []
    for j in range(model.h):
        hidden.append(math.tanh(float(model.d[j]) + sum(float(model.H[j, k]) * x[k] for k in range(len(x)))))
    y = []
    for i in range(len(model.b)):
        value = float(model.b[i])
        if model.direct:
            value += sum(float(model.W[i, k]) * x[k] for k in range(len(x)))
        value += sum(float(model.U[i, j]) * hidden[j] for j in range(model.h))
        y.append(value)
    return y


@pytest.mark.parametrize("h,direct", [(3, True), (3, False), (0, True)])
def test_eq1_matches_hand_computation(h: int, direct: bool) -> None:
    torch.manual_seed(0)
    model = NPLM(vocab_size=7, n=4, m=2, h=h, direct=direct)
    with torch.no_grad():  # non-zero biases so that b and d are checked too
        model.b.uniform_(-1, 1)
        if model.d is not None:
            model.d.uniform_(-1, 1)
    context = [3, 0, 6]  # w_{t-1}, w_{t-2}, w_{t-3}
    y = model(torch.tensor([context]))[0]
    assert y.tolist() == pytest.approx(hand_logits(model, context), abs=1e-5)


def test_context_order_is_w_t_minus_1_first() -> None:
    """x starts with C(w_{t-1}): swapping the context words changes the output of a direct model."""
    torch.manual_seed(0)
    model = NPLM(vocab_size=5, n=3, m=2, h=0, direct=True)
    x_first = model(torch.tensor([[1, 2]]))[0]
    expected = model.b + model.W[:, :2] @ model.C[1] + model.W[:, 2:] @ model.C[2]
    assert torch.allclose(x_first, expected, atol=1e-6)


def test_h0_is_softmax_of_direct() -> None:
    torch.manual_seed(0)
    model = NPLM(vocab_size=9, n=3, m=4, h=0, direct=True)
    assert model.H is None and model.U is None and model.d is None
    context = torch.tensor([[1, 2], [8, 0]])
    x = model.C[context].flatten(1)
    assert torch.allclose(model(context), model.b + x @ model.W.T, atol=1e-6)


@pytest.mark.parametrize("h,direct", [(5, True), (5, False), (0, True)])
def test_distribution_sums_to_one(h: int, direct: bool) -> None:
    torch.manual_seed(0)
    model = NPLM(vocab_size=50, n=5, m=3, h=h, direct=direct)
    probs = torch.softmax(model(torch.randint(0, 50, (16, 4))).double(), dim=-1)
    assert torch.allclose(probs.sum(-1), torch.ones(16, dtype=torch.float64), atol=1e-9)
    assert (probs > 0).all()


def test_no_direct_means_no_W() -> None:
    model = NPLM(vocab_size=5, n=3, m=2, h=4, direct=False)
    assert model.W is None
    assert {name for name, _ in model.named_parameters()} == {"C", "H", "d", "U", "b"}


def test_weight_decay_spares_the_biases() -> None:
    model = NPLM(vocab_size=5, n=3, m=2, h=4, direct=True)
    assert {id(p) for p in model.decayed()} == {id(model.C), id(model.H), id(model.U), id(model.W)}
    assert {id(p) for p in model.biases()} == {id(model.b), id(model.d)}


@pytest.mark.parametrize("kwargs", [{"n": 1}, {"m": 0}, {"h": -1}, {"h": 0, "direct": False}])
def test_invalid_shapes_are_refused(kwargs: dict) -> None:
    args = {"vocab_size": 5, "n": 3, "m": 2, "h": 4, "direct": True} | kwargs
    with pytest.raises(ValueError):
        NPLM(**args)
