"""The LSTM's regularisers (models/dropout.py, model.locked, word_dropout, weight_drop) and the Transformer's
dropouts: each does what its paper says to the tensors it touches, and none of them touches evaluation."""

from __future__ import annotations

import torch

from nplm_repro.models import dropout
from nplm_repro.models.lstm import LSTMModule
from nplm_repro.models.transformer import TransformerModule

OPTIM = {"recipe": "adamw", "lr": 1e-3, "weight_decay": 0.01}


def lstm(**knobs: object) -> LSTMModule:
    torch.manual_seed(0)
    return LSTMModule(50, 16, 2, 0.5, True, 6, OPTIM, **knobs)


def test_variational_dropout_uses_one_mask_across_time() -> None:
    torch.manual_seed(1)
    x = torch.ones(4, 7, 32)
    dropped = dropout.locked(x, 0.5, training=True)
    assert torch.equal(dropped, dropped[:, :1].expand_as(dropped))  # every step as the first
    assert (dropped == 0).any() and (dropped == 2.0).any()  # dropped units, kept ones scaled by 1 / (1 - p)
    assert not torch.equal(dropped[0], dropped[1])  # one mask a row of the batch


def test_the_locked_lstm_drops_the_same_embedding_units_at_every_step() -> None:
    """With locked dropout on the embedding only, a unit dropped from one step's input is dropped from every
    step's: the first layer's input gradient is zero on the same units at every step."""
    model = lstm(locked=True, dropout_input=0.5, dropout_hidden=0.0)
    model.rates["output"] = 0.0
    model.train()
    seen = []
    model.lstm[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    model.hidden(torch.randint(0, 50, (3, 6)))
    zero = seen[0] == 0
    assert zero.any() and torch.equal(zero, zero[:, :1].expand_as(zero))


def test_word_dropout_drops_whole_rows() -> None:
    torch.manual_seed(2)
    weight = torch.rand(200, 8) + 0.1
    dropped = dropout.words(weight, 0.3, training=True)
    zero_rows = (dropped == 0).all(dim=1)
    assert 20 < int(zero_rows.sum()) < 100  # about 60 of 200 words
    assert not (dropped[~zero_rows] == 0).any()  # a word is dropped whole or kept whole
    assert torch.allclose(dropped[~zero_rows], weight[~zero_rows] / 0.7)


def test_weight_drop_changes_training_and_leaves_evaluation_deterministic() -> None:
    model = lstm(weight_drop=0.5, word_dropout=0.1, locked=True)
    x = torch.randint(0, 50, (2, 6))
    model.train()
    first, _ = model.hidden(x)
    second, _ = model.hidden(x)
    assert not torch.allclose(first, second)  # a new pattern of weights (and masks) a batch
    model.eval()
    once, _ = model.hidden(x)
    again, _ = model.hidden(x)
    assert torch.equal(once, again)
    plain = lstm()
    plain.load_state_dict(model.state_dict())
    plain.eval()
    assert torch.equal(plain.hidden(x)[0], once)  # evaluation uses every weight, unscaled: the plain network's


def test_weight_drop_trains_the_hidden_to_hidden_weights() -> None:
    model = lstm(weight_drop=0.5)
    model.train()
    h, _ = model.hidden(torch.randint(0, 50, (2, 6)))
    h.sum().backward()
    assert all(layer.weight_hh_l0.grad is not None and layer.weight_hh_l0.grad.abs().sum() > 0 for layer in model.lstm)


def test_a_checkpoint_of_one_multi_layer_lstm_loads_with_the_same_outputs() -> None:
    """Runs saved when the layers were one nn.LSTM (`lstm.weight_hh_l1`) load and score as they did."""
    model = lstm()
    old = torch.nn.LSTM(16, 16, 2, batch_first=True)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("lstm.")}
    model.load_state_dict(state | {f"lstm.{k}": v for k, v in old.state_dict().items()})
    model.eval()
    x = torch.randint(0, 50, (2, 6))
    expected, _ = old(model.embedding(x))
    assert torch.allclose(model.hidden(x)[0], expected, atol=1e-6)


def test_the_transformer_drops_attention_and_embedding_at_their_own_rates_and_only_in_training() -> None:
    """With the residual branches' dropout at 0, attention dropout alone still changes a training pass, embedding
    dropout alone too; either at null takes `dropout` (0 here: the pass is the evaluation pass); evaluation never
    drops."""
    x = torch.randint(0, 50, (2, 8))

    def passes(**knobs: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        model = TransformerModule(50, 16, 2, 2, 8, 0.0, True, OPTIM, **knobs)
        model.eval()
        evaluated = model.hidden(x)[0]
        model.train()
        torch.manual_seed(1)
        return model.hidden(x)[0], evaluated

    trained, evaluated = passes(dropout_attention=None, dropout_embedding=None)
    assert torch.equal(trained, evaluated)
    for knob in ("dropout_attention", "dropout_embedding"):
        trained, evaluated = passes(**{knob: 0.5})
        assert not torch.allclose(trained, evaluated), knob
