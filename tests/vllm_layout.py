"""vLLM 0.33.0's DSpark draft-input path, compiled from its wheel (tests/vllm_release.py) and
run around a splitserve export on a CPU.

From the release, as it is (paths under vllm/):
  transformers_utils/configs/speculators/algos.py   update_dspark
  transformers_utils/configs/speculators/base.py    SpeculatorsConfig: config.json -> the draft's HF config
  v1/worker/gpu/spec_decode/eagle/eagle3_utils.py   get_eagle3_aux_layers_from_config
  model_executor/models/interfaces.py               EagleModelMixin, SupportsEagle3.set_aux_hidden_state_layers
  model_executor/models/llama.py                    LlamaModel.forward: which target layers are captured, in what order
  v1/worker/gpu/spec_decode/speculator.py           BaseSpeculator, DraftModelSpeculator
  v1/worker/gpu/spec_decode/dflash/speculator.py    DFlashSpeculator (propose, _store_hidden_states,
                                                    _precompute_context_kv, _run_model), prepare_dflash_inputs and
                                                    _prepare_dflash_inputs_kernel (Triton, under its interpreter)
  v1/worker/gpu/spec_decode/dspark/speculator.py    DSparkSpeculator (__init__: sample_from_anchor and the query
                                                    width; _generate_draft, _sample_sequential, _sample_logits)
  v1/worker/gpu/spec_decode/utils.py                get_parallel_drafting_token_id
  v1/worker/gpu/cp_utils.py                         cp_local_slot (Triton)
  v1/worker/gpu/input_batch.py                      InputBuffers
  model_executor/models/qwen3_dflash.py             dflash_has_any_non_causal (the draft's causality)
  config/compilation.py                             CUDAGraphMode
Stand-ins, each doing no layout work of its own: the draft model (served_rounds.DraftCompute
over the export's tensors: combine_hidden_states = hidden_norm(fc(.)), the context K/V, the
Qwen3 block forward, lm_head, markov_w1 / markov_w2), the attention backend (K/V kept by slot;
a request reads the slots of positions [0, seq_len - Q) through its block table, then its Q query
rows, causal or not as the speculator says), the target's decoder layers (they hand LlamaModel.forward
the target's residual stream, residual=None), config objects as namespaces of the values vLLM
would hold, the forward context, and the eager dispatch (dp 1, no CUDA graph). The target's
verify and greedy accept are served_rounds': vLLM's rejection sampler is not run.
"""

from __future__ import annotations

import abc
import bisect
import collections.abc
import contextlib
import copy
import enum
import functools
import itertools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import torch
from served_rounds import GAMMA, DraftCompute, SlotKV, residual_streams
from release_code import release_imports
from vllm_release import compile_defs, compile_methods

SPEC = "vllm/v1/worker/gpu/spec_decode/"
MAX_REQS, MAX_TOKENS, MAX_LEN, KV_BLOCK = 4, 64, 256, 16


def forward_context(*args, **kwargs):
    """set_forward_context: the stand-in model reads what it needs from the speculator's buffers."""
    return contextlib.nullcontext()


@functools.lru_cache(maxsize=1)
def release() -> SimpleNamespace:
    """The release's code, compiled once."""
    log = logging.getLogger("vllm_release")
    base = {"torch": torch, "nn": torch.nn, "np": np, "logger": log, "Any": Any, "ClassVar": ClassVar}
    algos = compile_defs("vllm/transformers_utils/configs/speculators/algos.py",
                         ["SUPPORTED_SPECULATORS_TYPES", "register_speculator", "update_dspark"], dict(base))
    cfg_methods = compile_methods("vllm/transformers_utils/configs/speculators/base.py", "SpeculatorsConfig",
                                  ["extract_transformers_pre_trained_config", "validate_speculators_config",
                                   "build_vllm_speculative_config", "extract_vllm_speculative_config"],
                                  dict(base, SUPPORTED_SPECULATORS_TYPES=algos["SUPPORTED_SPECULATORS_TYPES"]))
    speculators_config = type("SpeculatorsConfig", (), cfg_methods)
    eagle3 = compile_defs(SPEC + "eagle/eagle3_utils.py", ["get_eagle3_aux_layers_from_config"], dict(base))
    mixin = compile_defs("vllm/model_executor/models/interfaces.py", ["EagleModelMixin"],
                         dict(base, bisect_right=bisect.bisect_right))["EagleModelMixin"]
    set_aux = compile_methods("vllm/model_executor/models/interfaces.py", "SupportsEagle3",
                              ["set_aux_hidden_state_layers"], dict(base, EagleModelMixin=mixin))
    llama_forward = compile_methods("vllm/model_executor/models/llama.py", "LlamaModel", ["forward"], dict(
        base, islice=itertools.islice, get_pp_group=lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True),
        IntermediateTensors=dict))["forward"]
    qwen3_dflash = compile_defs("vllm/model_executor/models/qwen3_dflash.py",
                                ["_SLIDING_ATTENTION", "_dflash_layer_causal", "dflash_has_any_non_causal"],
                                dict(base))
    graph_mode = compile_defs("vllm/config/compilation.py", ["CUDAGraphMode"], dict(base, enum=enum))["CUDAGraphMode"]
    import triton  # here, not at import: the test module skips first where triton is missing
    from triton import language as tl

    ns = dict(base, ABC=abc.ABC, abstractmethod=abc.abstractmethod, Mapping=collections.abc.Mapping,
              partial=functools.partial, copy=copy, tl=tl, triton=triton, CUDAGraphMode=graph_mode,
              replace=lambda obj, **kw: SimpleNamespace(**{**vars(obj), **kw}),
              get_eagle3_aux_layers_from_config=eagle3["get_eagle3_aux_layers_from_config"],
              set_forward_context=forward_context, BatchDescriptor=lambda **kw: SimpleNamespace(**kw),
              build_slot_mappings_by_layer=lambda slot_mappings, kv_cache_config: None,
              dispatch_cg_and_sync_dp=_eager_dispatch)
    compile_defs("vllm/v1/attention/backends/utils.py", ["PAD_SLOT_ID"], ns)
    compile_defs("vllm/v1/worker/gpu/input_batch.py", ["InputBuffers"], ns)
    compile_defs(SPEC + "utils.py", ["get_parallel_drafting_token_id"], ns)
    compile_defs("vllm/v1/worker/gpu/cp_utils.py", ["cp_local_slot"], ns, interpret=True)
    ns["_target_feeds_hc_residual"] = lambda vllm_config: False  # a Llama target has no HC residual hook
    compile_defs(SPEC + "speculator.py", ["BaseSpeculator", "DraftModelSpeculator"], ns)
    compile_defs(SPEC + "dflash/speculator.py", ["DFlashSpeculator", "_prepare_dflash_inputs_kernel",
                                                 "prepare_dflash_inputs"], ns, interpret=True)
    compile_defs(SPEC + "dspark/speculator.py", ["DSparkSpeculator"], ns)
    return SimpleNamespace(speculators_config=speculators_config, mixin=mixin,
                           set_aux_hidden_state_layers=set_aux["set_aux_hidden_state_layers"],
                           llama_forward=llama_forward, get_aux_layers=eagle3["get_eagle3_aux_layers_from_config"],
                           qwen3_dflash=qwen3_dflash, CUDAGraphMode=graph_mode, ns=ns)


def _eager_dispatch(manager, num_reqs, num_tokens, **kw):
    """dispatch_cg_and_sync_dp at dp 1 with no CUDA graph: the batch runs as it is."""
    mode = release().CUDAGraphMode.NONE
    return SimpleNamespace(cg_mode=mode, num_tokens=num_tokens, num_reqs=None), None


# ---- what vLLM reads from the export --------------------------------------------------------


@dataclass(frozen=True)
class VllmView:
    hf_config: SimpleNamespace  # the draft's HF config as vLLM builds it from config.json
    speculative: dict  # the printed --speculative-config
    aux_layers: tuple[int, ...]  # capture points, get_eagle3_aux_layers_from_config


def read_export(export_dir: Path, command: str) -> VllmView:
    """Our config.json through vLLM's SpeculatorsConfig, and the printed command's
    --speculative-config (num_speculative_tokens: γ)."""
    rel = release()
    cfg = json.loads((Path(export_dir) / "config.json").read_text())
    hf = SimpleNamespace(**rel.speculators_config.extract_transformers_pre_trained_config(copy.deepcopy(cfg)))
    speculative = json.loads(command.split("--speculative-config ", 1)[1].split("'")[1])
    spec_cfg = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf))
    return VllmView(hf, speculative, tuple(rel.get_aux_layers(spec_cfg)))


# ---- the target: vLLM's capture rule over its residual stream -------------------------------


class _StreamLayer:
    """A decoder layer that hands back the target's residual stream after layer i."""

    def __init__(self, owner, i):
        self.owner, self.i = owner, i

    def __call__(self, positions, hidden_states, residual, **kw):
        return self.owner.streams[self.i + 1][positions], None


def target_capture(num_layers: int, aux_layers: tuple[int, ...]):
    """A stand-in decoder (EagleModelMixin + LlamaModel.forward from the release) whose capture
    layers were set by SupportsEagle3.set_aux_hidden_state_layers. -> capture(streams, positions)
    -> the aux hidden states vLLM hands the drafter: a list of (T, D) in vLLM's order."""
    rel = release()

    class Decoder(rel.mixin):
        start_layer, end_layer = 0, num_layers
        forward = rel.llama_forward

        def __init__(self):
            self.layers = [_StreamLayer(self, i) for i in range(num_layers)]
            self.streams, self.positions = None, None

        def embed_input_ids(self, input_ids):
            return self.streams[0][self.positions]

        def norm(self, hidden_states, residual):
            return hidden_states, None

    decoder = Decoder()
    with release_imports({"vllm.distributed.parallel_state": {"model_parallel_is_initialized": lambda: False,
                                                              "get_pp_group": None}}):
        rel.set_aux_hidden_state_layers(SimpleNamespace(model=decoder), aux_layers)

    def capture(streams, positions):
        decoder.streams, decoder.positions = streams, positions
        out = decoder.forward(None, positions, None)
        return out[1] if isinstance(out, tuple) else []

    capture.layers = decoder.aux_hidden_state_layers
    return capture


# ---- the draft model and attention backend stand-ins ----------------------------------------


class StandInDraftModel:
    """What DSparkSpeculator calls on its `self.model`, computed by served_rounds.DraftCompute.
    Attention reads the speculator's own buffers: query_start_loc, seq_lens and the block table
    that prepare_dflash_inputs filled, as vLLM's attention metadata would carry them."""

    def __init__(self, compute: DraftCompute, spec):
        self.compute, self.spec, self.kv = compute, spec, SlotKV()
        self.block_table = spec.block_tables.input_block_tables[0]
        self.block_size = spec.block_tables.block_sizes[0]

    def combine_hidden_states(self, hidden_states):
        return self.compute.project(hidden_states)

    def precompute_and_store_context_kv(self, context_states, context_positions, context_slot_mapping=None):
        if context_slot_mapping is None:
            return
        kv = self.compute.context_kv(context_states, context_positions)
        self.kv.write(context_slot_mapping, context_positions, kv)

    def __call__(self, input_ids, positions, inputs_embeds=None):
        buf = self.spec.input_buffers
        out = torch.zeros(input_ids.shape[0], self.compute.draft.arch.hidden_size)
        causal = self.spec._group_causal
        causal = causal if isinstance(causal, bool) else any(causal.values())
        for r in range(MAX_REQS):
            start, end = int(buf.query_start_loc[r]), int(buf.query_start_loc[r + 1])
            if end == start:
                continue
            seq_len = int(buf.seq_lens[r])
            ctx_pos = list(range(seq_len - (end - start)))
            slots = [int(self.block_table[r, p // self.block_size]) * self.block_size + p % self.block_size
                     for p in ctx_pos]
            embeds = self.compute.draft.embed_tokens(input_ids[start:end].long())
            out[start:end] = self.compute.block(embeds, positions[start:end], self.kv.read(slots, ctx_pos),
                                                causal=causal)
        return out

    def compute_draft_logits(self, hidden_states):
        return self.compute.draft.lm_head(hidden_states)

    def map_draft_to_target(self, draft_ids):
        return draft_ids

    def markov_embed(self, token_ids):
        return self.compute.draft.markov.w1(token_ids.long())

    def markov_bias(self, markov_embed):
        return self.compute.draft.markov.w2(markov_embed)


def speculator(view: VllmView, compute: DraftCompute):
    """DSparkSpeculator built by the release's own __init__ chain from our export's config, with
    the stand-in model and one KV-cache group set where load_model and set_attn would put them."""
    rel = release()
    hf = view.hf_config

    class Served(rel.ns["DSparkSpeculator"]):
        def _build_uniform_attn_metadata(self, **kwargs):
            return None  # the stand-in attention reads the input buffers directly

    hidden = hf.hidden_size
    draft_model_config = SimpleNamespace(hf_config=hf, use_mla=False, get_hidden_size=lambda: hidden,
                                         get_vocab_size=lambda: hf.vocab_size)
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            method=view.speculative["method"], num_speculative_tokens=view.speculative["num_speculative_tokens"],
            draft_model_config=draft_model_config, use_local_argmax_reduction=False,
            enable_adaptive_verification=False, draft_sample_method="greedy"),
        scheduler_config=SimpleNamespace(max_num_seqs=MAX_REQS, max_num_batched_tokens=MAX_TOKENS),
        model_config=SimpleNamespace(dtype=torch.float32, use_fp64_gumbel=False, max_model_len=MAX_LEN,
                                     get_hidden_size=lambda: hidden),
        parallel_config=SimpleNamespace(data_parallel_size=1, data_parallel_rank=0, decode_context_parallel_size=1,
                                        prefill_context_parallel_size=1),
        compilation_config=SimpleNamespace(cudagraph_mode=rel.CUDAGraphMode.NONE),
        attention_config=SimpleNamespace())
    with release_imports({"vllm.model_executor.models.qwen3_dflash": rel.qwen3_dflash}):
        spec = Served(vllm_config, torch.device("cpu"))
    # set_attn's outcome for one draft KV group; BlockTables as the model runner fills it.
    spec.draft_kv_cache_group_ids, spec.draft_kv_cache_group_id = [0], 0
    spec._context_slot_mappings = torch.zeros(1, MAX_TOKENS, dtype=torch.int64)
    spec._layer_group_idx = None
    spec._group_causal = not spec.requires_non_causal
    spec.kv_cache_config = None
    table = torch.zeros(MAX_REQS, MAX_LEN // KV_BLOCK, dtype=torch.int32)
    table[0] = torch.arange(1, MAX_LEN // KV_BLOCK + 1)  # block 0 is the null block
    spec.block_tables = SimpleNamespace(slot_mappings=torch.zeros(1, MAX_TOKENS, dtype=torch.int64),
                                        input_block_tables=[table], block_sizes=[KV_BLOCK], cp_rank=0,
                                        cp_interleave=1)
    spec.model = StandInDraftModel(compute, spec)
    return spec


# ---- the engine: one request, greedy ------------------------------------------------------


class VllmEngine:
    """served_rounds' engine interface over vLLM's own propose(): each target step (the prefill,
    then each verify) hands propose the tokens it scheduled, their captured hidden states, and
    how many of them were rejected, exactly as the model runner does. `capture(num_layers, view)`
    builds the target's capture (default: the Llama target's, target_capture over view.aux_layers;
    tests/vllm_hybrid.py has the hybrid model classes')."""

    def __init__(self, export_dir: Path, command: str, compute: DraftCompute, target, capture=None):
        self.view = read_export(export_dir, command)
        self.spec = speculator(self.view, compute)
        if capture is None:
            self.capture = target_capture(target.info.num_layers, self.view.aux_layers)
        else:
            self.capture = capture(target.info.num_layers, self.view)
        self.target = target
        self.steps: list[dict] = []  # what the kernel wrote each step, for the contract tests

    def _propose(self, seq: list[int], rows: int, num_sampled: int, num_rejected: int, bonus: int) -> list[int]:
        """seq: the committed tokens followed by this step's `rows` scheduled tokens, of which the
        last `num_rejected` were rejected; `num_sampled` tokens were sampled, `bonus` the last."""
        positions = torch.arange(len(seq) - rows, len(seq))
        aux = self.capture(residual_streams(self.target, seq), positions)
        batch = SimpleNamespace(
            num_reqs=1, num_tokens=rows, positions=positions,
            query_start_loc=torch.tensor([0, rows], dtype=torch.int32),
            idx_mapping=torch.tensor([0], dtype=torch.int32),
            num_scheduled_tokens=np.array([rows]), seq_lens_cpu_upper_bound=torch.tensor([len(seq)]))
        last_sampled = torch.zeros(MAX_REQS, dtype=torch.int64)
        last_sampled[0] = bonus
        drafts = self.spec.propose(
            batch, None, None, last_hidden_states=None, aux_hidden_states=aux,
            num_sampled=torch.tensor([num_sampled], dtype=torch.int32),
            num_rejected=torch.tensor([num_rejected], dtype=torch.int32), last_sampled=last_sampled,
            next_prefill_tokens=torch.zeros(MAX_REQS, dtype=torch.int64),
            temperature=torch.zeros(MAX_REQS), seeds=torch.zeros(MAX_REQS, dtype=torch.int64))
        q, buf = self.spec.num_query_per_req, self.spec.input_buffers
        ctx = zip(self.spec.context_positions[:rows].tolist(), self.spec._context_slot_mappings[0][:rows].tolist())
        self.steps.append(dict(input_ids=buf.input_ids[:q].tolist(), positions=buf.positions[:q].tolist(),
                               seq_len=int(buf.seq_lens[0]),
                               context_positions=[pos for pos, slot in ctx if slot >= 0],  # rows that write K/V
                               sample_indices=self.spec.sample_indices[:GAMMA].tolist(),
                               sample_pos=self.spec.sample_pos[:GAMMA].tolist()))
        return drafts[0].tolist()

    def first_block(self, prompt: list[int], bonus: int) -> list[int]:
        self.committed = list(prompt)
        return self._propose(self.committed, len(prompt), 1, 0, bonus)

    def next_block(self, verify_ids: list[int], n: int, bonus: int) -> list[int]:
        drafts = self._propose(self.committed + verify_ids, len(verify_ids), n + 1, len(verify_ids) - 1 - n, bonus)
        self.committed += verify_ids[: n + 1]
        return drafts
