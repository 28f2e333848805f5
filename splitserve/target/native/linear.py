"""Weight-only linear layers for batch-1 decode: the plain-PyTorch reference.

Why: a decode step (T = 1) or a verify step (T = γ+1 <= 17) multiplies a handful of activation
rows by every weight matrix of the model once, so its time is the time to read the weights from
memory, not the arithmetic. Storing the weights in FP8 (e4m3, one float32 scale per output row)
halves the bytes read against bf16, while the activations and the accumulation stay in their own
precision ("weight-only" quantisation). It is not lossless against bf16: each weight is rounded to
3 mantissa bits, so an FP8 target's logits differ from the bf16 target's, and greedy output may
differ too; exactness checks compare a path with itself, not FP8 with bf16.

`linear_kernel.py` holds the Triton kernel with the same signature; this file is what it must
agree with, and what runs on a CPU.
Glossary: T tokens (rows of x), K in features, N out features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value


def check_args(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> None:
    """The contract both implementations share; ValueError with what is wrong."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"linear: x must be (T, K) and w (N, K), got x {tuple(x.shape)} and w {tuple(w.shape)}")
    n = w.shape[0]
    if w.dtype == FP8:
        if scale is None:
            raise ValueError("linear: an fp8 weight needs its per-row scale (N,) float32, from quantize_fp8")
        if scale.shape != (n,) or scale.dtype != torch.float32:
            raise ValueError(f"linear: scale must be ({n},) float32, got {tuple(scale.shape)} {scale.dtype}")
    elif w.dtype != x.dtype:
        raise ValueError(f"linear: w must be {x.dtype} like x, or {FP8}, got {w.dtype}")
    elif scale is not None:
        raise ValueError(f"linear: scale is only for fp8 weights, w is {w.dtype}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"linear: bias must be ({n},), got {tuple(bias.shape)}")


def linear(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x (T, K), w (N, K) of x's dtype or fp8, scale (N,) fp32 iff fp8, bias (N,) -> y (T, N), x's dtype."""
    check_args(x, w, scale, bias)
    if w.dtype != FP8:
        return F.linear(x, w, bias)
    w_deq = w.float() * scale[:, None]  # (N, K) float32
    y = x.float() @ w_deq.T  # (T, N) float32
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) float -> (w8 (N, K) fp8 e4m3fn, scale (N,) float32), w ~= w8.float() * scale[:, None].

    One scale per output row: it factors out of each output's sum over K, so the kernel applies
    it once per output instead of once per weight. A row's absmax maps to 448, the top of e4m3.
    """
    w32 = w.float()
    absmax = w32.abs().amax(dim=1)  # (N,)
    scale = torch.where(absmax > 0, absmax / FP8_MAX, torch.ones_like(absmax))  # an all-zero row stays zero
    w8 = (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return w8, scale
