"""The draft's training attention on a GPU: grouped K/V passed with `enable_gqa` vs K/V repeated
to the query heads, under the backends training allows (target/sdpa.py: no cuDNN).

    python bench/draft_attention_gpu.py --context 8192 --positions 4096 --out attn.json
    python bench/draft_attention_gpu.py --device cpu --context 256 --positions 128   (smoke test)

Shapes are the SmolLM2-135M draft's (9 query heads, 3 KV heads, head dim 64, bf16): `--positions`
block positions (anchors x γ) attend to `--context` context positions plus the block positions,
through a boolean mask, as in `InjectedAttention` during training. For each form it reports
which single backend accepts the call, and the forward + backward time and peak memory of one
layer under `varlen_sdpa()`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from splitserve.target.sdpa import varlen_sdpa


def inputs(context: int, positions: int, dev: torch.device, heads: int = 9, kv_heads: int = 3, hd: int = 64):
    dt = torch.bfloat16
    q = torch.randn(1, heads, positions, hd, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(1, kv_heads, context + positions, hd, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(1, kv_heads, context + positions, hd, device=dev, dtype=dt, requires_grad=True)
    # Each position sees a prefix of the context and its own block of 8: a mask of the same form.
    pos = torch.arange(positions, device=dev)
    anchor = (pos // 8) * (context // max(positions // 8, 1))
    keys = torch.arange(context + positions, device=dev)
    ctx_ok = keys[None, :context] < anchor[:, None]
    blk_ok = (keys[None, context:] - context) // 8 == pos[:, None] // 8
    mask = torch.cat([ctx_ok, blk_ok], dim=1)[None, None]  # (1, 1, P, C+P)
    return q, k, v, mask


def call(form: str, q, k, v, mask):
    if form == "gqa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask)


def accepted_by(form: str, q, k, v, mask) -> list[str]:
    ok = []
    for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
        try:
            with sdpa_kernel([b]), torch.no_grad():
                call(form, q, k, v, mask)
            ok.append(b.name)
        except RuntimeError:
            pass
    return ok


def measure(form: str, q, k, v, mask, reps: int = 5) -> dict:
    cuda = q.is_cuda
    with varlen_sdpa():
        for _ in range(2):
            call(form, q, k, v, mask).float().sum().backward()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        for _ in range(reps):
            call(form, q, k, v, mask).float().sum().backward()
        if cuda:
            torch.cuda.synchronize()
    out = {"fwd_bwd_ms": (time.perf_counter() - t0) / reps * 1e3}
    if cuda:
        out["peak_GiB_above_inputs"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--positions", type=int, default=4096)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (no memory figures)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device(args.device)
    q, k, v, mask = inputs(args.context, args.positions, dev)
    with torch.no_grad():
        a, b = call("gqa", q, k, v, mask), call("repeat", q, k, v, mask)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    result = {"device": name, "torch": torch.__version__, "context": args.context,
              "positions": args.positions, "max_abs_diff_gqa_vs_repeat": (a.float() - b.float()).abs().max().item()}
    for form in ("gqa", "repeat"):
        result[form] = {"backends_accepting": accepted_by(form, q, k, v, mask), **measure(form, q, k, v, mask)}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
