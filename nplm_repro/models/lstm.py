"""`model=lstm`: a word-level LSTM language model in the style of Zaremba, Sutskever & Vinyals (2014).

    e_t = E w_t,   (h_t, c_t) = LSTM_L(dropout(e_t), (h_{t-1}, c_{t-1})),   P(w_{t+1} | w_1..w_t) = softmax(b + O dropout(h_t))

E: |V| x width input embedding; L LSTM layers of `width` units with dropout between them; O: |V| x width output
vectors, tied to E (`tie`, Press & Wolf 2017) or their own. Trained by truncated back-propagation through time
over the contiguous training stream (`bptt` steps, `optim.batch_size` parallel rows, the state carried from batch
to batch), its gradient clipped; scored with the state carried from a split's start through its texts in order
(models/sequence.py, data/streams.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nplm_repro.data.corpus import Corpus
from nplm_repro.data.streams import StreamBatches
from nplm_repro.models.sequence import SequenceModule, stream_loader
from nplm_repro.rules import Rule, at_least, number

State = tuple[torch.Tensor, torch.Tensor]


class LSTMModule(SequenceModule):
    family = "lstm"
    label = "LSTM"
    colour = "C2"

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        return super().rules(cfg) | {"model.bptt": at_least(1), "model.init": number(0, low_open=True)}

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
        output: str = "standard",
        classes: int | None = None,
        class_method: str = "exchange",
        word_classes: torch.Tensor | None = None,
    ) -> None:
        """`output`, `classes`, `class_method`, `word_classes`: the output layer (models/sequence.py)."""
        super().__init__(optim)
        self.save_hyperparameters(ignore=["word_classes"], logger=False)
        self.embedding = nn.Embedding(vocab_size, width)
        self.lstm = nn.LSTM(width, width, layers, dropout=dropout if layers > 1 else 0.0, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.b = nn.Parameter(torch.zeros(vocab_size))
        self.O = None if tie else nn.Parameter(torch.empty(vocab_size, width))
        for p in self.parameters():  # Zaremba et al.: every weight uniform in [-init, init]
            if p.dim() >= 2:
                nn.init.uniform_(p, -init, init)
        self.bptt = bptt
        self._output_layer(vocab_size, output, classes, [width], word_classes)

    def hidden(self, x: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        out, state = self.lstm(self.drop(self.embedding(x)), state)
        return self.drop(out), state

    def flops_per_token(self, rows: float) -> float:
        """Each layer's four gates from its input and its state (8 width^2 multiply-adds), then the output layer."""
        width = self.output_width
        return 2.0 * (self.lstm.num_layers * 8 * width * width + width * rows)

    def carry(self, state: State) -> State:
        return tuple(s.detach() for s in state)

    def reading(self, corpus: Corpus, split: str, batch_size: int, shuffle: bool, seed: int) -> StreamBatches:
        return stream_loader(corpus, split, batch_size, self.bptt, shuffle, seed, "bptt")
