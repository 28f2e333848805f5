"""`splitserve export --format speculators | sglang` of an EAGLE-3 draft (draft.family=eagle3).

Two layouts of the same tensors, each read from the consumer's released source:

  speculators  speculators 0.9.0 speculators/models/eagle3/ (Eagle3SpeculatorConfig,
               Eagle3DraftModel), the checkpoint vLLM 0.33.0 serves with `"method": "eagle3"`
               (vllm/transformers_utils/configs/speculators/algos.py update_eagle3 builds the
               draft's config; model_executor/models/llama_eagle3.py Eagle3LlamaForCausalLM loads it)
  sglang       SGLang 0.5.23 python/sglang/srt/models/llama_eagle3.py LlamaForCausalLMEagle3,
               served with --speculative-algorithm EAGLE3

Tensors (ours are speculators' names: models/eagle3.py was written to them):
  fc.weight (D, m*D)          column blocks permuted to ascending layer ids (both engines capture
                              and concatenate ascending; names.ascending_layers)
  layers.{i}.*                Llama layers, q/k/v and gate/up unfused (SGLang fuses them in
                              load_weights); layer 0's q/k/v read [input_layernorm(e) ; hidden_norm(g)]
  norm.weight, lm_head.weight the draft's own head over its N tokens (both engines load it:
                              SGLang's load_lm_head_from_target is False once draft_vocab_size is set)
  d2t (N,) int64, t2d (V,) bool   target id = draft id + d2t[draft id] (models/vocab_map.py);
                              written only when N < V. SGLang reads d2t alone (its hot-token map,
                              hot_token_id = d2t + arange(N)) and skips t2d, so its export holds d2t.
  embed_tokens.weight (V, D)  the target's embedding, speculators layout only, as speculators saves
                              its own EAGLE-3 checkpoints: its loader under transformers 5 leaves an
                              absent embedding as uninitialised memory (its NaN "not loaded" marker
                              is set on the meta device and lost), and vLLM shares the target's
                              embedding anyway when the two are equal (v1/worker/gpu/spec_decode/
                              eagle/utils.py _should_share). SGLang always takes the target's
                              (eagle_worker_v2.py init_lm_head: set_embed), so its export omits it.

Layer ids. Ours (arch.target_layer_ids) are the output of layer l. speculators and vLLM write
capture points "before layer i" (eagle_aux_hidden_state_layer_ids, vLLM's Llama loop captures
the stream entering layer i), so l + 1; SGLang writes eagle_config.eagle_aux_hidden_state_layer_ids
as ours and adds the 1 itself (models/llama.py set_eagle3_layers_to_capture).

Decisions forced by that source:
- norm_before_residual: false, written: the first layer keeps the un-normed g as its residual,
  which is speculators' default but not vLLM's (update_eagle3 defaults it to true).
- Later layers (num_layers > 1): SGLang's normalise their input with `hidden_norm` (its
  LlamaDecoderLayer.forward, fused with the residual add) and never read `input_layernorm`;
  vLLM and speculators use `input_layernorm`. The SGLang export writes our input_layernorm under
  both names, so every parameter of SGLang's model holds our weight.
- transformer_layer_config is Llama's (no q/k norm, as our layers): model_type llama, which
  vLLM maps to Eagle3LlamaForCausalLM.
- SGLang: bfloat16 only (as export/sglang.py: --dtype auto would serve float32 as float16).
- Speculative steps: the depth k the draft was trained with (arch.ttt_steps), as speculators'
  own Eagle3 training writes it; SGLang drafts a chain (top-k 1) of k steps, k + 1 verify tokens.

Glossary: D hidden, V target vocab, N draft vocab, m captured layers, k steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from splitserve.errors import UserError
from splitserve.export.engine_versions import layout_checked
from splitserve.export.hybrid_serving import listed_kind
from splitserve.export.names import ascending_layers
from splitserve.export.sglang import FP32_REFUSED, SGLANG_VERSION
from splitserve.export.speculators import SPECULATORS_VERSION, decoder_shape
from splitserve.models.eagle3 import Eagle3Draft
from splitserve.models.vocab_map import VocabMap

SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"  # models/llama_eagle3.py EntryClass
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"  # Eagle3SpeculatorConfig's default
FORMATS = ("speculators", "sglang")
ENGINE = {"speculators": "vllm", "sglang": "sglang"}  # the engine each layout is served by
LAYOUT_NAME = {"speculators": "the speculators EAGLE-3 layout (vLLM)", "sglang": f"SGLang {SGLANG_VERSION} EAGLE3"}
SHARED = ("target_lm_head.",)  # the target's lm_head: training reads it, no engine does


@dataclass(frozen=True)
class Eagle3Export:
    """What an EAGLE-3 export wrote, and what its serve command needs."""

    out_dir: Path
    format: str  # speculators | sglang
    steps: int  # k: draft tokens per round
    layer_ids: tuple[int, ...]  # as written in config.json (the engine's convention)


def refuse_options(fmt: str, algorithm: str | None, keep_fp32: bool) -> None:
    """One line for an export option that cannot apply to an EAGLE-3 draft."""
    if fmt not in FORMATS:
        raise UserError(f"an EAGLE-3 draft cannot be exported with --format {fmt}: that layout (DSparkDraftModel) "
                        "holds DSpark drafts only; use --format speculators (vLLM) or --format sglang")
    if algorithm is not None:
        raise UserError(f"--algorithm {algorithm} picks SGLang's DSpark worker; an EAGLE-3 draft is served by "
                        "SGLang's EAGLE3 algorithm: drop --algorithm")
    if keep_fp32 and fmt == "sglang":
        raise UserError(FP32_REFUSED)


def _tensors(draft: Eagle3Draft, fmt: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Checkpoint tensors by name (module docstring): floats in `dtype`, d2t int64, t2d bool."""
    a = draft.arch
    _, fc = ascending_layers(draft)
    out = {}
    for name, t in draft.state_dict().items():
        if name.startswith(SHARED) or (name in ("d2t", "t2d") and a.draft_vocab_size == a.vocab_size):
            continue
        if fmt == "sglang" and (name == "t2d" or name.startswith("embed_tokens.")):
            continue
        t = fc if name == "fc.weight" else t.detach()
        out[name] = t if name in ("d2t", "t2d") else t.to(dtype)
        if fmt == "sglang" and name.startswith("layers.") and name.endswith(".input_layernorm.weight"):
            i = int(name.split(".")[1])
            if i > 0:
                out[f"layers.{i}.hidden_norm.weight"] = t.to(dtype)
    return {k: v.contiguous().cpu() for k, v in out.items()}


def _layer_shape(draft: Eagle3Draft, max_position_embeddings: int) -> dict:
    """The Llama decoder shape both configs carry; vocab_size is the target's V (logits are
    scattered back to it)."""
    return {"model_type": "llama", **decoder_shape(draft.arch, max_position_embeddings), "mlp_bias": False}


def _provenance(draft: Eagle3Draft, engine: str) -> dict:
    a = draft.arch
    return {"target_name": a.target_name, "family": "eagle3", "trained_layer_ids": list(a.target_layer_ids),
            "ttt_steps": a.ttt_steps, "layout_checked": layout_checked(engine, "eagle3")}


def speculators_config(draft: Eagle3Draft, verifier_path: str, verifier_architectures: list[str],
                       max_position_embeddings: int, dtype: torch.dtype) -> dict:
    """config.json of the speculators eagle3 layout (a plain dict: every key written on purpose)."""
    a = draft.arch
    layer_ids, _ = ascending_layers(draft)
    return {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": _layer_shape(draft, max_position_embeddings),
        "draft_vocab_size": a.draft_vocab_size,
        "target_hidden_size": a.hidden_size,
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in layer_ids],  # capture points: before layer l + 1
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": a.ttt_steps,
                                  "verifier_accept_k": 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_path, "architectures": list(verifier_architectures)},
        },
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "splitserve": _provenance(draft, "vllm"),
    }


def sglang_config(draft: Eagle3Draft, max_position_embeddings: int) -> dict:
    """config.json for SGLang's LlamaForCausalLMEagle3 (read through transformers' AutoConfig)."""
    a = draft.arch
    layer_ids, _ = ascending_layers(draft)
    return {
        "architectures": [SGLANG_ARCHITECTURE],
        **_layer_shape(draft, max_position_embeddings),
        "draft_vocab_size": a.draft_vocab_size,  # set: the lm_head is the checkpoint's own, N rows
        "target_hidden_size": a.hidden_size,
        # spec_aux_hidden_state.py _resolve_eagle_aux_hidden_state reads the ids from here;
        # llama_eagle3.py LlamaModel sizes fc from their count
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": True},
        "torch_dtype": "bfloat16",
        "splitserve": _provenance(draft, "sglang"),
    }


def export_eagle3(draft: Eagle3Draft, out_dir: str | Path, fmt: str, verifier_path: str = "",
                  verifier_architectures: list[str] | None = None, max_position_embeddings: int = 32768,
                  dtype: torch.dtype = torch.bfloat16) -> Eagle3Export:
    """Write config.json + model.safetensors in the `fmt` layout. `verifier_*`: the target as
    the speculators config names it; `dtype`: speculators only (SGLang's is bfloat16)."""
    refuse_options(fmt, None, False)
    if fmt == "speculators":
        cfg = speculators_config(draft, verifier_path, verifier_architectures or [], max_position_embeddings, dtype)
        ids = cfg["eagle_aux_hidden_state_layer_ids"]
    else:
        cfg, dtype = sglang_config(draft, max_position_embeddings), torch.bfloat16
        ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(_tensors(draft, fmt, dtype), str(out / "model.safetensors"), metadata={"format": "pt"})
    return Eagle3Export(out, fmt, draft.arch.ttt_steps, tuple(ids))


def read_vocab_map(export_dir: str | Path) -> VocabMap | None:
    """The draft vocabulary an EAGLE-3 export carries (None: the full target vocabulary), rebuilt
    from d2t alone where the layout holds no t2d (SGLang's), and checked."""
    export_dir = Path(export_dir)
    cfg = json.loads((export_dir / "config.json").read_text())
    w = load_file(str(export_dir / "model.safetensors"))
    if "d2t" not in w:
        return None
    vocab = cfg.get("transformer_layer_config", cfg)["vocab_size"]
    if "t2d" in w:
        return VocabMap(w["d2t"], w["t2d"]).check()
    return VocabMap.from_ids(w["d2t"] + torch.arange(w["d2t"].numel()), vocab)


def unchecked_target_note(target_config) -> str | None:
    """One line for a target the EAGLE-3 checks never covered: the hybrid, MLA and attention-sink
    kinds export/hybrid_serving.py lists (for DSpark drafts). None for a dense one."""
    kind = listed_kind(target_config)
    if kind is None:
        return None
    return (f"note: EAGLE-3 exports were checked with dense targets only; this target ({kind}) was not, "
            "and neither engine's EAGLE-3 capture of it was run (docs/deploy.md#eagle-3)")


def serve_command(export: Eagle3Export, target_path: str) -> str:
    """The engine's server command for an export; `target_path` is the directory it opens."""
    if export.format == "speculators":
        # `vllm serve DRAFT` alone accepts only a hub id as the verifier (export/speculators.py)
        spec = {"method": "eagle3", "model": str(export.out_dir), "num_speculative_tokens": export.steps}
        parts = [f"vllm serve {target_path}", f"--speculative-config '{json.dumps(spec)}'"]
    else:  # flags: python/sglang/srt/arg_groups/fields/spec.py
        parts = ["python -m sglang.launch_server", f"--model-path {target_path}",
                 "--speculative-algorithm EAGLE3", f"--speculative-draft-model-path {export.out_dir}",
                 f"--speculative-num-steps {export.steps}", "--speculative-eagle-topk 1",
                 f"--speculative-num-draft-tokens {export.steps + 1}"]
    return " \\\n    ".join(parts)

