"""`model=lstm`: a word-level LSTM language model in the style of Zaremba, Sutskever & Vinyals (2014), with the
regularisers of AWD-LSTM (Merity et al. 2017) as config values.

    e_t = words(E) w_t,   h^0_t = drop_in(e_t),   h^l_t = LSTM_l(h^{l-1}_t; weight_drop(U_l)),   between layers drop_hidden,
    P(w_{t+1} | w_1..w_t) = softmax(b + O drop(h^L_t))

E: |V| x width input embedding; L LSTM layers of `width` units, U_l the hidden-to-hidden matrix of layer l; O: |V| x
width output vectors, tied to E (`tie`, Press & Wolf 2017) or their own. Dropout: `dropout` on the output,
`dropout_input` on the embedding and `dropout_hidden` between layers (each null: `dropout`), with a fresh mask at every
step, or one mask over a batch's steps with `locked` (variational dropout); `word_dropout` drops whole words from E,
`weight_drop` single weights of each U_l (models/dropout.py). Trained by truncated back-propagation through time over
the contiguous training stream (`bptt` steps, `optim.batch_size` parallel rows, the state carried from batch to batch),
its gradient clipped; scored with the state carried from a split's start through its texts in order
(models/sequence.py, data/streams.py).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from nplm_repro.data.streams import StreamReading
from nplm_repro.models import dropout as drop
from nplm_repro.models.sequence import SequenceModule
from nplm_repro.rules import Rule, at_least, flag, number, optional

State = tuple[torch.Tensor, torch.Tensor]


@contextlib.contextmanager
def _bfloat16_recurrence() -> Iterator[None]:
    """Under bf16-mixed on a CPU whose oneDNN has no bfloat16 kernels (AVX2 only), oneDNN's LSTM fails ("could not
    create a primitive descriptor for the LSTM forward propagation primitive"): the layer takes torch's own kernels
    there, still with bfloat16 products."""
    bfloat16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    native = bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = before and not native
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


class LSTMModule(SequenceModule):
    family = "lstm"
    label = "LSTM"
    colour = "C2"

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        rate = number(0, 1, high_open=True)
        return super().rules(cfg) | {
            "model.bptt": at_least(1),
            "model.init": number(0, low_open=True),
            "model.dropout_input": optional(rate),
            "model.dropout_hidden": optional(rate),
            "model.word_dropout": rate,
            "model.weight_drop": rate,
            "model.locked": flag(),
        }

    def __init__(
        self,
        vocab_size: int,
        width: int,
        layers: int,
        dropout: float,
        tie: bool,
        bptt: int,
        optim: dict[str, Any],
        init: float = 0.1,
        dropout_input: float | None = None,
        dropout_hidden: float | None = None,
        word_dropout: float = 0.0,
        weight_drop: float = 0.0,
        locked: bool = False,
        output: str = "standard",
        classes: int | None = None,
        class_method: str = "exchange",
        word_classes: torch.Tensor | None = None,
    ) -> None:
        """`output`, `classes`, `class_method`, `word_classes`: the output layer (models/sequence.py)."""
        super().__init__(optim)
        self.save_hyperparameters(ignore=["word_classes"], logger=False)
        self.embedding = nn.Embedding(vocab_size, width)
        self.lstm = nn.ModuleList(nn.LSTM(width, width, batch_first=True) for _ in range(layers))
        self.b = nn.Parameter(torch.zeros(vocab_size))
        self.O = None if tie else nn.Parameter(torch.empty(vocab_size, width))
        for p in self.parameters():  # Zaremba et al.: every weight uniform in [-init, init]
            if p.dim() >= 2:
                nn.init.uniform_(p, -init, init)
        self.bptt = bptt
        self.rates = {
            "input": dropout if dropout_input is None else dropout_input,
            "hidden": dropout if dropout_hidden is None else dropout_hidden,
            "output": dropout,
        }
        self.word_dropout, self.weight_drop, self.locked = word_dropout, weight_drop, locked
        self._register_load_state_dict_pre_hook(_one_module_a_layer)
        self._output_layer(vocab_size, output, classes, [width], word_classes)

    def _drop(self, x: torch.Tensor, where: str) -> torch.Tensor:
        """Dropout at `where` (input, hidden, output): one mask over the steps if `locked`, else one a step."""
        p = self.rates[where]
        return drop.locked(x, p, self.training) if self.locked else F.dropout(x, p, self.training)

    def _layer(self, index: int, x: torch.Tensor, state: State | None) -> tuple[torch.Tensor, State]:
        """Layer `index` over x, its hidden-to-hidden weights with `weight_drop` of them dropped for this batch."""
        layer = self.lstm[index]
        with _bfloat16_recurrence():
            if not (self.training and self.weight_drop):
                return layer(x, state)
            dropped = {"weight_hh_l0": drop.dropconnect(layer.weight_hh_l0, self.weight_drop, True)}
            return functional_call(layer, dropped, (x, state))

    def hidden(self, x: torch.Tensor, state: list[State] | None = None) -> tuple[torch.Tensor, list[State]]:
        embedding = drop.words(self.embedding.weight, self.word_dropout, self.training)
        h = self._drop(F.embedding(x, embedding), "input")
        states = []
        for index in range(len(self.lstm)):
            if index:
                h = self._drop(h, "hidden")
            h, layer_state = self._layer(index, h, None if state is None else state[index])
            states.append(layer_state)
        return self._drop(h, "output"), states

    def flops_per_token(self, rows: float) -> float:
        """Each layer's four gates from its input and its state (8 width^2 multiply-adds), then the output layer."""
        width = self.output_width
        return 2.0 * (len(self.lstm) * 8 * width * width + width * rows)

    def carry(self, state: list[State]) -> list[State]:
        return [(h.detach(), c.detach()) for h, c in state]

    @property
    def reads(self) -> StreamReading:
        """Rows of the stream walked `bptt` steps at a time (data/streams.py's `Bptt`)."""
        return StreamReading(self.bptt, bptt=True)


def _one_module_a_layer(state_dict: dict[str, torch.Tensor], prefix: str, *args: object) -> None:
    """Checkpoints and Models saved when the layers were one nn.LSTM (`lstm.weight_hh_l1`) load into one nn.LSTM a
    layer (`lstm.1.weight_hh_l0`): the same weights, so such runs score as they did."""
    pattern = re.compile(rf"^{re.escape(prefix)}lstm\.(weight|bias)_(ih|hh)_l(\d+)$")
    for key in [k for k in state_dict if pattern.match(k)]:
        kind, gate, layer = pattern.match(key).groups()
        state_dict[f"{prefix}lstm.{layer}.{kind}_{gate}_l0"] = state_dict.pop(key)
