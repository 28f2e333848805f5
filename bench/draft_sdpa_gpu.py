"""Does the draft's serving attention backend change the round? cuDNN's fused SDPA (what PyTorch
picks on Hopper for grouped K/V with a mask) against the memory-efficient kernel on K/V repeated
to the query heads, inside the engine's CUDA graphs, SmolLM2 shape, random weights.

    python bench/draft_sdpa_gpu.py [--shape smollm2] [--iters 30] [--out FILE]

Traced profiles of the round (docs/results/engine_h200.md) show a long gap between a memset and
each cuDNN attention kernel of the draft; this times the untraced draft and round graphs
(round_profile.component_costs) with each backend, same engine settings (native decoder, eager
draft), so the gap's real cost is the difference.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from engine_floor_gpu import variant_config
from roles_gpu import random_target, untrained_draft
from round_profile import component_costs
from torch.nn.attention import SDPBackend, sdpa_kernel

from splitserve.evaluation.bench import synthetic_prompts
from splitserve.models import layers
from splitserve.speculative.engine import Engine


class _RepeatedKV:
    """Stands in for torch.nn.functional inside models/layers.py: grouped K/V repeated to the query
    heads, then the memory-efficient kernel (it takes a mask, not grouped K/V)."""

    def __getattr__(self, name):
        return getattr(F, name)

    @staticmethod
    def scaled_dot_product_attention(q, k, v, attn_mask=None, enable_gqa=False, **kw):
        if enable_gqa and k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    target = random_target(args.shape)
    draft = untrained_draft(target, 4, 16)
    prompt = synthetic_prompts(target.info.vocab_size, 1, args.prompt_len, 0, {draft.arch.mask_token_id})[0]
    results = {}
    for backend in ("cudnn (default)", "efficient, repeated K/V", "cudnn (default), again"):
        layers.F = _RepeatedKV() if backend.startswith("efficient") else F
        engine = Engine(target, draft, variant_config("native", args.prompt_len + 200))
        out = component_costs(engine, prompt, args.iters)
        results[backend] = {k: out[k] for k in ("t_draft_ms", "t_verify_ms", "t_round_ms", "t_decode_ms")}
        print(backend, {k: round(v, 4) for k, v in results[backend].items()}, flush=True)
        del engine
    layers.F = F
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "shape": args.shape,
                                              "results": results}, indent=1))


if __name__ == "__main__":
    main()
