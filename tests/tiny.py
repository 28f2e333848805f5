"""Tiny random models for unit tests (acceptance claims never come from these)."""

from __future__ import annotations

import torch

from splitserve.config import DraftConfig, TargetConfig
from splitserve.models.build import build_draft, resolve_arch
from splitserve.target.hf import wrap_hf_model

VOCAB = 96
MASK_ID = VOCAB - 1


def tiny_target(seed: int = 0, layers: int = 6, vocab: int = VOCAB, hidden: int = 32, layer_ids=(1, 2, 4)):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    # Sharper logits than the default init so greedy continuations are not all near-ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return wrap_hf_model(model, TargetConfig(name="tiny-llama", layer_ids=list(layer_ids)))


def tiny_draft(target, block_size: int = 4, markov_rank: int = 8, layers: int = 1, **kw):
    kw.setdefault("mask_token_id", target.info.vocab_size - 1)
    cfg = DraftConfig(block_size=block_size, num_layers=layers, markov_rank=markov_rank, **kw)
    arch = resolve_arch(cfg, target.info, target.model.config)
    return build_draft(arch, target)


def save_tiny_smol(out, seed: int = 0, layers: int = 4):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from splitserve.assets import smollm2_dir

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def export_tiny_draft(target_dir, out, block_size: int = 4, seed: int = 0):
    """An exported DSpark draft (Markov bias switched on) for the HF target saved at target_dir."""
    from splitserve.export import export_draft
    from splitserve.target.hf import load_hf_target

    target = load_hf_target(TargetConfig(name="tiny-smol", path=str(target_dir), layer_ids=[0, 1, 2], device="cpu"))
    torch.manual_seed(seed)
    draft = tiny_draft(target, block_size=block_size, markov_rank=4)
    torch.nn.init.normal_(draft.markov.w2.weight, std=0.5)
    return export_draft(draft, out, target.info)
