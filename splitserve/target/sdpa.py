"""Attention backends for variable-length work: training steps and target captures.

cuDNN's fused attention (PyTorch's preferred SDPA backend on Hopper) builds an execution plan
for every new input shape. Serving reuses a few fixed shapes, so the plans are cached there.
Training sees a new sequence length at almost every step, so plan building lands on the host
in almost every step, and it costs far more than the step's attention itself
(docs/results/train_step_h200.md measures it). The FlashAttention and memory-efficient kernels
need no per-shape plan. Neither takes grouped K/V together with a mask on CUDA: that call would fall
to the math kernel and its (B, H, Q, K) fp32 scores, so the draft's training attention repeats
K/V to the query heads first (models/layers.py, InjectedAttention).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from torch.nn.attention import SDPBackend, sdpa_kernel

_NO_PER_SHAPE_PLANS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def varlen_sdpa() -> AbstractContextManager:
    """Within this context, SDPA picks among backends that need no per-shape setup."""
    return sdpa_kernel(_NO_PER_SHAPE_PLANS)
