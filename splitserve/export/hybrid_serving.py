"""Serving a DSpark export on hybrid, MLA and attention-sink targets: which engine can, and with
which extra server flags.

Hybrid targets mix recurrent layers (gated DeltaNet, KDA, Mamba-2) with attention. Every fact below
was read from the released wheels of SGLang 0.5.23 (paths relative to sglang/srt/) and vLLM 0.33.0
(relative to vllm/); docs/deploy.md "Hybrid targets" has the longer account.

Can the engine serve a DSpark draft for the target at all? Both engines feed the draft the target's
hidden states at the draft's captured layers, and each asks the target's model class for that:
  SGLang  model_executor/model_runner_components/attention_backend_setup.py
          configure_aux_hidden_state_capture: the class must have set_dspark_layers_to_capture or
          set_dflash_layers_to_capture, else it raises at start.
  vLLM    v1/worker/gpu/spec_decode/eagle/eagle3_utils.py set_eagle3_aux_hidden_state_layers
          (called by v1/worker/gpu/model_runner.py when the method is dspark): the class must
          implement SupportsEagle3, else RuntimeError at model load.
A target class without that hook cannot be served, whatever the flags. Where it has it, the
recurrent state is rolled back to the accepted prefix by the engine's hybrid backend
(SGLang: dspark_components/dspark_worker_v2.py _commit_target_mamba_states_after_verify ->
layers/attention/hybrid_linear_attn_backend.py update_mamba_state_after_mtp_verify; vLLM: one
state slot per draft token, layers/mamba/abstract.py MambaBase.get_kv_cache_spec
num_speculative_blocks), with no DSpark-specific refusal in either release.

The one flag added for a served hybrid pins the recurrent (SSM) state to float32 in both engines:
  SGLang  --mamba-ssm-dtype float32: its own default when neither the checkpoint config nor
          SGLANG_MAMBA_SSM_DTYPE names another (configs/mamba_utils.py mamba2_state_dtype; the flag
          sets that variable, arg_groups/serving_hook.py handle_environment_variables).
  vLLM    --mamba-ssm-cache-dtype float32: left at "auto", a gated-DeltaNet state takes the model
          dtype (bfloat16; model_executor/layers/mamba/mamba_utils.py
          MambaStateDtypeCalculator._mamba_state_dtype), while vLLM's own Nemotron-H default is
          float32, the one dtype it documents as free of accuracy issues
          (model_executor/models/config.py NemotronHForCausalLMConfig).
transformers' PyTorch reference path computes the gated delta rule in float32 too, so with the pin
both engines keep the state at the precision that reference uses.

MLA (deepseek_v3) and attention-sink (gpt_oss) targets need nothing extra from either engine: their
classes have the capture hook (SGLang DeepseekV2ForCausalLM / GptOssForCausalLM
set_dflash_layers_to_capture; vLLM both implement SupportsEagle3). They are listed so that the
finding is recorded, and produce the same command as a dense target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from splitserve.target.arch import text_config

SGLANG_VERSION = "0.5.23"
VLLM_VERSION = "0.33.0"
# export --format -> (engine name, release read)
ENGINES = {"sglang": ("SGLang", SGLANG_VERSION), "speculators": ("vLLM", VLLM_VERSION)}

SGLANG_STATE_FLAG = "--mamba-ssm-dtype float32"  # arg_groups/fields/exec_.py ExecMamba.mamba_ssm_dtype
VLLM_STATE_FLAG = "--mamba-ssm-cache-dtype float32"  # engine/arg_utils.py EngineArgs.add_cli_args (CacheConfig)
# What each engine looks for on the target's model class (module docstring).
SGLANG_HOOKS = ("set_dspark_layers_to_capture", "set_dflash_layers_to_capture")
VLLM_HOOK = "SupportsEagle3"


@dataclass(frozen=True)
class EngineSupport:
    """One engine's answer for one target kind. `model_class` ("path/in/wheel.py:Class") is the class
    the engine builds for it; it either has the capture hook (`serves`: `flags` go on the launch
    command) or lacks it (`reason`: one line, citing the source that refuses)."""

    model_class: str
    serves: bool
    flags: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        if self.serves:
            return ""
        path, cls = self.model_class.split(":")
        if path.startswith("sglang/"):
            return (f"its {cls} ({path}) implements neither {' nor '.join(SGLANG_HOOKS)}, which DSPARK needs "
                    "to capture the target's hidden states (sglang/srt/model_executor/model_runner_components/"
                    "attention_backend_setup.py configure_aux_hidden_state_capture raises at start)")
        return (f"its {cls} ({path}) does not implement {VLLM_HOOK}, the interface the dspark method captures "
                "the target's hidden states through (vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py "
                "set_eagle3_aux_hidden_state_layers raises at model load)")


@dataclass(frozen=True)
class TargetServing:
    """A target model_type and what each engine does with a DSpark draft for it."""

    model_type: str
    layers: str  # what the target mixes, in a few words
    sglang: EngineSupport
    vllm: EngineSupport

    def engine(self, fmt: str) -> EngineSupport:
        return self.sglang if fmt == "sglang" else self.vllm


SG, VL = "sglang/srt/models/", "vllm/model_executor/models/"


def _hybrid(model_type: str, layers: str, sglang: str, vllm: str, sglang_serves: bool = True,
            vllm_serves: bool = True) -> TargetServing:
    """A hybrid row: where an engine serves it, the SSM-state flag goes on its command."""
    return TargetServing(model_type, layers,
                         EngineSupport(sglang, sglang_serves, (SGLANG_STATE_FLAG,) if sglang_serves else ()),
                         EngineSupport(vllm, vllm_serves, (VLLM_STATE_FLAG,) if vllm_serves else ()))


GDN = "gated DeltaNet + full attention"
_ROWS = [
    _hybrid("qwen3_next", GDN, SG + "qwen3_next.py:Qwen3NextForCausalLM", VL + "qwen3_next.py:Qwen3NextForCausalLM"),
    # Qwen3.5 releases are multimodal (their hook comes from the Qwen3-VL base class in both engines);
    # a text-only checkpoint has the *_text model types.
    _hybrid("qwen3_5", GDN, SG + "qwen3_5.py:Qwen3_5ForConditionalGeneration",
            VL + "qwen3_5.py:Qwen3_5ForConditionalGeneration"),
    _hybrid("qwen3_5_moe", GDN, SG + "qwen3_5.py:Qwen3_5MoeForConditionalGeneration",
            VL + "qwen3_5.py:Qwen3_5MoeForConditionalGeneration"),
    _hybrid("qwen3_5_text", GDN, SG + "qwen3_5_text.py:Qwen3_5ForCausalLM", VL + "qwen3_5.py:Qwen3_5ForCausalLM"),
    _hybrid("qwen3_5_moe_text", GDN, SG + "qwen3_5_text.py:Qwen3_5MoeForCausalLM",
            VL + "qwen3_5.py:Qwen3_5MoeForCausalLM"),
    # SGLang: a DSPARK hook only (no DFLASH one). vLLM: the CUDA class; the ROCm/XPU one
    # (vllm/models/kimi_k3/amd/linear.py) lacks SupportsEagle3, so there the answer is no.
    _hybrid("kimi_linear", "KDA + MLA", SG + "kimi_linear.py:KimiLinearForCausalLM",
            "vllm/models/kimi_k3/nvidia/model.py:KimiLinearForCausalLM"),
    # Ling hybrids share model_type bailing_hybrid: the KDA variant (Ling 3.0) and the lightning-
    # attention one (Ling 2.5) are told apart in _row().
    _hybrid("bailing_hybrid", "KDA + MLA, Ling 3.0", SG + "bailing_moe_v3.py:BailingMoeV3ForCausalLM",
            VL + "bailing_moe_v3.py:BailingMoeV3ForCausalLM", vllm_serves=False),
    _hybrid("bailing_hybrid/lightning", "lightning linear attention + MLA, Ling 2.5",
            SG + "bailing_moe_linear.py:BailingMoeV2_5ForCausalLM",
            VL + "bailing_moe_linear.py:BailingMoeV25ForCausalLM", sglang_serves=False, vllm_serves=False),
    _hybrid("nemotron_h", "Mamba-2 + attention + MLP/MoE blocks", SG + "nemotron_h.py:NemotronHForCausalLM",
            VL + "nemotron_h.py:NemotronHForCausalLM"),
    _hybrid("falcon_h1", "attention and Mamba-2 side by side in each layer",
            SG + "falcon_h1.py:FalconH1ForCausalLM", VL + "falcon_h1.py:FalconH1ForCausalLM",
            sglang_serves=False, vllm_serves=False),
    _hybrid("granitemoehybrid", "Mamba-2 + attention, Granite 4.0-H",
            SG + "granitemoehybrid.py:GraniteMoeHybridForCausalLM",
            VL + "granitemoehybrid.py:GraniteMoeHybridForCausalLM", sglang_serves=False, vllm_serves=False),
    # No recurrent state: served as a dense target is, nothing added.
    TargetServing("deepseek_v3", "MLA", EngineSupport(SG + "deepseek_v2.py:DeepseekV3ForCausalLM", True),
                  EngineSupport(VL + "deepseek_v2.py:DeepseekV3ForCausalLM", True)),
    TargetServing("gpt_oss", "attention sinks + sliding windows",
                  EngineSupport(SG + "gpt_oss.py:GptOssForCausalLM", True),
                  EngineSupport(VL + "gpt_oss.py:GptOssForCausalLM", True)),
]
TABLE: dict[str, TargetServing] = {row.model_type: row for row in _ROWS}


def _row(config: Any) -> TargetServing | None:
    """The table row of a target's HF config (its own model_type, else its text config's), or None
    for a target the table does not list (dense targets: nothing to add)."""
    tc = text_config(config)
    outer = getattr(config, "model_type", "")
    model_type = outer if outer in TABLE else getattr(tc, "model_type", "")
    if model_type == "bailing_hybrid":
        archs = set(getattr(config, "architectures", None) or []) | set(getattr(tc, "architectures", None) or [])
        # the class named, else SGLang's own rule: KDA layers come with a short convolution
        kda = "BailingMoeV3ForCausalLM" in archs or (getattr(tc, "short_conv_kernel_size", None) is not None
                                                     and "BailingMoeV2_5ForCausalLM" not in archs)
        model_type = "bailing_hybrid" if kda else "bailing_hybrid/lightning"
    return TABLE.get(model_type)


def listed_kind(target_config: Any) -> str | None:
    """What the table says a listed target mixes ("qwen3_next: gated DeltaNet + attention"), None
    for a target it does not list (a dense one)."""
    row = _row(target_config)
    return None if row is None else f"{row.model_type.split('/')[0]}: {row.layers}"


def serving_notes(target_config: Any, fmt: str) -> tuple[list[str], str | None]:
    """What a `--format fmt` export for this target adds to its launch command.

    -> (extra server flags, in order; a one-line refusal where the format's engine cannot serve a
    DSpark draft for this target, else None). Dense targets and the hf format: ([], None)."""
    if fmt not in ENGINES:
        return [], None
    row = _row(target_config)
    if row is None:
        return [], None
    support = row.engine(fmt)
    if support.serves:
        return list(support.flags), None
    name, version = ENGINES[fmt]
    other_fmt = next(f for f in ENGINES if f != fmt)
    other_name, other_version = ENGINES[other_fmt]
    instead = (f"serve it with {other_name} (--format {other_fmt})" if row.engine(other_fmt).serves
               else f"{other_name} {other_version} cannot serve it either")
    return [], (f"{name} {version} cannot serve a DSpark draft for this {row.model_type.split('/')[0]} target "
                f"({row.layers}): {support.reason}; the export is written anyway, {instead}")
