"""Weight-only linear layers for batch-1 decode, and the fused products a layer is made of: the
plain-PyTorch reference.

Why: a decode step (T = 1) or a verify step (T = γ+1 <= 17) multiplies a handful of activation
rows by every weight matrix of the model once, so its time is the time to read the weights from
memory, not the arithmetic. Storing the weights in FP8 (e4m3, one float32 scale per output row)
halves the bytes read against bf16, while the activations and the accumulation stay in their own
precision ("weight-only" quantisation). It is not lossless against bf16: each weight is rounded to
3 mantissa bits, so an FP8 target's logits differ from the bf16 target's, and greedy output may
differ too; exactness checks compare a path with itself, not FP8 with bf16.

`product` is one layer product with what surrounds it in a decoder layer folded in: the RMSNorm
before it (q|k|v and gate|up read the normalised residual stream), SiLU·up after the gate|up
product, the residual add after o and down. Each is the composition of the separate references,
rounded where they round, so a fused kernel can be checked against it piece by piece.

`linear_kernel.py` holds the Triton kernel with the same signatures; this file is what it must
agree with, and what runs on a CPU.
Glossary: T tokens (rows of x), K in features, N out features, F FFN size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from splitserve.target.native.pointwise import rms_norm, silu_mul

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


def check_product(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
                  norm_weight: torch.Tensor | None, residual: torch.Tensor | None, silu: bool) -> None:
    check_args(x, w, scale, bias)
    if norm_weight is not None and (norm_weight.shape != (x.shape[1],) or norm_weight.dtype != x.dtype):
        raise ValueError(f"product: norm_weight must be ({x.shape[1]},) {x.dtype}, got "
                         f"{tuple(norm_weight.shape)} {norm_weight.dtype}")
    if silu and w.shape[0] % 2:
        raise ValueError(f"product: silu needs the packed [gate | up] rows, an even count, got {w.shape[0]}")
    n_out = w.shape[0] // 2 if silu else w.shape[0]
    if residual is not None and (residual.shape != (x.shape[0], n_out) or residual.dtype != x.dtype):
        raise ValueError(f"product: residual must be ({x.shape[0]}, {n_out}) {x.dtype}, got "
                         f"{tuple(residual.shape)} {residual.dtype}")


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


def product(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
    norm_weight: torch.Tensor | None = None, eps: float = 0.0, residual: torch.Tensor | None = None,
    silu: bool = False,
) -> torch.Tensor:
    """x (T, K) -> (T, N), or (T, N/2) with silu:

        h = rms_norm(x) * norm_weight     when norm_weight is given (x is then the residual stream)
        y = h @ w.T (+ bias)              w (N, K) as in `linear`
        y = silu(y[:, :N/2]) * y[:, N/2:] when silu (w is the packed [gate | up])
        y = residual + y                  when residual is given
    """
    check_product(x, w, scale, bias, norm_weight, residual, silu)
    h = x if norm_weight is None else rms_norm(x, norm_weight, eps)
    y = linear(h, w, scale, bias)
    if silu:
        y = silu_mul(y)
    return y if residual is None else residual + y


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
