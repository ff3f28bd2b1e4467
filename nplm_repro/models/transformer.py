"""`model=transformer`: a GPT-style decoder (Radford et al. 2018; Karpathy's nanoGPT).

    z_0 = E w + P,   z_l = z_{l-1} + attn(LN(z_{l-1})),   z_l = z_l + mlp(LN(z_l)),   P(next) = softmax(b + O LN(z_L))

E: |V| x width embedding; P: learned positions over `context` tokens; `layers` pre-norm blocks of `heads`-headed
causal self-attention and a 4 x width GELU MLP; O tied to E (`tie`) or its own. Dropout: `dropout` on each residual
branch (attention's projection and the MLP), `dropout_attention` on the attention weights and `dropout_embedding` on
E w + P (each null: `dropout`).
Trained on shuffled windows of `context` tokens with AdamW, warm-up and cosine decay (optim.recipe=adamw). Scored
by sliding windows with stride context / 2: every token exactly once, with at least half a window of context, or
all of the split before it when that is less (models/sequence.py, data/streams.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from nplm_repro.data.splits import Sizes
from nplm_repro.data.streams import StreamReading
from nplm_repro.errors import NplmError
from nplm_repro.models.sequence import SequenceModule
from nplm_repro.rules import Rule, at_least, number, optional


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float, attention: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.heads, self.attention = heads, attention
        self.drop = nn.Dropout(dropout)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        B, T, C = z.shape
        q, k, v = self.qkv(self.ln1(z)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        p = self.attention if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True).transpose(1, 2).reshape(B, T, C)
        z = z + self.drop(self.proj(a))
        return z + self.drop(self.mlp(self.ln2(z)))


class TransformerModule(SequenceModule):
    family = "transformer"
    label = "Transformer"
    colour = "C3"

    @classmethod
    def rules(cls, cfg: Any) -> dict[str, Rule]:
        rate = number(0, 1, high_open=True)
        return super().rules(cfg) | {
            "model.heads": at_least(1),
            "model.context": at_least(2),
            "model.dropout_attention": optional(rate),
            "model.dropout_embedding": optional(rate),
        }

    @classmethod
    def check(cls, cfg: Any) -> None:
        if cfg.model.width % cfg.model.heads:
            raise NplmError(f"model.width={cfg.model.width} must be a multiple of model.heads={cfg.model.heads}")

    @classmethod
    def check_sizes(cls, cfg: Any, sizes: Sizes) -> None:
        """Training reads windows of model.context tokens (data/streams.py Chunks): the split must hold one."""
        if sizes.train is not None and cfg.model.context > sizes.train:
            raise NplmError(
                f"model.context={cfg.model.context} is longer than the training split ({sizes.train_said()}): "
                "training reads windows of model.context tokens"
            )

    def __init__(
        self,
        vocab_size: int,
        width: int,
        layers: int,
        heads: int,
        context: int,
        dropout: float,
        tie: bool,
        optim: dict[str, Any],
        output: str = "standard",
        classes: int | None = None,
        class_method: str = "exchange",
        word_classes: torch.Tensor | None = None,
        dropout_attention: float | None = None,
        dropout_embedding: float | None = None,
    ) -> None:
        """`output`, `classes`, `class_method`, `word_classes`: the output layer (models/sequence.py)."""
        super().__init__(optim)
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.save_hyperparameters(ignore=["word_classes"], logger=False)
        self.embedding = nn.Embedding(vocab_size, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        attention = dropout if dropout_attention is None else dropout_attention
        self.blocks = nn.ModuleList(Block(width, heads, dropout, attention) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.drop = nn.Dropout(dropout if dropout_embedding is None else dropout_embedding)
        self.b = nn.Parameter(torch.zeros(vocab_size))
        self.O = None if tie else nn.Parameter(torch.empty(vocab_size, width))
        for name, p in self.named_parameters():  # GPT-2's: N(0, 0.02), residual projections scaled by depth
            if p.dim() >= 2:
                std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
        self.context = context
        self._output_layer(vocab_size, output, classes, [width], word_classes)

    def hidden(self, x: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, None]:
        z = self.drop(self.embedding(x) + self.position[: x.shape[1]])
        for block in self.blocks:
            z = block(z)
        return self.ln(z), None

    def flops_per_token(self, rows: float) -> float:
        """A block's projections and MLP (12 width^2 multiply-adds) and its attention over half a window on average
        (scores and values: context x width), then the output layer."""
        width = self.output_width
        return 2.0 * (len(self.blocks) * (12 * width * width + self.context * width) + width * rows)

    def window(self, ids: list[int]) -> list[int]:
        return ids[-self.context :]

    @property
    def reads(self) -> StreamReading:
        """Windows of `context` tokens (data/streams.py's `Chunks` to train, `Sliding` to score)."""
        return StreamReading(self.context, bptt=False)
