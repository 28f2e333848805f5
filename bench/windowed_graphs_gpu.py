"""The serving engine's CUDA graphs on sliding-window (and other matrix) targets: graphed rounds
must give the same greedy tokens as eager rounds and as transformers' own `generate`.

    python bench/windowed_graphs_gpu.py --out windowed_graphs.json [--arch mistral-window ...]

Each target is a small random model (float32, lm_head x20 so greedy picks are not near ties)
with a sliding window of 8 tokens (where the family has one) and prompts of 40-60 tokens, so
every round runs past the window: a graph that baked in a mask without each layer's window, or
one captured for the wrong window width, gives other tokens. Per architecture and mode (spec,
ar) the JSON says whether graphs were captured and whether graphed == eager == generate.
The CPU suite checks the eager engine against `generate` (tests/test_target_matrix.py); CUDA
graphs need a GPU, hence this script.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

WINDOW = 8
VOCAB = 512
LOCAL = ("llama", "qwen3", "qwen3-moe", "mistral-window", "gemma2", "gemma3-text", "gemma3-multimodal", "granite")


def build(arch: str):
    import transformers as tf

    c = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    text3 = dict(c, head_dim=16, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"] * 2)
    return {
        "llama": lambda: tf.LlamaConfig(**c),
        "qwen3": lambda: tf.Qwen3Config(**c, head_dim=16),
        "qwen3-moe": lambda: tf.Qwen3MoeConfig(**c, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                               moe_intermediate_size=64),
        "mistral-window": lambda: tf.MistralConfig(**c, sliding_window=WINDOW),
        "gemma2": lambda: tf.Gemma2Config(**c, head_dim=16, sliding_window=WINDOW),
        "gemma3-text": lambda: tf.Gemma3TextConfig(**text3),
        "gemma3-multimodal": lambda: tf.Gemma3Config(
            text_config=text3, mm_tokens_per_image=4,
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14)),
        "granite": lambda: tf.GraniteConfig(**c, logits_scaling=4.0),
    }.get(arch, lambda: matrix_config(arch))()


def matrix_config(arch: str):
    """The architecture matrix's tiny config of `arch` (tests/arch_matrix.py): hybrid and purely
    recurrent targets (their recurrent mixers are scaled there too), MLA, attention sinks."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from arch_matrix import build_config

    return build_config(arch, VOCAB, 1, 2)


def check(arch: str, device: torch.device, max_tokens: int) -> dict:
    import transformers as tf

    from splitserve.config import DraftConfig, EngineConfig, TargetConfig
    from splitserve.models.build import build_draft, resolve_arch
    from splitserve.speculative.engine import Engine, SamplingParams
    from splitserve.target.hf import wrap_hf_model

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(build(arch)).to(device).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)
        if arch not in LOCAL:  # recurrent mixers scaled, so a wrong rewind changes tokens
            from arch_matrix import scale_recurrent_mixers

            scale_recurrent_mixers(model)
    target = wrap_hf_model(model, TargetConfig(name=arch, layer_ids=[0, 1, 2]))
    arch_d = resolve_arch(DraftConfig(block_size=4, num_layers=1, markov_rank=8, mask_token_id=VOCAB - 1),
                          target.info, target.config)
    draft = build_draft(arch_d, target).to(device).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB - 1, (int(n),), generator=g).tolist() for n in (40, 51, 60)]
    out = {"windows": list(target.layout.windows), "modes": {}}
    for mode in ("spec", "ar"):
        graphed = Engine(target, draft, EngineConfig(max_context=128, use_cuda_graphs=True, min_window=32))
        eager = Engine(target, draft, EngineConfig(max_context=128, use_cuda_graphs=False, min_window=32))
        res = {"graphs_enabled": graphed.graphs.enabled, "graphed_eq_eager": True, "graphed_eq_generate": True}
        for p in prompts:
            a = graphed.generate(p, SamplingParams(max_tokens=max_tokens), mode=mode).tokens
            b = eager.generate(p, SamplingParams(max_tokens=max_tokens), mode=mode).tokens
            x = torch.tensor([p], device=device)
            with torch.no_grad():
                ref = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens,
                                     do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
            res["graphed_eq_eager"] &= a == b
            res["graphed_eq_generate"] &= a == ref
        res["graphs_captured"] = len(graphed.graphs._graphs)
        res["graphs_failed"] = graphed.graphs.failed  # why capture was given up (then both run eagerly)
        out["modes"][mode] = res
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="windowed_graphs.json")
    p.add_argument("--arch", action="append", default=None)
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("windowed_graphs_gpu.py needs a CUDA GPU (CUDA graphs)")
    device = torch.device("cuda")
    archs = args.arch or ["llama", "qwen3-moe", "mistral-window", "gemma2", "gemma3-text", "gemma3-multimodal",
                          "granite"]
    report = {}
    for arch in archs:
        try:
            report[arch] = check(arch, device, args.max_tokens)
        except Exception as exc:  # one architecture's failure must not hide the others'
            report[arch] = {"error": f"{type(exc).__name__}: {exc}"}
        print(arch, json.dumps(report[arch]), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    # Equal tokens everywhere, and each mode either replayed graphs or said why it gave them up.
    ok = all("error" not in r and all(m["graphed_eq_eager"] and m["graphed_eq_generate"]
                                      and (m["graphs_captured"] or m["graphs_failed"]) for m in r["modes"].values())
             for r in report.values())
    eager = [a for a, r in report.items() if "modes" in r and any(m["graphs_failed"] for m in r["modes"].values())]
    print(f"wrote {args.out}: {'all equal' if ok else 'DIFFERENCES (see the JSON)'}"
          + (f"; graphs given up, eager: {', '.join(eager)}" if eager else ""))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
