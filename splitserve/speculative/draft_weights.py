"""The draft's weights as the engine serves them: its own dtype, or weight-only FP8.

`draft_weight_format="fp8"` stores the products a DSpark round reads in full every time (the
context projection fc, every draft layer's q/k/v/o and gate/up/down, and the lm_head: the
largest at a large vocabulary) as FP8 e4m3 with one float32 scale per output row, through the
target's weight-only product (target/native/linear.py is the reference, linear_kernel.py the
Triton kernel on CUDA). A round at batch 1 multiplies γ rows by each weight once, so it is bound
by the bytes read, which FP8 halves against bf16.

Unlike FP8 target weights, an FP8 draft is lossless: the draft only proposes, and the target's
verification (greedy, or rejection sampling against the distributions the FP8 draft drew from)
decides every token. What FP8 can cost is acceptance, where rounding moves the draft's argmax.
The Markov and confidence heads keep their dtype (the Markov kernels read W1 and W2 directly,
and both are small beside the lm_head). The model module is left untouched: the engine serves a
quantized copy. Glossary: T rows, K in features, N out features.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from splitserve.errors import UserError
from splitserve.models.dspark import DSparkDraft
from splitserve.target.native import linear_kernel
from splitserve.target.native.linear import quantize_fp8

DRAFT_WEIGHT_FORMATS = ("model", "fp8")
# DSparkDraft's products that a round reads whole; the heads and target_lm_head stay as they are
_FP8_PRODUCTS = ("fc", "lm_head", "layers.")


class Fp8Linear(nn.Module):
    """nn.Linear's forward over an FP8 copy of its weight: x (..., K) -> (..., N) in x's dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w8, scale = quantize_fp8(linear.weight.detach())
        self.register_buffer("w8", w8)  # (N, K) float8_e4m3fn
        self.register_buffer("scale", scale)  # (N,) float32
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def dequantized(self) -> torch.Tensor:
        """The dequantized weight (N, K) float32: what the product computes with (for checks). A
        method, not a `weight` attribute: a caller reading `.weight.dtype` would pay a full-weight
        dequantization every round, and the dtype it read (float32) would be the wrong one."""
        return self.w8.float() * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear_kernel.linear(x.reshape(-1, self.in_features), self.w8, self.scale, self.bias)  # (T, N)
        return y.view(*x.shape[:-1], self.out_features)


def served_draft(draft: nn.Module | None, weight_format: str) -> nn.Module | None:
    """The draft the engine runs: `draft` itself for "model", a copy with FP8 products for "fp8"
    (DSpark and DFlash drafts; another family is refused in one line)."""
    if weight_format not in DRAFT_WEIGHT_FORMATS:
        raise UserError(f"draft_weight_format={weight_format!r}: one of {', '.join(DRAFT_WEIGHT_FORMATS)}")
    if draft is None or weight_format == "model":
        return draft
    if not isinstance(draft, DSparkDraft):
        raise UserError(f"draft_weight_format=fp8 serves DSpark and DFlash drafts, not a {type(draft).__name__}")
    products = {name: m for name, m in draft.named_modules()
                if isinstance(m, nn.Linear) and name.startswith(_FP8_PRODUCTS)}
    # The copy shares what it does not change (the frozen embedding and target lm_head, and the
    # products it replaces), so only the trained small weights are duplicated.
    shared = [draft.embed_tokens, getattr(draft, "target_lm_head", None), *products.values()]
    served = copy.deepcopy(draft, memo={id(m): m for m in shared if m is not None})
    for name, module in products.items():
        parent, _, child = name.rpartition(".")
        setattr(served.get_submodule(parent) if parent else served, child, Fp8Linear(module))
    return served.eval()
