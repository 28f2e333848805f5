"""The weight layout both serving exports share: DFlash-family names, q/k/v and gate/up unfused.

SGLang's DSPARK loader (sglang 0.5.23 python/sglang/srt/models/dflash.py + models/dspark.py) and
the `speculators` DSpark model that vLLM serves (speculators 0.9.0
speculators/models/dflash/core.py + models/dspark/model_definitions.py; vLLM 0.33
model_executor/models/qwen3_dspark.py loads it) read the same tensor names, so one key map
serves both. Neither wants the embedding or lm_head: both take the target's own.

Glossary: D hidden, V vocab, m captured layers, r Markov rank, γ block size.
"""

from __future__ import annotations

import torch

from splitserve.errors import UserError
from splitserve.models.dspark import DSparkDraft

# Our DSparkDraft parameter (layer-local part) -> the checkpoint name. `layers.{i}.` is kept.
LAYER_KEYS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    # SGLang fuses these into qkv_proj (load_weights' stacked_params_mapping, shards q, k, v);
    # speculators keeps three nn.Linear (Qwen3DFlashAttention).
    "self_attn.q_proj.weight": "self_attn.q_proj.weight",
    "self_attn.k_proj.weight": "self_attn.k_proj.weight",
    "self_attn.v_proj.weight": "self_attn.v_proj.weight",
    "self_attn.o_proj.weight": "self_attn.o_proj.weight",
    # per-head RMSNorm(head_dim), as Qwen3
    "self_attn.q_norm.weight": "self_attn.q_norm.weight",
    "self_attn.k_norm.weight": "self_attn.k_norm.weight",
    # SGLang: gate_up_proj shards 0/1 (SiluAndMul takes gate first); speculators: Qwen3MLP
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
# Our parameter -> the checkpoint name, outside the layers.
TOP_KEYS = {
    "fc.weight": "fc.weight",  # W_c: (D, m*D), no bias
    "ctx_norm.weight": "hidden_norm.weight",  # the RMSNorm after fc
    "norm.weight": "norm.weight",
    # markov_w1 = Embedding(V, r), markov_w2 = Linear(r, V, no bias)
    "markov.w1.weight": "markov_head.markov_w1.weight",
    "markov.w2.weight": "markov_head.markov_w2.weight",
    # gated: gate_proj = Linear(D + r, r), input cat([h, W1 x])
    "markov.gate.weight": "markov_head.gate_proj.weight",
    "markov.gate.bias": "markov_head.gate_proj.bias",
    # rnn: joint_proj = Linear(2r + D, 3r), input cat([state, W1 x, h]), output (gate, cand, out)
    "markov.joint.weight": "markov_head.joint_proj.weight",
    "markov.joint.bias": "markov_head.joint_proj.bias",
    # confidence head: proj = Linear(D [+ r], 1, bias)
    "confidence.proj.weight": "confidence_head.proj.weight",
    "confidence.proj.bias": "confidence_head.proj.bias",
}
# Shared with the target and never written.
SKIPPED = ("embed_tokens.", "lm_head.")


def checkpoint_name(ours: str) -> str:
    """Our state-dict key -> the checkpoint key (KeyError for a key neither loader has a slot for)."""
    if ours.startswith("layers."):
        _, idx, rest = ours.split(".", 2)
        return f"layers.{idx}.{LAYER_KEYS[rest]}"
    return TOP_KEYS[ours]


def ascending_layers(draft: DSparkDraft) -> tuple[list[int], torch.Tensor]:
    """Both servers capture target layers in ascending order and concatenate them in that order
    (SGLang: set_dflash_layers_to_capture and the decoder loop of e.g. models/qwen3.py; vLLM: the
    aux_hidden_state_layers loop of e.g. models/llama.py), so fc's m column blocks are permuted to
    ascending layer ids. -> (sorted ids, fc weight (D, m*D))."""
    ids = list(draft.arch.target_layer_ids)
    if len(set(ids)) != len(ids):  # a user's draft, not a bug here: one line at the CLI
        raise UserError(f"the draft's target_layer_ids {ids} repeat a layer: a server captures each layer once; "
                        "retrain it with distinct target.layer_ids (or a smaller target.num_capture_layers)")
    order = sorted(range(len(ids)), key=ids.__getitem__)
    d = draft.arch.hidden_size
    w = draft.fc.weight.detach()  # (D, m*D)
    blocks = w.view(w.shape[0], len(ids), d)[:, order]  # (D, m, D) in ascending layer order
    return [ids[i] for i in order], blocks.reshape(w.shape[0], len(ids) * d)


def served_weights(draft: DSparkDraft) -> dict[str, torch.Tensor]:
    """The DSpark tensors by checkpoint name (fp32, as trained), fc permuted to ascending layers.

    A markov_rank=0 (DFlash-style) draft gets a rank-1 vanilla Markov head with W2 = 0: both
    servers' DSpark models require markov_rank > 0, and B_k = W2 W1[x] = 0 leaves the draft's
    own distribution unchanged."""
    a = draft.arch
    _, fc = ascending_layers(draft)
    out = {}
    for name, t in draft.state_dict().items():
        if name.startswith(SKIPPED):
            continue
        out[checkpoint_name(name)] = fc if name == "fc.weight" else t.detach()
    if a.markov_rank == 0:
        out["markov_head.markov_w1.weight"] = torch.zeros(a.vocab_size, 1)
        out["markov_head.markov_w2.weight"] = torch.zeros(a.vocab_size, 1)
    return out
