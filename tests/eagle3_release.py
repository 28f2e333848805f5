"""The EAGLE-3 serving code of vLLM 0.33.0 and SGLang 0.5.23, compiled from their wheels
(tests/vllm_release.py, tests/sglang_release.py: downloaded once) and run on a CPU around an
export, without importing either engine.

From vLLM (paths under vllm/):
  transformers_utils/configs/speculators/algos.py   update_eagle3 (config.json -> the draft's config)
  transformers_utils/configs/speculators/base.py    SpeculatorsConfig's dict-level methods
  v1/worker/gpu/spec_decode/eagle/eagle3_utils.py   get_eagle3_aux_layers_from_config
  model_executor/models/interfaces.py               EagleModelMixin, SupportsEagle3.set_aux_hidden_state_layers
  model_executor/models/llama.py                    LlamaModel.forward: which target layers are captured
From SGLang (paths under sglang/srt/):
  models/llama_eagle3.py    LlamaDecoderLayer, LlamaModel, LlamaForCausalLMEagle3 (__init__, load_weights
                            with its d2t hot-token map, forward)
  models/llama.py           LlamaMLP, LlamaAttention, LlamaDecoderLayer (the bases), LlamaModel.forward
                            (the capture loop), LlamaForCausalLM.set_eagle3_layers_to_capture
  layers/layernorm.py       RMSNorm.forward_native;  layers/activation.py  SiluAndMul.forward_native
  layers/rotary_embedding/  RotaryEmbedding._compute_inv_freq, _compute_cos_sin_cache, forward_native;
                            utils.py apply_rotary_emb
  model_loader/weight_utils.py  default_weight_loader
  model_executor/model_runner_components/  spec_aux_hidden_state.py SpecAuxHiddenStateConfig,
                            _resolve_eagle_aux_hidden_state; attention_backend_setup.py
                            configure_aux_hidden_state_capture
  layers/aux_hidden_states.py  AuxHiddenStateList, pack_aux_hidden_states
Stand-ins, each doing no layout work of its own: the tensor-parallel-1 linears
(sglang_release.Linear / Stacked, here with their (out, bias) forward), the attention kernel
(causal attention over one sequence, K/V kept per layer across calls), the logits processor's
matmul, the target's decoder layers (they hand the capture loops the target's residual stream),
config objects and server settings as namespaces.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from release_code import compile_into, pick, pick_methods, release_imports
from sglang_release import RECORDER, Struct
from sglang_release import Linear as _Linear
from sglang_release import Norm as _Norm
from sglang_release import Stacked as _Stacked
from sglang_release import tree as sglang_tree
from torch import nn
from vllm_release import compile_defs, compile_methods

LOG = logging.getLogger("eagle3_release")
BASE = {"torch": torch, "nn": nn, "F": F, "logger": LOG, "logging": logging, "Any": Any, "ClassVar": ClassVar,
        "Optional": object, "Tuple": object, "Iterable": object, "List": object, "Dict": object, "Union": object}


# ---- vLLM --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def vllm() -> SimpleNamespace:
    import bisect

    algos = compile_defs("vllm/transformers_utils/configs/speculators/algos.py",
                         ["SUPPORTED_SPECULATORS_TYPES", "register_speculator", "update_eagle3"], dict(BASE))
    cfg = compile_methods("vllm/transformers_utils/configs/speculators/base.py", "SpeculatorsConfig",
                          ["extract_transformers_pre_trained_config", "validate_speculators_config",
                           "build_vllm_speculative_config", "extract_vllm_speculative_config"],
                          dict(BASE, SUPPORTED_SPECULATORS_TYPES=algos["SUPPORTED_SPECULATORS_TYPES"]))
    eagle3 = compile_defs("vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
                          ["get_eagle3_aux_layers_from_config"], dict(BASE))
    mixin = compile_defs("vllm/model_executor/models/interfaces.py", ["EagleModelMixin"],
                         dict(BASE, bisect_right=bisect.bisect_right))["EagleModelMixin"]
    set_aux = compile_methods("vllm/model_executor/models/interfaces.py", "SupportsEagle3",
                              ["set_aux_hidden_state_layers"], dict(BASE, EagleModelMixin=mixin))
    forward = compile_methods("vllm/model_executor/models/llama.py", "LlamaModel", ["forward"], dict(
        BASE, islice=itertools.islice, get_pp_group=lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True),
        IntermediateTensors=dict))["forward"]
    return SimpleNamespace(config=type("SpeculatorsConfig", (), cfg), get_aux_layers=eagle3[
        "get_eagle3_aux_layers_from_config"], mixin=mixin, set_aux=set_aux["set_aux_hidden_state_layers"],
        llama_forward=forward)


def vllm_reads(export_dir: Path) -> tuple[dict, dict, tuple[int, ...]]:
    """config.json through vLLM: (the draft's HF config dict, the speculative config vLLM builds,
    the capture points get_eagle3_aux_layers_from_config hands the target)."""
    rel = vllm()
    cfg = json.loads((Path(export_dir) / "config.json").read_text())
    hf = rel.config.extract_transformers_pre_trained_config(copy.deepcopy(cfg))
    spec = rel.config.extract_vllm_speculative_config(copy.deepcopy(cfg))
    spec_cfg = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(**hf)))
    return hf, spec, tuple(rel.get_aux_layers(spec_cfg))


class _VllmStreamLayer:
    """A target decoder layer handing vLLM's loop the residual stream after layer i."""

    def __init__(self, owner, i):
        self.owner, self.i = owner, i

    def __call__(self, positions, hidden_states, residual, **kw):
        return self.owner.streams[self.i + 1][positions], None


def vllm_capture(aux_layers: tuple[int, ...], streams: list[torch.Tensor]) -> list[torch.Tensor]:
    """What vLLM's Llama target hands the drafter for these capture points: a list of (T, D),
    in its order. `streams`: served_rounds.residual_streams (embedding output, each layer's)."""
    rel = vllm()
    num_layers = len(streams) - 1

    class Decoder(rel.mixin):
        start_layer, end_layer = 0, num_layers
        forward = rel.llama_forward

        def __init__(self):
            self.layers = [_VllmStreamLayer(self, i) for i in range(num_layers)]
            self.streams = streams

        def embed_input_ids(self, input_ids):
            return self.streams[0][input_ids]

        def norm(self, hidden_states, residual):
            return hidden_states, None

    decoder = Decoder()
    with release_imports({"vllm.distributed.parallel_state": {"model_parallel_is_initialized": lambda: False,
                                                              "get_pp_group": None}}):
        rel.set_aux(SimpleNamespace(model=decoder), aux_layers)
    positions = torch.arange(streams[0].shape[0])
    _, aux = decoder.forward(positions, positions, None)
    return aux


# ---- SGLang ------------------------------------------------------------------------------


def _sg(path: str, names: list[str], namespace: dict) -> dict:
    nodes = pick(sglang_tree(path), names, f"sglang {path}")
    return compile_into(nodes, path, "eagle3_release.sglang." + path.removesuffix(".py").replace("/", "."), namespace)


def _sg_methods(path: str, cls: str, names: list[str], namespace: dict) -> dict:
    nodes = pick_methods(sglang_tree(path), cls, names, f"sglang {path}")
    ns = compile_into(nodes, path, "eagle3_release.sglang." + path.removesuffix(".py").replace("/", ".") + "." + cls,
                      dict(namespace))
    return {n: ns[n] for n in names}


class _Attention(nn.Module):
    """RadixAttention at tp 1 for one request: causal over the K/V of every call so far (a prefill,
    then one position per draft step), GQA. q, k, v: (Q, H*hd), (Q, Hkv*hd) -> (Q, H*hd)."""

    def __init__(self, num_heads, head_dim, scaling, num_kv_heads, layer_id=0, **kw):
        super().__init__()
        self.h, self.hd, self.hkv, self.scaling, self.layer_id = num_heads, head_dim, num_kv_heads, scaling, layer_id
        self.k = self.v = None

    def forward(self, q, k, v, forward_batch):
        k, v = k.view(-1, self.hkv, self.hd), v.view(-1, self.hkv, self.hd)
        self.k = k if self.k is None else torch.cat([self.k, k])
        self.v = v if self.v is None else torch.cat([self.v, v])
        n, s = q.shape[0], self.k.shape[0]
        mask = torch.arange(s)[None, :] <= (s - n + torch.arange(n))[:, None]  # (Q, S)
        out = F.scaled_dot_product_attention(q.view(n, self.h, self.hd).transpose(0, 1), self.k.transpose(0, 1),
                                             self.v.transpose(0, 1), attn_mask=mask, scale=self.scaling,
                                             enable_gqa=True)
        return out.transpose(0, 1).reshape(n, self.h * self.hd)


@functools.lru_cache(maxsize=1)
def sglang() -> SimpleNamespace:
    from dataclasses import dataclass

    weight_utils = _sg("model_loader/weight_utils.py", ["default_weight_loader"], dict(BASE))
    loader = RECORDER.wrap(weight_utils["default_weight_loader"])
    norm_forward = _sg_methods("layers/layernorm.py", "RMSNorm", ["forward_native"], dict(BASE))["forward_native"]
    act_forward = _sg_methods("layers/activation.py", "SiluAndMul", ["forward_native"], dict(BASE))["forward_native"]
    rot = _sg("layers/rotary_embedding/utils.py", ["apply_rotary_emb"], dict(BASE))["apply_rotary_emb"]
    rope = _sg_methods("layers/rotary_embedding/base.py", "RotaryEmbedding",
                       ["_compute_inv_freq", "_compute_cos_sin_cache", "forward_native"], dict(BASE))

    class Norm(_Norm):  # layers/layernorm.py RMSNorm, its native path, default options
        override_orig_dtype = variance_size_override = None
        fp32_residual = cast_x_before_out_mul = False
        forward = norm_forward

        def __init__(self, hidden_size, eps=1e-6, **kw):
            super().__init__(hidden_size, eps)
            self.hidden_size = hidden_size

    class Linear(_Linear):
        def forward(self, x):
            return F.linear(x, self.weight, self.bias), None

    class Stacked(_Stacked):
        def forward(self, x):
            return F.linear(x, self.weight), None

    class Rope(nn.Module):
        """get_rope's plain RotaryEmbedding (rope_type "default"), SGLang's native methods."""

        _compute_inv_freq, _compute_cos_sin_cache = rope["_compute_inv_freq"], rope["_compute_cos_sin_cache"]
        forward = rope["forward_native"]

        def __init__(self, head_size, rotary_dim, max_position, base, is_neox_style=True, rope_scaling=None, **kw):
            super().__init__()
            assert rope_scaling is None or rope_scaling.get("rope_type", rope_scaling.get("type")) == "default", \
                rope_scaling
            self.head_size, self.rotary_dim, self.max_position_embeddings = head_size, rotary_dim, max_position
            self.base, self.is_neox_style, self.position_start, self._force_native = base, is_neox_style, 0, False
            self.cos_sin_cache = self._compute_cos_sin_cache()
            self._apply_rotary_emb_wrapped = rot

    def qkv(hidden_size, head_size, total_num_heads, total_num_kv_heads, bias=False, **kw):
        return Stacked(hidden_size, {"q": total_num_heads * head_size, "k": total_num_kv_heads * head_size,
                                     "v": total_num_kv_heads * head_size}, bias)

    def merged(input_size, output_sizes, bias=False, **kw):
        return Stacked(input_size, dict(enumerate(output_sizes)), bias)

    class Embedding(nn.Module):  # VocabParallelEmbedding at tp 1
        def __init__(self, num_embeddings, embedding_dim, **kw):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))

        def forward(self, ids):
            return F.embedding(ids, self.weight)

    class LMHead(nn.Module):  # ParallelLMHead at tp 1
        def __init__(self, num_embeddings, embedding_dim, **kw):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))

    ns = dict(BASE, copy=copy, default_weight_loader=loader, get_parallel=lambda: SimpleNamespace(
                  tp_size=1, pp_group=SimpleNamespace(is_first_rank=True, is_last_rank=True), enable_dp_lm_head=False),
              get_spec=lambda: SimpleNamespace(speculative_draft_window_size=None), add_prefix=lambda n, p: f"{p}.{n}"
              if p else n, RMSNorm=Norm, QKVParallelLinear=qkv, MergedColumnParallelLinear=merged,
              RowParallelLinear=Linear, get_rope=Rope, RadixAttention=_Attention,
              SiluAndMul=type("SiluAndMul", (nn.Module,), {"forward": act_forward}),
              DualGemm=lambda *a: SimpleNamespace(can_run=lambda x, lin: False),
              DenseSiluAndMulQuant=lambda *a: None, VocabParallelEmbedding=Embedding, ParallelLMHead=LMHead,
              LogitsProcessor=lambda config: None, layer_stack=contextlib.nullcontext, _is_npu=False,
              DraftParallelSpec=lambda **kw: SimpleNamespace(**kw), DraftTPExecution=SimpleNamespace(SINGLE_GROUP=0),
              NORM_QUANT_READOUT=None)
    _sg("models/llama.py", ["LlamaMLP", "LlamaAttention", "LlamaDecoderLayer", "LlamaForCausalLM"], ns)
    _sg("models/llama_eagle3.py", ["LlamaDecoderLayer", "LlamaModel", "LlamaForCausalLMEagle3"], ns)

    # get_spec(): the server's speculative settings, set by sglang_capture_ids; ModelConfig
    # builds the draft's config from the server args, which carry it here
    capture = dict(BASE, msgspec=SimpleNamespace(Struct=Struct), dataclass=dataclass, get_spec=lambda: SPEC,
                   ModelConfig=SimpleNamespace(from_server_args=lambda server_args, **kw: server_args.draft))
    _sg("model_executor/model_runner_components/spec_aux_hidden_state.py",
        ["SpecAuxHiddenStateConfig", "_resolve_eagle_aux_hidden_state"], capture)
    _sg("model_executor/model_runner_components/attention_backend_setup.py",
        ["configure_aux_hidden_state_capture"], capture)
    _sg("layers/aux_hidden_states.py", ["AuxHiddenStateList", "pack_aux_hidden_states"], capture)
    llama = dict(capture, residual_batch=SimpleNamespace(start=lambda fb: None, final_norm=lambda h, fb, norm: norm(h)))
    set_capture = _sg_methods("models/llama.py", "LlamaForCausalLM", ["set_eagle3_layers_to_capture"], llama)
    forward = _sg_methods("models/llama.py", "LlamaModel", ["forward"], llama)["forward"]
    return SimpleNamespace(Model=ns["LlamaForCausalLMEagle3"], capture=capture, llama_forward=forward,
                           set_eagle3_layers_to_capture=set_capture["set_eagle3_layers_to_capture"])


def sglang_model(export_dir: Path):
    """SGLang's LlamaForCausalLMEagle3 built from the export's config.json (through transformers'
    AutoConfig, as SGLang reads it), every parameter NaN until its load_weights runs."""
    from transformers import AutoConfig

    model = sglang().Model(AutoConfig.from_pretrained(export_dir))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    return model


def sglang_draft(model, aux: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor):
    """One forward of SGLang's draft model over Q positions after those it has seen (the extend of
    the first step, then one position per chain step): hidden (Q, m*D) target features or the
    previous step's (Q, D) -> (logits over its N tokens (Q, N), the states the next step reads)."""
    batch = SimpleNamespace(mm_input_embeds=None, contains_mm_inputs=lambda: False,
                            forward_mode=SimpleNamespace(is_extend=lambda: True, is_draft_extend_v2=lambda: False,
                                                         is_decode=lambda: False),
                            spec_info=SimpleNamespace(hidden_states=aux))
    with torch.no_grad():
        h, (out,) = model.model(ids, positions, batch)
    return F.linear(h, model.lm_head.weight), out  # LogitsProcessor: hidden @ lm_head.T


SPEC = SimpleNamespace(speculative_draft_model_path=None, speculative_draft_model_revision=None)


def sglang_capture_ids(export_dir: Path) -> list[int]:
    """The layer ids SGLang's target worker resolves for an EAGLE3 draft
    (_resolve_eagle_aux_hidden_state with the export as --speculative-draft-model-path)."""
    from transformers import AutoConfig

    rel = sglang()
    hf = AutoConfig.from_pretrained(export_dir)
    draft_cfg = SimpleNamespace(hf_config=hf, num_nextn_predict_layers=None, num_hidden_layers=hf.num_hidden_layers,
                                num_attention_layers=hf.num_hidden_layers, is_hybrid_swa=False)
    SPEC.speculative_draft_model_path = str(export_dir)  # --speculative-draft-model-path
    config = rel.capture["SpecAuxHiddenStateConfig"]()
    algo = SimpleNamespace(is_eagle=lambda: True, is_standalone=lambda: False, is_eagle3=lambda: True)
    rel.capture["_resolve_eagle_aux_hidden_state"](config=config, server_args=SimpleNamespace(draft=draft_cfg),
                                                   model_config=None, spec_algorithm=algo, is_draft_worker=False)
    assert config.eagle_use_aux_hidden_state
    return config.eagle_aux_hidden_state_layer_ids


class _SgStreamLayer:
    """A target decoder layer: captures the residual stream entering it when asked, then hands
    back the target's stream after it."""

    def __init__(self, owner, i):
        self.owner, self.i = owner, i

    def __call__(self, positions, hidden_states, forward_batch, capture_output=None):
        if capture_output is not None:
            capture_output(hidden_states)
        return self.owner.streams[self.i + 1][positions]


def sglang_capture(layer_ids: list[int], streams: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """A stand-in Llama target configured by configure_aux_hidden_state_capture for EAGLE3 ->
    (the (T, m*D) target features SGLang hands the draft, its layers_to_capture)."""
    rel = sglang()
    num_layers = len(streams) - 1

    class Decoder:
        forward = rel.llama_forward
        start_layer, end_layer = 0, num_layers
        pp_group = SimpleNamespace(is_first_rank=True, is_last_rank=True)

        def __init__(self):
            self.layers = [_SgStreamLayer(self, i) for i in range(num_layers)]
            self.layers_to_capture, self.streams = [], streams

        def embed_tokens(self, input_ids):
            return self.streams[0][input_ids]

        def norm(self, hidden_states):
            return hidden_states

    class Target:
        set_eagle3_layers_to_capture = rel.set_eagle3_layers_to_capture
        pp_group = SimpleNamespace(is_last_rank=True)
        config = SimpleNamespace(num_hidden_layers=num_layers)

        def __init__(self):
            self.model = Decoder()

    target = Target()
    rel.capture["configure_aux_hidden_state_capture"](
        model=target, eagle_use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=layer_ids,
        dflash_use_aux_hidden_state=False, dflash_target_layer_ids=None, is_dspark=False)
    positions = torch.arange(streams[0].shape[0])
    _, aux = target.model.forward(positions, positions, None)
    return rel.capture["pack_aux_hidden_states"](aux), list(target.model.layers_to_capture)

