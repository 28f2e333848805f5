"""SGLang 0.5.23's DSPARK draft-input path, compiled from its wheel (tests/sglang_release.py's
download, tests/release_code.py's compiler) and run around a splitserve export on a CPU.

From the release, as it is (paths under sglang/srt/ unless they start with sglang/kernels):
  speculative/dspark_components/dspark_config.py  parse_dspark_draft_config, resolve_runtime_config,
      get_dspark_sample_from_anchor; models/dspark.py Qwen3DSparkModel (its load_weights and Markov
      heads: VanillaMarkov, GatedMarkovHead, RNNHead), as tests/sglang_release.py builds them
  model_executor/model_runner_components/spec_aux_hidden_state.py  _resolve_dflash_aux_hidden_state
  model_executor/model_runner_components/attention_backend_setup.py  configure_aux_hidden_state_capture
  models/llama.py  LlamaForCausalLM.set_dflash_layers_to_capture, LlamaModel.forward (the capture loop)
  layers/aux_hidden_states.py  AuxHiddenStateList, pack_aux_hidden_states
  speculative/draft_worker_common.py  build_block_pos_offsets
  speculative/dspark_components/dspark_planner.py  VerifyWindow, alloc_verify_window
  speculative/dspark_components/dspark_kv_inject.py  TargetHiddenKvInjector (place_prefill, inject_prefill,
      inject_target_hidden), with model_executor/forward_batch_info.py compute_position
  speculative/dspark_components/dspark_draft.py  DraftBlockProposer (propose, _run_forward, draft_block_ids_view),
      sample_draft_block, draft_markov_block, _draft_step, select_draft_hidden_without_anchor
  speculative/dspark_components/dspark_verify.py  TargetVerifyExecutor.commit_hidden (static verify)
  sglang/kernels/ops/speculative/dspark/dspark_draft_model.py  MarkovGreedyStep (its CPU path)
  sglang/kernels/ops/speculative/dspark/markov_sample.py  MarkovSampleStep (its CPU path)
The worker (dspark_worker_v2.py) is not run; its order of calls is: prefill: place_prefill, target
forward, inject_prefill; decode: alloc_verify_window, propose, verify [anchor | drafts] at the
window's positions, commit_hidden. Stand-ins, each doing no layout work of its own: the draft
model's forward and K/V writes (served_rounds.DraftCompute over the export's tensors; its
Markov heads are SGLang's own, loaded by SGLang's load_weights), the draft attention (K/V kept by
cache location; a request reads positions [0, seq_len) through req_to_token, here location =
position + 1, then its query rows, causal or not as _get_dflash_layer_attention_params says), the
pool's prefix-valid write (the first commit_len columns of a verify row), the KV-location planner
(kv_index_translator: the same locations), the target's decoder layers (each captures the
residual stream it is given when asked, then hands back the target's stream after it), config
objects and server flags. The target's verify and greedy accept are served_rounds'.
"""

from __future__ import annotations

import abc
import ast
import contextlib
import copy
import enum
import functools
import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from release_code import compile_into, pick, pick_methods, release_imports
from served_rounds import DraftCompute, SlotKV, residual_streams
from sglang_release import VERSION, Envs, Struct, dspark_release, tree, wheel

LOG = logging.getLogger("sglang_layout")


def _kernel_tree(path: str) -> ast.Module:
    return ast.parse(wheel().read(path).decode(), filename=path)


def _load(path: str, names: list[str], namespace: dict) -> dict:
    """Top-level definitions of sglang/srt/<path> (or a sglang/kernels file by its full path)."""
    t = _kernel_tree(path) if path.startswith("sglang/") else tree(path)
    nodes = pick(t, names, f"sglang {VERSION} {path}")
    return compile_into(nodes, path, "sglang_layout." + path.removesuffix(".py").replace("/", "."), namespace)


def _methods(path: str, cls: str, names: list[str], namespace: dict) -> dict:
    nodes = pick_methods(tree(path), cls, names, f"sglang {VERSION} {path}")
    ns = compile_into(nodes, path, "sglang_layout." + path.removesuffix(".py").replace("/", ".") + "." + cls,
                      dict(namespace))
    return {n: ns[n] for n in names}


def _released(module: str, name: str):
    """A name sglang_release.dspark_release() compiled, from its registered module."""
    return sys.modules[f"sglang_release.{module}"].__dict__[name]


class _Flags(SimpleNamespace):
    """Invariant checks and enum-like constants the extracted code only passes around."""

    def __getattr__(self, name):
        return name


@functools.lru_cache(maxsize=1)
def release() -> SimpleNamespace:
    dspark = dspark_release()  # config parsing, the model classes and their Markov heads
    msgspec = SimpleNamespace(Struct=Struct)
    base = {"torch": torch, "F": F, "logger": LOG, "logging": logging, "functools": functools, "msgspec": msgspec,
            "Optional": Optional, "Callable": Callable, "NamedTuple": NamedTuple, "enum": enum, "copy": copy}
    import triton
    from triton import language as tl

    kern = "sglang/kernels/ops/speculative/dspark/"
    kernels = dict(base, triton=triton, tl=tl)
    _load(kern + "dispatch.py", ["inputs_on_cuda"], kernels)
    _load(kern + "dspark_draft_model.py", ["MarkovGreedyStep", "markov_greedy_step"], kernels)
    _load(kern + "markov_sample.py", ["_NO_INDEX", "_UNIFORM_SCALE", "_PHILOX_ROUNDS", "_ROUND_CODE", "_mul32",
                                      "_philox", "MarkovSampleStep"], kernels)

    capture = dict(base, get_spec=lambda: SimpleNamespace(speculative_draft_model_path=None,
                                                          speculative_draft_model_revision=None),
                   is_deepseek_v4=lambda config: False,
                   ModelConfig=SimpleNamespace(from_server_args=lambda server_args, **kw: server_args.draft))
    _load("model_executor/model_runner_components/spec_aux_hidden_state.py",
          ["_MUSE_LAYER_OUTPUT_DRAFT_ARCHITECTURES", "_map_muse_target_layer_ids", "SpecAuxHiddenStateConfig",
           "_resolve_dflash_aux_hidden_state"], capture)
    _load("model_executor/model_runner_components/attention_backend_setup.py",
          ["configure_aux_hidden_state_capture"], capture)
    _load("layers/aux_hidden_states.py", ["AuxHiddenStateList", "pack_aux_hidden_states"], capture)
    llama = dict(capture, residual_batch=SimpleNamespace(start=lambda fb: None,
                                                         final_norm=lambda h, fb, norm: norm(h)))
    set_capture = _methods("models/llama.py", "LlamaForCausalLM", ["set_dflash_layers_to_capture"], llama)
    llama_forward = _methods("models/llama.py", "LlamaModel", ["forward"], llama)["forward"]

    ns = dict(base, envs=Envs(), Invariant=lambda *a: None, Bucket=_Flags(), NotNaN=lambda: None,
              expect=lambda invariant, value: value, unwrap_lora_layer=lambda m: m,
              DraftParallelSpec=lambda **kw: SimpleNamespace(**kw), DraftTPExecution=_Flags(),
              resolve_draft_parallel_layout=lambda spec: spec, draft_tp_context=lambda layout: contextlib.nullcontext(),
              enable_num_token_non_padded=lambda: False, is_pin_memory_available=lambda device=None: False,
              ForwardBatch=lambda **kw: SimpleNamespace(**kw), ForwardMode=_Flags(), CaptureHiddenMode=_Flags(),
              SpeculativeAlgorithm=_Flags(), SpecTpSyncSite=_Flags(), ABC=abc.ABC,
              MarkovGreedyStep=kernels["MarkovGreedyStep"], MarkovSampleStep=kernels["MarkovSampleStep"],
              support_triton=lambda backend: False)  # compute_position's torch path: the same positions
    _load("model_executor/forward_batch_info.py", ["compute_position", "compute_position_torch"], ns)
    _load("speculative/draft_worker_common.py", ["build_block_pos_offsets"], ns)
    _load("speculative/dspark_components/dspark_planner.py", ["VerifyWindow", "alloc_verify_window"], ns)
    _load("speculative/dspark_components/dspark_kv_inject.py", ["PrefillPlacement", "TargetHiddenKvInjector"], ns)
    _load("speculative/dspark_components/dspark_draft.py", [
        "_make_num_token_non_padded", "DraftBlockResult", "DraftForwardResult", "DraftProposal",
        "select_draft_hidden_without_anchor", "DraftParams", "_zero", "resolve_draft_params",
        "STAGED_PARAMS_LOG_EVERY", "_DRAFT_NOISE_DOMAIN", "draft_noise_key", "DraftNoise", "step_logits_width",
        "_draft_step", "draft_markov_block", "sample_draft_block", "DraftBlockProposer"], ns)
    commit = _methods("speculative/dspark_components/dspark_verify.py", "TargetVerifyExecutor", ["commit_hidden"],
                      ns)["commit_hidden"]
    return SimpleNamespace(dspark=dspark, ns=ns, capture=capture, commit_hidden=commit,
                           set_dflash_layers_to_capture=set_capture["set_dflash_layers_to_capture"],
                           llama_forward=llama_forward,
                           layer_attention=_released("models.dflash", "_get_dflash_layer_attention_params"),
                           parse_dflash=_released("speculative.dflash_utils", "parse_dflash_draft_config"))


# ---- what SGLang reads from the export ------------------------------------------------------


def launch_flags(command: str) -> dict[str, str]:
    """--flag value pairs of a printed launch command."""
    words = command.replace("\\\n", " ").split()
    return {w[2:]: words[i + 1] for i, w in enumerate(words) if w.startswith("--") and i + 1 < len(words)}


def capture_layer_ids(export_dir: Path, hf, num_target_layers: int, model_type: str = "llama") -> list[int]:
    """The target layer ids SGLang resolves for DSPARK (_resolve_dflash_aux_hidden_state, run with
    the export as the draft model, for a target of `model_type`)."""
    rel = release()
    config = rel.capture["SpecAuxHiddenStateConfig"](is_dspark=True)
    model_config = SimpleNamespace(hf_text_config=SimpleNamespace(num_hidden_layers=num_target_layers),
                                   hf_config=SimpleNamespace(model_type=model_type))
    server_args = SimpleNamespace(draft=SimpleNamespace(hf_config=hf))  # the draft ModelConfig it builds
    algo = SimpleNamespace(is_dflash_family=lambda: True, is_dspark=lambda: True)
    with release_imports({"sglang.srt.speculative.dflash_utils": {"parse_dflash_draft_config": rel.parse_dflash},
                          "sglang.srt.speculative.dspark_components.dspark_config": {
                              "parse_dspark_draft_config": rel.dspark.parse_dspark_draft_config}}):
        rel.capture["_resolve_dflash_aux_hidden_state"](config=config, server_args=server_args,
                                                        model_config=model_config, spec_algorithm=algo,
                                                        is_draft_worker=False)
    return config.dflash_target_layer_ids


class _StreamLayer:
    """A target decoder layer: captures the residual stream entering it when asked (the layer
    boundary's capture), then hands back the target's stream after it."""

    def __init__(self, owner, i):
        self.owner, self.i = owner, i

    def __call__(self, positions, hidden_states, forward_batch, capture_output=None):
        if capture_output is not None:
            capture_output(hidden_states)
        return self.owner.streams[self.i + 1][positions]


def target_capture(num_layers: int, layer_ids: list[int]):
    """A stand-in Llama target whose capture was configured by configure_aux_hidden_state_capture
    -> capture(streams, positions) -> the (T, m*D) target hidden SGLang hands the draft."""
    rel = release()

    class Decoder:
        forward = rel.llama_forward
        start_layer, end_layer = 0, num_layers
        pp_group = SimpleNamespace(is_first_rank=True, is_last_rank=True)

        def __init__(self):
            self.layers = [_StreamLayer(self, i) for i in range(num_layers)]
            self.layers_to_capture, self.streams, self.positions = [], None, None

        def embed_tokens(self, input_ids):
            return self.streams[0][self.positions]

        def norm(self, hidden_states):
            return hidden_states

    class Target:
        set_dflash_layers_to_capture = rel.set_dflash_layers_to_capture
        pp_group = SimpleNamespace(is_last_rank=True)
        config = SimpleNamespace(num_hidden_layers=num_layers)

        def __init__(self):
            self.model = Decoder()

    target = Target()
    rel.capture["configure_aux_hidden_state_capture"](
        model=target, eagle_use_aux_hidden_state=False, eagle_aux_hidden_state_layer_ids=None,
        dflash_use_aux_hidden_state=True, dflash_target_layer_ids=layer_ids, is_dspark=True)

    def capture(streams, positions):
        target.model.streams, target.model.positions = streams, positions
        _, aux = target.model.forward(None, positions, None)
        return rel.capture["pack_aux_hidden_states"](aux)

    capture.layers_to_capture = target.model.layers_to_capture
    return capture


# ---- the draft model, its runner and pool --------------------------------------------------


class StandInDraftModel:
    """What SGLang's DSPARK worker calls on its draft model. The Markov head is SGLang's own
    (Qwen3DSparkModel's, loaded from the export by its load_weights); the rest is DraftCompute."""

    def __init__(self, compute: DraftCompute, sglang_model, embed: torch.nn.Module):
        self.compute, self.kv = compute, SlotKV()
        self.sample_from_anchor = sglang_model.sample_from_anchor
        self.gamma = sglang_model.gamma
        self.markov_head = sglang_model.markov_head
        self.confidence_head = sglang_model.confidence_head
        self.embed_tokens = embed  # attach_shared_modules: the target's embedding

    def forward_embed(self, input_ids):
        return self.embed_tokens(input_ids)

    def compute_base_logits(self, hidden):
        # the target lm_head at tensor parallel 1: hidden @ W^T, whole vocabulary
        return self.compute.draft.lm_head(hidden), hidden

    def write_target_hidden_kv(self, *, target_hidden, pool, positions, cache_loc, cache_loc_2d=None,
                               commit_lens=None, target_hidden_is_projected=False):
        feats = target_hidden if target_hidden_is_projected else self.compute.project(target_hidden)
        kv = self.compute.context_kv(feats, positions)
        keep = None
        if cache_loc_2d is not None and commit_lens is not None:  # the pool's set_kv_buffer_prefix_valid
            cols = torch.arange(cache_loc_2d.shape[1])[None]
            keep = (cols < commit_lens.long()[:, None]).reshape(-1)
            cache_loc = cache_loc_2d.reshape(-1)
        self.kv.write(cache_loc, positions, kv, keep)


class LocPlan:
    """kv_index_translator's plan for a uniform extend: location = position + 1 (0 is padding)."""

    def __init__(self, write: torch.Tensor):
        self.write_virtual = write

    def write_ids(self, translator, cols=None):
        return self.write_virtual

    def bind(self, forward_batch, translator, cols=None):
        pass  # the batch already holds these locations as out_cache_loc


class Translator:
    def plan_uniform_extend(self, *, req_pool_indices, seq_lens, seq_lens_cpu, width, positions_out=None,
                            anchor_src=None, anchor_out=None):
        assert positions_out is None and anchor_out is None  # SGLANG_OPT_DSV41_DSPARK_PREPARE_INPUTS_ONCE off
        return LocPlan((seq_lens[:, None] + 1 + torch.arange(width)).reshape(-1))

    def own_plan(self, batch):
        return LocPlan(batch.out_cache_loc)


class DraftRunner:
    """The draft ModelRunner: forward() runs the block the proposer built, attending to the
    request's context locations [1, seq_len] (positions 0 .. seq_len - 1) and to its own rows."""

    def __init__(self, model: StandInDraftModel, causal: bool):
        self.model, self.causal = model, causal
        self.device = torch.device("cpu")
        self.attn_backend = SimpleNamespace(needs_cpu_seq_lens=False)
        self.kv_index_translator = Translator()
        self.decode_cuda_graph_runner = None
        self.token_to_kv_pool = SimpleNamespace()  # a plain (non-SWA, non-MLA) pool
        self.batches: list = []

    def forward(self, fb):
        self.batches.append(fb)
        bs = fb.batch_size
        embeds = fb.input_embeds if fb.input_embeds is not None else self.model.forward_embed(fb.input_ids)
        q = embeds.shape[0] // bs
        out = []
        for r in range(bs):
            ctx_pos = list(range(int(fb.seq_lens[r])))
            ctx = self.model.kv.read([p + 1 for p in ctx_pos], ctx_pos)
            rows = slice(r * q, (r + 1) * q)
            out.append(self.model.compute.block(embeds[rows], fb.positions[rows], ctx, causal=self.causal))
        return SimpleNamespace(logits_output=SimpleNamespace(hidden_states=torch.cat(out)), can_run_graph=False)


# ---- the engine: one request, greedy --------------------------------------------------------


class SglangEngine:
    """served_rounds' engine interface over SGLang's own injector, verify window and proposer.
    `capture(num_layers, layer_ids)` builds the target's capture (default: the Llama target's,
    target_capture; tests/sglang_hybrid.py has the hybrid model classes')."""

    def __init__(self, export_dir: Path, command: str, compute: DraftCompute, target, hf=None, capture=None):
        from safetensors.torch import load_file
        from transformers import AutoConfig

        rel = release()
        self.hf = hf if hf is not None else AutoConfig.from_pretrained(export_dir)
        flags = launch_flags(command)
        # --speculative-dspark-block-size γ sets --speculative-num-draft-tokens γ+1 (arg_groups/fields/spec.py)
        runtime = rel.dspark.resolve_runtime_config(
            draft_hf_config=self.hf, speculative_num_draft_tokens=int(flags["speculative-dspark-block-size"]) + 1,
            target_vocab_size=target.info.vocab_size)
        self.verify_width = runtime.verify_num_draft_tokens
        sglang_model = rel.dspark.Qwen3DSparkModel(self.hf)
        sglang_model.load_weights(iter(load_file(str(Path(export_dir) / "model.safetensors")).items()))
        embed = torch.nn.Embedding.from_pretrained(target.embed_weight().detach().float())
        self.model = StandInDraftModel(compute, sglang_model, embed)
        causal = any(rel.layer_attention(self.hf, i)[1].name == "DECODER" for i in range(self.hf.num_hidden_layers))
        self.runner = DraftRunner(self.model, causal)
        self.layer_ids = capture_layer_ids(export_dir, self.hf, target.info.num_layers, target.config.model_type)
        self.capture = (capture or target_capture)(target.info.num_layers, self.layer_ids)
        self.offsets = rel.ns["build_block_pos_offsets"](length=self.verify_width, device="cpu")
        self.target_runner = SimpleNamespace(device="cpu", kv_index_translator=self.runner.kv_index_translator,
                                             prefill_attention_backend_str="torch_native")
        self.injector = rel.ns["TargetHiddenKvInjector"](
            draft_model=self.model, draft_model_runner=self.runner, model_runner=self.target_runner, device="cpu",
            verify_num_draft_tokens=self.verify_width, block_pos_offsets=self.offsets)
        self.proposer = rel.ns["DraftBlockProposer"](
            draft_model=self.model, draft_model_runner=self.runner, gamma=runtime.gamma,
            mask_token_id=runtime.mask_token_id, draft_block_spec_info=None,
            tp_sync=SimpleNamespace(sync=lambda site, t: t), random_seed=0, greedy_draft=True)
        self.verifier = SimpleNamespace(kv_injector=self.injector, verify_num_draft_tokens=self.verify_width)
        self.target = target
        self.target_model = SimpleNamespace(get_input_embeddings=lambda: embed)
        self.steps: list[dict] = []

    def _batch(self, **kw):
        base = dict(req_pool_indices=torch.tensor([0]), seq_lens=torch.tensor([len(self.committed)]),
                    seq_lens_cpu=torch.tensor([len(self.committed)]), can_run_decode_cuda_graph=False,
                    is_extend_in_batch=False, dp_spec_prefill_coordination_applied=False, global_num_tokens=None)
        return SimpleNamespace(**(base | kw))

    def _propose(self, bonus: int) -> list[int]:
        rel = release()
        batch = self._batch()
        self.window = rel.ns["alloc_verify_window"](
            batch=batch, bs=1, device="cpu", verify_num_draft_tokens=self.verify_width,
            block_pos_offsets=self.offsets, model_runner=self.target_runner, seq_lens_cpu=batch.seq_lens_cpu)
        proposal = self.proposer.propose(
            batch=batch, draft_input=SimpleNamespace(bonus_tokens=torch.tensor([bonus]), nxt_kv_lens_cpu=None),
            verify_window=self.window, bs=1, device="cpu", target_model=self.target_model, sampling_info=None)
        fb = self.runner.batches[-1]
        self.steps.append(dict(input_ids=fb.input_ids.tolist(), positions=fb.positions.tolist(),
                               seq_len=int(fb.seq_lens[0]), anchor=int(proposal.draft_block_ids[0, 0]),
                               verify_positions=self.window.positions_2d[0].tolist()))
        return proposal.draft_block.draft_tokens[0].tolist()

    def first_block(self, prompt: list[int], bonus: int) -> list[int]:
        self.committed = list(prompt)
        n = len(prompt)
        batch = self._batch(extend_lens=[n], prefix_lens=[0], out_cache_loc=torch.arange(1, n + 1))
        placement = self.injector.place_prefill(batch)
        hidden = self.capture(residual_streams(self.target, prompt), torch.arange(n))
        self.injector.inject_prefill(placement, target_hidden=hidden, token_indices=None,
                                     target_hidden_is_projected=False)
        return self._propose(bonus)

    def next_block(self, verify_ids: list[int], n: int, bonus: int) -> list[int]:
        positions = self.window.positions_2d[0]
        assert positions.tolist() == list(range(len(self.committed), len(self.committed) + len(verify_ids))), (
            f"SGLang verifies [anchor | drafts] at positions {positions.tolist()}, "
            f"not at the tokens' own {len(self.committed)}..")
        hidden = self.capture(residual_streams(self.target, self.committed + verify_ids), positions)
        release().commit_hidden(self.verifier, batch=self._batch(), layout=None, hidden_strided=None,
                                verify_window=self.window, logits_output=SimpleNamespace(hidden_states=hidden),
                                commit_lens=torch.tensor([n + 1], dtype=torch.int32), bs=1, run_compact=False)
        self.committed += verify_ids[: n + 1]
        return self._propose(bonus)
