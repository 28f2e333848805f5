"""`splitserve export --format sglang`: the checkpoint SGLang 0.5.23's DSPARK draft loader reads.

Every name below is read from the sglang 0.5.23 wheel (python/sglang/srt/...); tests/
test_sglang_contract.py replays that release's own config parsing and load_weights over an export.

  models/dspark.py            Qwen3DSparkModel (DSparkDraftMixin over models/dflash.py's
                              DFlashDraftModel): the DFlash backbone plus markov_head.* and
                              confidence_head.*; build_markov_head needs markov_rank > 0
  speculative/dspark_components/dspark_config.py   parse_dspark_draft_config (on top of
                              speculative/dflash_utils.py parse_dflash_draft_config),
                              resolve_runtime_config, get_dspark_sample_from_anchor

Tensor names are export/names.py's (q/k/v and gate/up stay separate: DFlashDraftModel.load_weights
fuses them through its stacked_params_mapping). The embedding and lm_head are not written:
DSparkDraftMixin.attach_shared_modules takes the target's.

Decisions, each forced by that source:
- DSPARK only. A markov_rank=0 (DFlash-style) draft is served through DSPARK with a rank-1 vanilla
  head whose W2 is zero (names.served_weights): exactly its own distribution. The DFLASH worker
  (speculative/dflash_worker_v2.py) keeps rows 1.. of a block_size-row block, so it reads slot j as
  the token j after the anchor, one later than splitserve trains: `--algorithm dflash` is refused.
- `sample_from_anchor: true` (get_dspark_sample_from_anchor's default, written so no default decides).
- bfloat16 only. configs/model_config.py _get_and_verify_dtype serves a float32 checkpoint under
  the default `--dtype auto` as float16 (not the target's bfloat16), so float32 is refused.
- The confidence head exists only outside the default static verify mode: models/dspark.py
  build_confidence_head returns None when speculative/ragged_verify.py read_ragged_verify_mode()
  is STATIC (environment SGLANG_RAGGED_VERIFY_MODE, default "static" in environ.py), and
  dspark_components/dspark_planner.py DSparkVerifyPlanner then ignores
  --speculative-dspark-confidence-sts-path with a warning. An export with STS temperatures is
  launched with SGLANG_RAGGED_VERIFY_MODE=cap-accept, which builds the head and reads the file.
- Hybrid targets (recurrent layers among attention ones): export/hybrid_serving.py picks the extra
  server flags, or the one-line reason SGLang cannot serve the target (its model class lacks the
  hidden-state capture hook DSPARK needs); the files are written either way.

Glossary: D hidden, V vocab, m captured layers, r Markov rank, L draft layers, γ block size.
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

SGLANG_VERSION = "0.5.23"  # the release every name here was read from
ARCHITECTURE = "Qwen3DSparkModel"  # models/dspark.py EntryClass
# SGLang reads config.json through transformers' AutoConfig, so model_type must be one
# transformers knows; the backbone is Qwen3-shaped (q/k norm, SwiGLU, RMSNorm).
MODEL_TYPE = "qwen3"
STS_FILE = "sts_calibration.json"
STS_VERIFY_MODE = "cap-accept"  # a SGLANG_RAGGED_VERIFY_MODE that builds the confidence head
FP32_ALWAYS = ("confidence_head.",)  # DSparkConfidenceHead allocates proj in float32
DFLASH_REFUSED = (
    "--algorithm dflash is refused: SGLang's DFLASH worker reads block slot j as the j-th token after the "
    "anchor, one later than splitserve trains, so acceptance would collapse; every draft (markov_rank=0 "
    "included) is served exactly through DSPARK, the default")
FP32_REFUSED = (
    "--keep-fp32 is refused for --format sglang: SGLang serves a float32 draft under its default "
    "--dtype auto as float16, beside a bfloat16 target; the export writes bfloat16")


@dataclass(frozen=True)
class SGLangExport:
    """What `export_sglang` wrote: its block size γ, the STS file (None when not written), the
    server flags its target needs and, where SGLang cannot serve that target, the one-line reason
    (export/hybrid_serving.py)."""

    out_dir: Path
    block_size: int
    sts_file: Path | None
    serve_flags: tuple[str, ...] = ()
    refused: str | None = None


def refuse_options(algorithm: str | None, keep_fp32: bool) -> None:
    """One-line refusal of the export options SGLang cannot serve as trained."""
    if algorithm is not None and algorithm.lower() == "dflash":
        raise ValueError(DFLASH_REFUSED)
    if algorithm is not None and algorithm.lower() != "dspark":
        raise ValueError(f"--algorithm must be dspark, got {algorithm!r}")
    if keep_fp32:
        raise ValueError(FP32_REFUSED)


def sglang_weights(draft: DSparkDraft) -> dict[str, torch.Tensor]:
    """SGLang checkpoint tensors (CPU, contiguous, bfloat16; the confidence head float32)."""
    return {k: v.to(torch.float32 if k.startswith(FP32_ALWAYS) else torch.bfloat16).contiguous().cpu()
            for k, v in served_weights(draft).items()}


def sglang_config(draft: DSparkDraft, target_num_layers: int, max_position_embeddings: int = 32768) -> dict:
    """config.json for SGLang (a plain dict: every key is written on purpose)."""
    a = draft.arch
    layer_ids, _ = ascending_layers(draft)
    dflash_config = {
        # parse_dflash_draft_config reads these from dflash_config first, then the top level.
        # num_target_layers bounds-checks target_layer_ids (DFlashDraftConfig.resolve_target_layer_ids;
        # without it max(ids) + 1 is assumed).
        "mask_token_id": a.mask_token_id,
        "target_layer_ids": layer_ids,
        "num_target_layers": target_num_layers,
        "block_size": a.block_size,
    }
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        # The backbone shape, read by models/dflash.py (DFlashAttention, DFlashMLP) from the HF config.
        "hidden_size": a.hidden_size,
        "num_hidden_layers": a.num_layers,
        "num_attention_heads": a.num_heads,
        "num_key_value_heads": a.num_kv_heads,
        "head_dim": a.head_dim,
        "intermediate_size": a.intermediate_size,
        "hidden_act": "silu",  # DFlashMLP: silu or swigluoai
        "attention_bias": False,
        "rms_norm_eps": a.rms_norm_eps,
        "rope_theta": a.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": a.vocab_size,  # build_markov_head: VanillaMarkov(vocab_size=config.vocab_size)
        "tie_word_embeddings": False,
        # Every layer full and non-causal inside the block: _get_dflash_layer_attention_params maps
        # "full_attention" to AttentionType.ENCODER_ONLY; no sliding window.
        "use_sliding_window": False,
        "layer_types": ["full_attention"] * a.num_layers,
        "torch_dtype": "bfloat16",
        "block_size": a.block_size,  # DSpark gamma (parse_dspark_draft_config: base.block_size)
        "num_target_layers": target_num_layers,
        "target_layer_ids": layer_ids,
        "mask_token_id": a.mask_token_id,
        "dflash_config": dflash_config,
        # build_markov_head reads the top level; parse_dspark_draft_config a dspark_config dict,
        # the text config, then the top level.
        "markov_rank": max(a.markov_rank, 1),
        "markov_head_type": a.markov_head_type if a.markov_rank > 0 else "vanilla",
        # build_confidence_head reads these from the top level.
        "enable_confidence_head": a.enable_confidence_head,
        "confidence_head_with_markov": a.markov_rank > 0,
        "sample_from_anchor": True,
        # Provenance (ignored by SGLang).
        "splitserve": {"target_name": a.target_name, "trained_markov_rank": a.markov_rank,
                       "slot_convention": "slot k predicts anchor+k+1", "layout_checked": layout_checked("sglang")},
    }


def sts_calibration(temperatures: list[float], source: str = "", rounds: int = 0) -> dict:
    """dspark_components/dspark_sts.py DSparkStsCalibration: {temperatures, dataset, num_samples},
    one temperature per draft position (DSparkVerifyPlanner checks numel == gamma),
    c = sigmoid(z / T) (DSparkConfidenceHead.apply_sts)."""
    return {"temperatures": [float(t) for t in temperatures], "dataset": source, "num_samples": int(rounds)}


def export_sglang(
    draft: DSparkDraft,
    out_dir: str | Path,
    target_num_layers: int,
    calibration: dict | None = None,
    max_position_embeddings: int = 32768,
    target_config: Any = None,
) -> SGLangExport:
    """Write config.json + model.safetensors (+ sts_calibration.json) for SGLang's DSPARK.

    `target_config` (the target's HF config) selects the extra server flags of a hybrid target, or
    the reason SGLang cannot serve it; both are recorded under config.json's `splitserve` key (a
    dense target records neither), and the files are written either way. A draft over a reduced
    vocabulary is written expanded to the target's (models/dspark_vocab.py): SGLang's DSpark has
    no id map."""
    draft = expand_vocab(draft)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = sglang_config(draft, target_num_layers, max_position_embeddings)
    flags, refused = serving_notes(target_config, "sglang") if target_config is not None else ([], None)
    if flags:
        cfg["splitserve"]["serve_flags"] = flags
    if refused:
        cfg["splitserve"]["serving_refused"] = refused
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(sglang_weights(draft), str(out / "model.safetensors"), metadata={"format": "pt"})
    sts = None
    fits = (calibration or {}).get("fits") or []
    if draft.confidence is not None and fits:
        sts = out / STS_FILE
        f = fits[0]
        sts.write_text(json.dumps(sts_calibration(f["temperatures"], (calibration or {}).get("source", ""),
                                                  f.get("rounds", 0)), indent=1))
    return SGLangExport(out, draft.arch.block_size, sts, tuple(flags), refused)


def launch_command(export: SGLangExport, target_path: str) -> str:
    """The SGLang server command (flags from python/sglang/srt/arg_groups/fields/spec.py; a hybrid
    target's from export/hybrid_serving.py). ValueError (one line) where SGLang cannot serve the
    export's target.

    `target_path` is the directory SGLang opens (--model-path takes no splitserve alias)."""
    if export.refused:
        raise ValueError(export.refused)
    parts = ["python -m sglang.launch_server", f"--model-path {target_path}",
             "--speculative-algorithm DSPARK", f"--speculative-draft-model-path {export.out_dir}",
             f"--speculative-dspark-block-size {export.block_size}"]
    if export.sts_file is not None:
        parts.append(f"--speculative-dspark-confidence-sts-path {export.sts_file}")
        parts[0] = f"SGLANG_RAGGED_VERIFY_MODE={STS_VERIFY_MODE} {parts[0]}"
    parts += export.serve_flags
    return " \\\n    ".join(parts)
