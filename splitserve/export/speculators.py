"""`splitserve export --format speculators`: the checkpoint vLLM serves with `"method": "dspark"`.

The layout is the one the `speculators` library (vLLM's draft library) saves for its DSpark model:
config.json parsed by speculators 0.9.0 speculators/models/dspark/config.py
(DSparkSpeculatorConfig, a DFlashSpeculatorConfig plus Markov / confidence fields) and
model.safetensors with DSparkDraftModel's state dict minus the verifier-owned tensors
(speculators/models/dflash/core.py: embed_tokens, lm_head for a full-vocab draft, verifier_lm_head,
verifier_norm are reloaded from the verifier). Tensor names are export/names.py's.

What vLLM 0.33 reads from it (source of each key):
  vllm/transformers_utils/configs/speculators/algos.py update_dspark: transformer_layer_config
      becomes the draft's HF config; `aux_hidden_state_layer_ids` (required) are capture points
      "before layer i" and become target_layer_ids = [i - 1 ...], so ours (HF `hidden_states[l+1]`)
      are written as l + 1; `sample_from_anchor` defaults to False there (a 1 + N block with the
      anchor as a bonus token), so it is written as true: slot k of [anchor, M, ..] predicts the
      token k+1 after the anchor, as splitserve trains (DSPARK.md).
  vllm/v1/worker/gpu/spec_decode/dspark/speculator.py DSparkSpeculator: with sample_from_anchor,
      num_speculative_tokens query rows per request (anchor + N-1 masks), so N must be γ.
  vllm/model_executor/models/qwen3_dspark.py Qwen3DSparkModel: a vanilla Markov head only
      (markov_w1, markov_w2) whatever markov_head_type says, and a float32 confidence head.
Hybrid targets (recurrent layers among attention ones): export/hybrid_serving.py adds the extra
`vllm serve` flags, or gives the one-line reason vLLM cannot serve the target (its model class
lacks the SupportsEagle3 hidden-state capture dspark needs); the files are written either way.

Glossary: D hidden, V vocab, m captured layers, r Markov rank, γ block size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from splitserve.export.engine_versions import layout_checked
from splitserve.export.hybrid_serving import serving_notes
from splitserve.export.names import ascending_layers, served_weights
from splitserve.models.dspark import DSparkDraft
from splitserve.models.dspark_vocab import expand_vocab

SPECULATORS_VERSION = "0.9.0"  # the release the layout was read from and tested against
# speculators/models/dspark/config.py: markov_head_type: Literal["vanilla", "gated", "rnn"]
SPECULATORS_HEAD_TYPES = ("vanilla", "gated", "rnn")
# qwen3_dspark.py DSparkMarkovHead has markov_w1 / markov_w2 only.
VLLM_HEAD_TYPES = ("vanilla",)
FP32_ALWAYS = ("confidence_head.",)  # vLLM's DSparkConfidenceHead keeps params_dtype=float32


@dataclass(frozen=True)
class SpeculatorsExport:
    """What `export_speculators` wrote, and what `vllm_command` needs."""

    out_dir: Path
    block_size: int
    markov_head_type: str  # as served (rank-0 drafts: "vanilla")
    serve_flags: tuple[str, ...] = ()  # what a hybrid target adds to `vllm serve` (export/hybrid_serving.py)
    refused: str | None = None  # one line, where vLLM cannot serve a DSpark draft for the target


def check_head_type(markov_rank: int, head: str) -> str:
    """The head type the export will carry; refuses one speculators has no class for."""
    served = head if markov_rank > 0 else "vanilla"
    if served not in SPECULATORS_HEAD_TYPES:
        raise ValueError(f"markov_head_type={head!r} has no speculators {SPECULATORS_VERSION} DSpark head "
                         f"(it has {', '.join(SPECULATORS_HEAD_TYPES)}): export this draft with --format hf or sglang")
    return served


def decoder_shape(a, max_position_embeddings: int) -> dict:
    """The decoder keys every exported layer config carries (vLLM builds a draft's HF config from
    its layer config alone, so a key left to a class default would be missing there). a: a draft
    arch (DSpark's or EAGLE-3's)."""
    return {
        "vocab_size": a.vocab_size,
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_hidden_layers": a.num_layers,
        "num_attention_heads": a.num_heads,
        "num_key_value_heads": a.num_kv_heads,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": a.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": a.rope_theta},
        "max_position_embeddings": max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
    }


def transformer_layer_config(draft: DSparkDraft, max_position_embeddings: int) -> dict:
    """The Qwen3 decoder config of the draft backbone, every key written."""
    a = draft.arch
    return {
        "model_type": "qwen3",
        **decoder_shape(a, max_position_embeddings),
        # full attention, non-causal inside the block (qwen3_dflash.py _dflash_layer_causal)
        "layer_types": ["full_attention"] * a.num_layers,
        "use_sliding_window": False,
        "sliding_window": None,
    }


def speculators_config(
    draft: DSparkDraft,
    verifier_path: str,
    verifier_architectures: list[str],
    target_hidden_size: int,
    max_position_embeddings: int,
    dtype: torch.dtype,
) -> dict:
    """config.json (a plain dict: every key written on purpose)."""
    a = draft.arch
    layer_ids, _ = ascending_layers(draft)
    head = check_head_type(a.markov_rank, a.markov_head_type)
    return {
        "architectures": ["DSparkSpeculator"],  # DSparkSpeculatorConfig's default
        "speculators_model_type": "dspark",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": transformer_layer_config(draft, max_position_embeddings),
        "draft_vocab_size": a.vocab_size,  # full vocab: no t2d/d2t tables
        "target_hidden_size": target_hidden_size,
        "block_size": a.block_size,
        "aux_hidden_state_layer_ids": [i + 1 for i in layer_ids],
        "mask_token_id": a.mask_token_id,
        "sliding_window_non_causal": False,
        "sample_from_anchor": True,
        "markov_rank": max(a.markov_rank, 1),
        "markov_head_type": head,
        "enable_confidence_head": a.enable_confidence_head,
        "confidence_head_with_markov": a.markov_rank > 0,
        "speculators_config": {
            "algorithm": "dspark",
            # sample_from_anchor: all γ slots are drafts (DFlash's base_config_kwargs rule)
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": a.block_size,
                                  "verifier_accept_k": 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_path, "architectures": list(verifier_architectures)},
        },
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "splitserve": {"target_name": a.target_name, "trained_markov_rank": a.markov_rank,
                       "slot_convention": "slot k predicts anchor+k+1", "layout_checked": layout_checked("vllm")},
    }


def export_speculators(
    draft: DSparkDraft,
    out_dir: str | Path,
    verifier_path: str,
    verifier_architectures: list[str],
    target_hidden_size: int,
    max_position_embeddings: int = 32768,
    dtype: torch.dtype = torch.bfloat16,
    target_config: Any = None,
) -> SpeculatorsExport:
    """Write config.json + model.safetensors in the speculators DSpark layout.

    `target_config` (the target's HF config) selects the extra `vllm serve` flags of a hybrid
    target, or the reason vLLM cannot serve it; both are recorded under config.json's `splitserve`
    key (a dense target records neither), and the files are written either way. A draft over a
    reduced vocabulary is written expanded to the target's (models/dspark_vocab.py): speculators'
    DSpark has no id map."""
    draft = expand_vocab(draft)
    cfg = speculators_config(draft, verifier_path, verifier_architectures, target_hidden_size,
                             max_position_embeddings, dtype)
    flags, refused = serving_notes(target_config, "speculators") if target_config is not None else ([], None)
    if flags:
        cfg["splitserve"]["serve_flags"] = flags
    if refused:
        cfg["splitserve"]["serving_refused"] = refused
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    weights = {k: v.to(torch.float32 if k.startswith(FP32_ALWAYS) else dtype).contiguous().cpu()
               for k, v in served_weights(draft).items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return SpeculatorsExport(out, draft.arch.block_size, cfg["markov_head_type"], tuple(flags), refused)


def vllm_command(export: SpeculatorsExport, target_path: str) -> str:
    """`vllm serve` for an export: the target is --model, the draft the speculative config's model.

    `vllm serve DRAFT` alone (speculators' auto-detection, transformers_utils/config.py
    maybe_override_with_speculators) accepts only a hub id as the verifier, so the explicit
    form is printed; num_speculative_tokens = γ (module docstring). A hybrid target's extra flags
    follow it; ValueError (one line) where vLLM cannot serve the export."""
    if export.refused:
        raise ValueError(export.refused)
    if export.markov_head_type not in VLLM_HEAD_TYPES:
        raise ValueError(
            f"vLLM 0.33 cannot serve markov_head_type={export.markov_head_type!r}: its Qwen3 DSpark model "
            "(vllm/model_executor/models/qwen3_dspark.py DSparkMarkovHead) has the vanilla head only; "
            "serve this draft with SGLang (--format sglang)")
    spec = {"method": "dspark", "model": str(export.out_dir), "num_speculative_tokens": export.block_size}
    parts = [f"vllm serve {target_path}", f"--speculative-config '{json.dumps(spec)}'", *export.serve_flags]
    return " \\\n    ".join(parts)
