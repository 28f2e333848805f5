"""`splitserve export --format sglang`: the checkpoint layout SGLang's block-draft loaders read.

Two layouts, one key map. Every name below comes from SGLang's source (sgl-project/sglang):

  DSPARK  python/sglang/srt/models/dspark.py (DSparkDraftModel / Qwen3DSparkModel: the DFlash
          backbone plus `markov_head.*` and `confidence_head.*`), config parsed by
          python/sglang/srt/speculative/dspark_components/dspark_config.py
  DFLASH  python/sglang/srt/models/dflash.py (DFlashDraftModel), config parsed by
          python/sglang/srt/speculative/dflash_utils.py (parse_dflash_draft_config)

Neither loader wants the embedding or lm_head (dspark.py skips `embed_tokens.`, `lm_head.`;
dflash.py ignores names it does not own): both reuse the target's own modules, so they are
not written. q/k/v and gate/up stay separate tensors: dflash.py's load_weights fuses them
itself through its stacked_params_mapping into qkv_proj and gate_up_proj.

Block-slot convention. splitserve trains slot k of the block [anchor, M, ..., M] to predict
the token k+1 after the anchor (the anchor slot predicts too). SGLang's DSPARK proposer runs
exactly that block and emits all γ rows (dspark_components/dspark_draft.py, DraftBlockProposer
._run_forward: `(bs, gamma)` rows, every row emitted). SGLang's DFLASH worker instead feeds
block_size rows and keeps rows 1.. only (dflash_worker.py: `draft_hidden[:, 1:, :]`), so slot j
is read as the token j after the anchor: one position later than we trained. A DFLASH export
therefore loads but drafts shifted by one; a markov_rank=0 draft is served exactly through
DSPARK instead, with a rank-1 Markov head whose W2 is zero (B_k = 0, the same distribution).

Glossary: D hidden, V vocab, m captured layers, r Markov rank, L draft layers, γ block size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from splitserve.models.dspark import DSparkDraft

ALGORITHMS = ("dspark", "dflash")
# models/dspark.py registers `EntryClass = [DSparkDraftModel, Qwen3DSparkModel]` (some
# revisions only Qwen3DSparkModel); the Qwen3 name is accepted by every revision read.
ARCHITECTURE = {"dspark": "Qwen3DSparkModel", "dflash": "DFlashDraftModel"}
# Both loaders build their layers from a Qwen3-style HF config (q/k norm, SwiGLU, RMSNorm), and
# SGLang reads config.json through transformers' AutoConfig, so model_type must be one that
# transformers knows: "qwen3" (the DFlash/DSpark reference checkpoints use it too).
MODEL_TYPE = "qwen3"
STS_FILE = "sts_calibration.json"

# Our DSparkDraft parameter (layer-local part) -> SGLang's checkpoint name. Per draft layer
# `layers.{i}.` is kept on both sides.
LAYER_KEYS = {
    # models/dflash.py DFlashDecoderLayer: input_layernorm, self_attn, post_attention_layernorm, mlp
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    # models/dflash.py DFlashAttention.qkv_proj, loaded from q_proj/k_proj/v_proj (shards q, k, v)
    "self_attn.q_proj.weight": "self_attn.q_proj.weight",
    "self_attn.k_proj.weight": "self_attn.k_proj.weight",
    "self_attn.v_proj.weight": "self_attn.v_proj.weight",
    "self_attn.o_proj.weight": "self_attn.o_proj.weight",
    # models/dflash.py DFlashAttention.q_norm / k_norm: per-head RMSNorm(head_dim), as Qwen3
    "self_attn.q_norm.weight": "self_attn.q_norm.weight",
    "self_attn.k_norm.weight": "self_attn.k_norm.weight",
    # models/dflash.py DFlashMLP.gate_up_proj, loaded from gate_proj (shard 0) / up_proj (shard 1)
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
# Our parameter -> SGLang's, outside the layers.
TOP_KEYS = {
    # models/dflash.py DFlashDraftModel: fc (m*D -> D, no bias), hidden_norm, norm
    "fc.weight": "fc.weight",
    "ctx_norm.weight": "hidden_norm.weight",
    "norm.weight": "norm.weight",
    # models/dspark.py VanillaMarkov: markov_w1 = Embedding(V, r), markov_w2 = Linear(r, V, no bias)
    "markov.w1.weight": "markov_head.markov_w1.weight",
    "markov.w2.weight": "markov_head.markov_w2.weight",
    # models/dspark.py GatedMarkovHead.gate_proj = Linear(D + r, r), input cat([h, W1 x])
    "markov.gate.weight": "markov_head.gate_proj.weight",
    "markov.gate.bias": "markov_head.gate_proj.bias",
    # models/dspark.py RNNHead.joint_proj = Linear(2r + D, 3r), input cat([state, W1 x, h]),
    # output split (gate, candidate, output) in that order
    "markov.joint.weight": "markov_head.joint_proj.weight",
    "markov.joint.bias": "markov_head.joint_proj.bias",
    # models/dspark.py DSparkConfidenceHead.proj = Linear(D [+ r], 1, bias=True, dtype=float32)
    "confidence.proj.weight": "confidence_head.proj.weight",
    "confidence.proj.bias": "confidence_head.proj.bias",
}
# Shared with the target and never written (dspark.py _DSPARK_SKIPPED_WEIGHT_PREFIXES).
SKIPPED = ("embed_tokens.", "lm_head.")
# dspark.py allocates the confidence head in float32 whatever the model dtype.
FP32_ALWAYS = ("confidence_head.",)


@dataclass(frozen=True)
class SGLangExport:
    """What `export_sglang` wrote: the algorithm to serve it with and its block size γ."""

    out_dir: Path
    algorithm: str
    block_size: int
    sts_file: Path | None


def sglang_name(ours: str) -> str:
    """Our state-dict key -> SGLang's checkpoint key (KeyError for a key SGLang has no slot for)."""
    if ours.startswith("layers."):
        _, idx, rest = ours.split(".", 2)
        return f"layers.{idx}.{LAYER_KEYS[rest]}"
    return TOP_KEYS[ours]


def pick_algorithm(markov_rank: int, requested: str | None) -> str:
    """DSPARK unless asked otherwise; DFLASH cannot carry a Markov head (its loader drops it)."""
    algo = (requested or "dspark").lower()
    if algo not in ALGORITHMS:
        raise ValueError(f"SGLang algorithm must be one of {ALGORITHMS}, got {requested!r}")
    if algo == "dflash" and markov_rank > 0:
        raise ValueError(
            f"a DFLASH checkpoint has no Markov head, but this draft has markov_rank={markov_rank}: "
            "export it as DSPARK (the default)"
        )
    return algo


def _ascending_layers(draft: DSparkDraft) -> tuple[list[int], torch.Tensor]:
    """SGLang captures target layers in ascending order and concatenates them in that order
    (set_dflash_layers_to_capture / the layer loop of e.g. models/qwen3.py), so fc's m column
    blocks are permuted to ascending layer ids. -> (sorted ids, fc weight (D, m*D))."""
    ids = list(draft.arch.target_layer_ids)
    if len(set(ids)) != len(ids):
        raise ValueError(f"target_layer_ids {ids} repeat a layer: SGLang captures each layer once")
    order = sorted(range(len(ids)), key=ids.__getitem__)
    d = draft.arch.hidden_size
    w = draft.fc.weight.detach()  # (D, m*D)
    blocks = w.view(w.shape[0], len(ids), d)[:, order]  # (D, m, D) in ascending layer order
    return [ids[i] for i in order], blocks.reshape(w.shape[0], len(ids) * d)


def sglang_weights(draft: DSparkDraft, algorithm: str, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """SGLang checkpoint tensors (CPU, contiguous) for a draft."""
    a = draft.arch
    _, fc = _ascending_layers(draft)
    out = {}
    for name, t in draft.state_dict().items():
        if name.startswith(SKIPPED):
            continue
        out[sglang_name(name)] = fc if name == "fc.weight" else t.detach()
    if algorithm == "dspark" and a.markov_rank == 0:
        # DSpark requires markov_rank > 0 (dspark.py build_markov_head); a rank-1 head with
        # W2 = 0 adds B_k = W2 W1[x] = 0, so the served distribution is the draft's own.
        out["markov_head.markov_w1.weight"] = torch.zeros(a.vocab_size, 1)
        out["markov_head.markov_w2.weight"] = torch.zeros(a.vocab_size, 1)
    if algorithm == "dflash":
        out = {k: v for k, v in out.items() if not k.startswith(("markov_head.", "confidence_head."))}
    return {
        k: v.to(torch.float32 if k.startswith(FP32_ALWAYS) else dtype).contiguous().cpu() for k, v in out.items()
    }


def sglang_config(
    draft: DSparkDraft,
    algorithm: str,
    target_num_layers: int,
    max_position_embeddings: int = 32768,
    dtype: torch.dtype = torch.bfloat16,
) -> dict:
    """config.json for SGLang (a plain dict: every key is written on purpose)."""
    a = draft.arch
    layer_ids, _ = _ascending_layers(draft)
    served_rank = max(a.markov_rank, 1) if algorithm == "dspark" else 0
    dflash_config = {
        # dflash_utils.parse_dflash_draft_config reads these from dflash_config first, then the
        # top level. num_target_layers bounds-checks target_layer_ids (without it the draft's own
        # layer count is used, and any id >= L is rejected).
        "mask_token_id": a.mask_token_id,
        "target_layer_ids": layer_ids,
        "num_target_layers": target_num_layers,
        "block_size": a.block_size,
    }
    cfg = {
        "architectures": [ARCHITECTURE[algorithm]],
        "model_type": MODEL_TYPE,
        # The backbone shape, read by models/dflash.py from the HF config.
        "hidden_size": a.hidden_size,
        "num_hidden_layers": a.num_layers,
        "num_attention_heads": a.num_heads,
        "num_key_value_heads": a.num_kv_heads,
        "head_dim": a.head_dim,
        "intermediate_size": a.intermediate_size,
        "hidden_act": "silu",  # DFlashMLP rejects anything else
        "attention_bias": False,
        "rms_norm_eps": a.rms_norm_eps,
        "rope_theta": a.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": a.vocab_size,  # VanillaMarkov(vocab_size=config.vocab_size)
        "tie_word_embeddings": False,
        # Every layer full (non-causal inside the block): get_dflash_layer_types maps
        # "full_attention" to AttentionType.ENCODER_ONLY; no sliding window.
        "use_sliding_window": False,
        "layer_types": ["full_attention"] * a.num_layers,
        "torch_dtype": str(dtype).removeprefix("torch."),
        # DFlash reads block_size from dflash_config or here; DSpark's gamma is the same key.
        "block_size": a.block_size,
        "num_target_layers": target_num_layers,
        "target_layer_ids": layer_ids,
        "mask_token_id": a.mask_token_id,
        "dflash_config": dflash_config,
    }
    if algorithm == "dspark":
        # dspark_config.parse_dspark_draft_config reads markov_rank / markov_head_type from a
        # `dspark_config` dict, the text config, then the top level; dspark.py reads
        # enable_confidence_head and confidence_head_with_markov from the top level.
        cfg.update(
            markov_rank=served_rank,
            markov_head_type=a.markov_head_type,
            enable_confidence_head=a.enable_confidence_head,
            confidence_head_with_markov=a.markov_rank > 0,
        )
    # Provenance (ignored by SGLang).
    cfg["splitserve"] = {"target_name": a.target_name, "trained_markov_rank": a.markov_rank,
                         "slot_convention": "slot k predicts anchor+k+1"}
    return cfg


def sts_calibration(temperatures: list[float], source: str = "", rounds: int = 0) -> dict:
    """dspark_components/dspark_sts.py DSparkStsCalibration: {temperatures, dataset, num_samples},
    one temperature per draft position (the worker checks numel == gamma), c = sigmoid(z / T)."""
    return {"temperatures": [float(t) for t in temperatures], "dataset": source, "num_samples": int(rounds)}


def export_sglang(
    draft: DSparkDraft,
    out_dir: str | Path,
    target_num_layers: int,
    calibration: dict | None = None,
    algorithm: str | None = None,
    keep_fp32: bool = False,
    max_position_embeddings: int = 32768,
) -> SGLangExport:
    """Write config.json + model.safetensors (+ sts_calibration.json) for SGLang."""
    algo = pick_algorithm(draft.arch.markov_rank, algorithm)
    dtype = torch.float32 if keep_fp32 else torch.bfloat16
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = sglang_config(draft, algo, target_num_layers, max_position_embeddings, dtype)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(sglang_weights(draft, algo, dtype), str(out / "model.safetensors"), metadata={"format": "pt"})
    sts = None
    fits = (calibration or {}).get("fits") or []
    if algo == "dspark" and draft.confidence is not None and fits:
        sts = out / STS_FILE
        f = fits[0]
        sts.write_text(json.dumps(sts_calibration(f["temperatures"], (calibration or {}).get("source", ""),
                                                  f.get("rounds", 0)), indent=1))
    return SGLangExport(out, algo, draft.arch.block_size, sts)


def launch_command(export: SGLangExport, target_path: str = "TARGET") -> str:
    """The SGLang server command for an export (flags from python/sglang/srt/arg_groups/fields/spec.py)."""
    parts = ["python -m sglang.launch_server", f"--model-path {target_path}",
             f"--speculative-algorithm {export.algorithm.upper()}",
             f"--speculative-draft-model-path {export.out_dir}"]
    if export.algorithm == "dspark":
        parts.append(f"--speculative-dspark-block-size {export.block_size}")
        if export.sts_file is not None:
            parts.append(f"--speculative-dspark-confidence-sts-path {export.sts_file}")
    else:
        parts.append(f"--speculative-dflash-block-size {export.block_size}")
    return " \\\n    ".join(parts)
