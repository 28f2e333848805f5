"""Tiny random targets that ship MTP layers, saved as checkpoints (tests/test_mtp*.py).

No real MTP weights are available offline: these are random. A DeepSeek-V3 (MLA, MoE, one MTP
layer under model.layers.N.) and a Qwen3-Next (gated DeltaNet among full attention, MoE, one MTP
layer under mtp.). The MTP decoder layer's weights are written in the checkpoint's own format
(per-expert matrices) by saving a one-layer model of the target's class and renaming its layer.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

VOCAB = 96


def deepseek_v3_config(mtp_layers: int = 1):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                            n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                            first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                            qk_nope_head_dim=8, v_head_dim=12, num_nextn_predict_layers=mtp_layers,
                            max_position_embeddings=256, tie_word_embeddings=False,
                            architectures=["DeepseekV3ForCausalLM"])


def qwen3_next_config(mtp_layers: int = 1):
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                           tie_word_embeddings=False, layer_types=["linear_attention", "full_attention"] * 2,
                           num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, linear_num_value_heads=2,
                           linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                           mtp_num_hidden_layers=mtp_layers, architectures=["Qwen3NextForCausalLM"])


def _layer_in_checkpoint_format(config, index: int, seed: int) -> dict[str, torch.Tensor]:
    """Decoder layer `index` of a one-layer, full-attention, MoE model of the config's class, as
    save_pretrained writes it (per-expert matrices): {name inside the layer: tensor}."""
    from transformers import AutoModelForCausalLM

    one = copy.deepcopy(config)
    one.num_hidden_layers = 1
    if getattr(one, "layer_types", None) is not None:
        one.layer_types = ["full_attention"]
    if getattr(one, "first_k_dense_replace", None):
        one.first_k_dense_replace = 0
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(one)
    with torch.no_grad():
        for p in model.model.layers[0].parameters():
            p.normal_(0.1 if p.dim() == 1 else 0.0, 0.2)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        with safe_open(str(Path(tmp) / "model.safetensors"), "pt") as f:
            return {k[len("model.layers.0."):]: f.get_tensor(k) for k in f.keys() if k.startswith("model.layers.0.")}


def _head(dim: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {"enorm": 1 + 0.1 * torch.randn(dim, generator=g), "hnorm": 1 + 0.1 * torch.randn(dim, generator=g),
            "proj": torch.randn(dim, 2 * dim, generator=g) * 0.2, "out": 1 + 0.1 * torch.randn(dim, generator=g)}


def save_mtp_target(out: Path, kind: str = "deepseek_v3", seed: int = 0, with_mtp: bool = True) -> Path:
    """A tiny random target with `kind`'s MTP layer in its checkpoint (with_mtp=False: its config
    declares the layer, its weights lack it, as after a conversion that drops them)."""
    from transformers import AutoModelForCausalLM

    config = deepseek_v3_config() if kind == "deepseek_v3" else qwen3_next_config()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # sharp logits: greedy continuations are not near-ties
    model.save_pretrained(out)
    if not with_mtp:
        return out
    file = out / "model.safetensors"
    with safe_open(str(file), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    n, d = config.num_hidden_layers, config.hidden_size
    head = _head(d, torch.Generator().manual_seed(seed + 1))
    layer = _layer_in_checkpoint_format(config, 0, seed + 2)
    if kind == "deepseek_v3":
        p = f"model.layers.{n}."
        tensors |= {p + k: v for k, v in layer.items()}
        tensors |= {p + "enorm.weight": head["enorm"], p + "hnorm.weight": head["hnorm"],
                    p + "eh_proj.weight": head["proj"], p + "shared_head.norm.weight": head["out"],
                    p + "embed_tokens.weight": tensors["model.embed_tokens.weight"].clone(),
                    p + "shared_head.head.weight": tensors["lm_head.weight"].clone()}
    else:  # Qwen3-Next's norms are 1 + w: store w
        tensors |= {"mtp.layers.0." + k: v for k, v in layer.items()}
        tensors |= {"mtp.pre_fc_norm_embedding.weight": head["enorm"] - 1,
                    "mtp.pre_fc_norm_hidden.weight": head["hnorm"] - 1,
                    "mtp.fc.weight": head["proj"], "mtp.norm.weight": head["out"] - 1}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(file), metadata={"format": "pt"})
    return out


def load_mtp_target(path: Path, name: str = "tiny-mtp"):
    """The saved target as the transformers backend wraps it (no tokenizer: ids only)."""
    from splitserve.config import TargetConfig
    from splitserve.target.hf import load_causal_lm, wrap_hf_model

    model = load_causal_lm(str(path), torch.float32, torch.device("cpu"))
    return wrap_hf_model(model, TargetConfig(name=name, path=str(path), layer_rule="last", device="cpu"))


def mtp_draft(target, steps: int = 3):
    from splitserve.config import DraftConfig
    from splitserve.models.build import build_draft, resolve_arch

    arch = resolve_arch(DraftConfig(family="mtp", ttt_steps=steps), target.info, target.model.config)
    return build_draft(arch, target).eval()


def config_json(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())
