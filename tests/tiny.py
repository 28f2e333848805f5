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


def tiny_draft_round(seed: int, head: str = "vanilla", gamma: int = 6):
    """A tiny draft whose Markov bias is strong enough to reorder tokens, and one round's inputs at
    position 13 of a random sequence -> (draft, context K/V, anchor id ())."""
    target = tiny_target(seed=seed)
    draft = tiny_draft(target, block_size=gamma, markov_rank=8, markov_head_type=head).eval()
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.5)
    ids = torch.randint(0, VOCAB - 1, (1, 14), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ctx = draft.context_kv(target.capture(ids).aux[:, :13], torch.arange(13)[None])
    return draft, ctx, ids[0, 13]


def random_samples(lengths, vocab: int, seed: int = 0):
    """One TokenizedSample of random ids per length, every token trained."""
    from splitserve.data.chat import TokenizedSample

    g = torch.Generator().manual_seed(seed)
    return [TokenizedSample(torch.randint(vocab, (n,), generator=g).tolist(), [1] * n, f"s{i}", False)
            for i, n in enumerate(lengths)]


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


def check_draft_ties(draft):
    """Make every greedy round of `draft.draft` first check that the logits it picked its tokens
    from have no near tie (floats.assert_tie_free): two code paths drafting from the same context
    (another context layout, other shapes) then propose the same tokens on any CPU."""
    from floats import assert_tie_free

    real = draft.draft

    def checked(ctx_kv, anchor_id, anchor_pos, temperature=0.0, generator=None, ctx_mask=None, **kw):
        tokens, probs, conf = real(ctx_kv, anchor_id, anchor_pos, temperature, generator, ctx_mask=ctx_mask, **kw)
        if temperature <= 0:
            pos = (anchor_pos + torch.arange(draft.arch.block_size, device=anchor_id.device))[None]
            block = draft.block_inputs(anchor_id.view(1))
            with torch.no_grad():
                if kw.get("attend") is not None:  # the engine's in-place path (rewrites the same block K/V)
                    h = draft.backbone_cached(block, pos, ctx_kv, kw["window"], kw["attend"])[0]
                else:
                    h = draft.backbone(block, pos, ctx_kv, ctx_mask)[0]
                logits = draft.logits(h, torch.cat([anchor_id.view(1), tokens[:-1]]))
            assert_tie_free(logits, f"draft round at position {int(anchor_pos)}")
        return tokens, probs, conf

    draft.draft = checked
    return draft


def save_sharp_smol(out, seed: int = 0, layers: int = 4):
    """A small random Llama with SmolLM2's tokenizer and a x20 untied lm_head, so greedy
    continuations are not near-ties that another code path (padding, a speculative server)
    could flip."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from splitserve.assets import smollm2_dir

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


# Chat rows in every input form gen reads: messages, prompt/response, an id with a system turn
# and an unanswered user turn, prompt-only with a system prompt, and a repeat (id "#2").
GEN_ROWS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "Paris."}]},
    {"prompt": "Give me a synonym for happy.", "response": "Cheerful."},
    {"id": "conv-3", "messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "Why is the sky blue?"},
                                  {"role": "assistant", "content": "Scattering."},
                                  {"role": "user", "content": "And at sunset?"}]},
    {"prompt": "Write a haiku about autumn.", "system": "You are a poet."},
    {"messages": [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "Paris."}]},  # a repeat: gets id "#2"
]


def tiny_smol_run(tiny_smol_dir, train_path, run_dir, max_length: int = 96):
    """A two-step CPU training run of a 1-layer γ=4 draft on the tiny SmolLM2-shaped target."""
    from splitserve.config import DataConfig, EvalConfig, RunConfig, TrainConfig

    return RunConfig(
        target=TargetConfig(name="tiny-smol", path=str(tiny_smol_dir), layer_ids=[0, 1, 2], device="cpu"),
        draft=DraftConfig(num_layers=1, block_size=4, markov_rank=4, intermediate_size=32),
        data=DataConfig(train_path=str(train_path), max_length=max_length),
        train=TrainConfig(max_steps=2, batch_size=2, anchors_per_seq=4, save_every=100, log_every=1, device="cpu"),
        eval=EvalConfig(enabled=False),
        run_dir=str(run_dir),
    )
