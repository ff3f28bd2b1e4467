"""The training loss of eq. (1)'s output layer in bfloat16, fused: where the training time goes, made fast.

Profiling a training step of MLP9 (|V| = 17,907, batches of 256) on a 2-core CPU: three products with
the |V|-wide output layer (forward, and the two of its backward) and the softmax over |V| take almost
all the time; in float32 the products run at about a fifth of the CPU's bfloat16 rate. This loss does the
three products in bfloat16 (float32 accumulation inside the matmul), and does only what the gradient
needs elementwise: one softmax (computed in float32, stored in bfloat16), minus 1 at the targets, which is
dL/dy times the batch size, and the input of both backward products. The reported training loss carries the
bf16 rounding of the target's probability (about 0.4%).
The bias b rides in the products as a column of ones, so db comes out of the dW/dU product for free.
Each |V|-wide gradient leaves in one pass, already float32 and laid out as its weight (so autograd keeps it
as the .grad without a copy); the 1/B scale is applied to the B-row operand, not to the |V|-wide results.

Gradients differ from the float32 path by bf16 rounding (about 0.2% relative); evaluation never uses this:
perplexities always come from float32 logits (module.py).
"""

from __future__ import annotations

import torch
from torch.autograd import Function


class _OutputLayerLoss(Function):
    @staticmethod
    def forward(ctx, target: torch.Tensor, b: torch.Tensor, *pairs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        inputs, weights = pairs[0::2], pairs[1::2]
        widths = [w.shape[1] for w in weights]
        z = _bf16_columns([*inputs, torch.ones_like(target, dtype=inputs[0].dtype)[:, None]], widths)
        O = _bf16_columns([*weights, b[:, None]], widths)  # the output weights [W U b]
        with torch.autocast(target.device.type, enabled=False):  # CUDA's autocast would widen the softmax
            p = torch.softmax(z @ O.T, 1)  # bfloat16 out, float32 inside
        rows = torch.arange(len(target), device=target.device)
        nll = -p[rows, target].float().clamp_min(torch.finfo(torch.float32).tiny).log()
        p[rows, target] -= 1.0  # softmax - one-hot = B * dL/dy
        ctx.save_for_backward(z, O, p)
        ctx.widths = widths
        return nll.mean()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        z, O, dy = ctx.saved_tensors
        scale = grad / len(dy)  # 1/B, a power of two for the usual batch sizes: exact in bfloat16
        dz = (dy @ O).float().mul_(scale).split([*ctx.widths, 1], 1)
        # dO^T = (z/B)^T dy, [inputs + 1, |V|]: oneDNN's fastest layout for this product. Its row blocks,
        # transposed, are dW, dU, and its last row db.
        dOT = (z * scale.to(z.dtype)).T @ dy
        blocks = dOT.split([*ctx.widths, 1], 0)
        dO = [block.T.to(torch.float32, memory_format=torch.contiguous_format) for block in blocks[:-1]]
        pairs = [g for i in range(len(ctx.widths)) for g in (dz[i], dO[i])]
        return None, blocks[-1][0].float(), *pairs


def _bf16_columns(blocks: list[torch.Tensor], widths: list[int]) -> torch.Tensor:
    """The blocks side by side, in bfloat16, converted straight into place (one pass over the data)."""
    out = torch.empty(len(blocks[0]), sum(widths) + 1, dtype=torch.bfloat16, device=blocks[0].device)
    for block, columns in zip(blocks, out.split([*widths, 1], 1)):
        columns.copy_(block)
    return out


def bf16_cross_entropy(
    terms: list[tuple[torch.Tensor, torch.Tensor]], b: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of softmax(b + sum of input @ weight.T) at `target`, products in bfloat16."""
    return _OutputLayerLoss.apply(target, b, *(t for pair in terms for t in pair))
