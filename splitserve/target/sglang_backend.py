"""SGLang target backend: the frozen target run in-process by SGLang's model runner (CUDA only).

Written against sglang 0.5.23 (the `[sglang]` extra pins it) and refused, before anything loads,
on any other version: SGLang changed these internals between releases. NOT YET RUN on a GPU:
tests/test_sglang_backend.py checks, without importing sglang, that every SGLang module, class,
method, attribute and keyword this file uses exists in 0.5.23's source; the parity test there and
bench/sglang_target_gpu.sh run it where sglang and a CUDA GPU exist.

It captures exactly what the transformers backend captures (`Capture`: the m captured layers'
outputs and the final-norm hidden state) for training and `splitserve dump`: it implements
`CaptureTarget` (target/backend.py) and not `DecodingTarget`, so held-out evaluation, `eval` and
`serve` keep the transformers backend (a decoding caller refuses this one: `require_decoding`).

SGLang touchpoints (sglang 0.5.23, python/sglang/srt/ unless noted):
  benchmark/one_batch.py (package sglang/): load_model and extend are the recipe followed here,
      prefill only: ServerArgs.resolve_once, runtime_context.publish, the gemm/moe config
      initialisers, distributed.bootstrap.init_parallel_runtime / init_layer_runtime,
      ModelRunner(model_config, mem_fraction_static, gpu_id, nccl_port, server_args),
      alloc_memory_pool, init_attention_backends (no CUDA graphs: prefill only);
      Req + full_untruncated_fill_ids / logprob_start_len / extend_end, ScheduleBatch.init_new with
      a no-prefix-sharing tree cache, prepare_for_extend, ForwardBatch.init_new, ModelRunner.forward.
  models/llama.py (and qwen3.py, qwen2.py): `set_dflash_layers_to_capture(ids)` sets
      `layers_to_capture = [l + 1 for l in ids]`; the decoder loop captures the residual stream
      entering layer l+1 (the output of layer l, HF `hidden_states[l + 1]`) in ascending order, and
      the causal LM calls `logits_processor(input_ids, hidden_states, lm_head, forward_batch,
      aux_hidden_states)` with `hidden_states` after the final norm. A pre-hook on that call reads both.
Glossary: B batch, T tokens, D hidden, V vocab, m captured layers.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from array import array
from types import SimpleNamespace
from typing import Any

import torch

from splitserve.assets import resolve_target_path
from splitserve.config import TargetConfig
from splitserve.records import Capture, TargetInfo
from splitserve.target.arch import LogitTransform
from splitserve.target.hf import DTYPES, _info_from_config, hub_kwargs, load_target_config, load_tokenizer

SGLANG_VERSION = "0.5.23"  # the release this file is written and contract-tested against


class SGLangUnavailable(RuntimeError):
    """target.backend=sglang was selected where it cannot run."""


def _sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


def _sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:  # importable but not installed as a distribution
        return "of unknown version"


def missing_requirements(device: str | torch.device | None) -> list[str]:
    """Why the sglang backend cannot start here ([] when it can). Imports nothing heavy."""
    problems = []
    if not _sglang_installed():
        problems.append("the sglang package is not installed (pip install -e '.[sglang]')")
    elif _sglang_version() != SGLANG_VERSION:
        problems.append(f"sglang {_sglang_version()} is installed, but this backend drives SGLang's internal "
                        f"ModelRunner API as of sglang {SGLANG_VERSION}, which changes between releases "
                        f"(pip install 'sglang=={SGLANG_VERSION}')")
    if not torch.cuda.is_available():
        problems.append("no CUDA GPU is visible (SGLang's model runner needs one)")
    elif device is not None and str(device) != "auto" and torch.device(device).type != "cuda":
        problems.append(f"target.device={device} is not a CUDA device")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        problems.append(
            "a torch.distributed process group is already running (a torchrun split job): SGLang would "
            "build its parallel groups over the whole world; dump with the sglang backend in a plain "
            "process instead (splitserve dump target.backend=sglang), then train from the dump"
        )
    return problems


def _gpu_index(device: str | torch.device | None) -> int:
    if device is None or str(device) == "auto":
        return torch.cuda.current_device()
    dev = torch.device(device)
    return dev.index if dev.index is not None else torch.cuda.current_device()


def start_runner(path: str, cfg: TargetConfig, gpu_id: int):
    """SGLang's ModelRunner for one GPU, tensor parallel 1, eager (benchmark/one_batch.py load_model)."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import bootstrap
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.runtime_context import SpawnRanks, get_device, get_model, publish, spawn_world_rank
    from sglang.srt.server_args import PortArgs, ServerArgs

    torch.cuda.set_device(gpu_id)
    server_args = ServerArgs(model_path=path, dtype=cfg.dtype, tp_size=1, base_gpu_id=gpu_id,
                             mem_fraction_static=cfg.sglang_mem_fraction, disable_cuda_graph=True)
    server_args.resolve_once()
    _set_envs_and_config(server_args)
    port_args = PortArgs.init_new(server_args)
    publish(server_args, role="scheduler",
            ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=0, pp_rank=0), gpu_id=gpu_id))
    initialize_moe_config()
    initialize_fp8_gemm_config()
    initialize_bf16_gemm_config()
    initialize_fp4_gemm_config()
    model_config = ModelConfig.from_server_args(server_args)
    bootstrap.init_parallel_runtime(server_args=server_args, device=get_device().device,
                                    dist_port=port_args.nccl_port)
    bootstrap.init_layer_runtime(model_config=model_config)
    runner = ModelRunner(model_config=model_config, mem_fraction_static=resolving_view(server_args).mem_fraction_static,
                         gpu_id=gpu_id, nccl_port=port_args.nccl_port, server_args=server_args)
    overlap = get_model().is_startup_weight_load_overlap
    if overlap:
        runner.start_startup_weight_load()
    runner.alloc_memory_pool()
    runner.init_attention_backends()
    if overlap:
        runner.finalize_startup_weight_load()
    return runner


class _NoPrefixCache(SimpleNamespace):
    """The tree cache ScheduleBatch allocates through, sharing nothing (one_batch.py's
    TreeCacheNamespace): every capture depends on its own tokens only."""

    def supports_swa(self) -> bool:
        return False

    def supports_mamba(self) -> bool:
        return False

    def supports_prefix_sharing(self) -> bool:
        return True

    def evict(self, params) -> None:
        pass

    def maybe_hand_to_session(self, req) -> None:
        pass


class SGLangTarget:
    """Implements `CaptureTarget` (target/backend.py) with SGLang's model runner."""

    def __init__(self, runner, info: TargetInfo, tokenizer: Any = None, gpu_id: int = 0):
        self.runner = runner
        self._device = torch.device("cuda", gpu_id)
        self.model = runner.model
        self.config = runner.model.config  # the target's HF config (read by resolve_arch)
        self.info = info
        self.logit_transform = LogitTransform.from_config(self.config)  # training's target distribution
        self.tokenizer = tokenizer
        self._final: torch.Tensor | None = None
        self._aux: torch.Tensor | None = None
        ids = list(info.layer_ids)
        if ids != sorted(set(ids)):
            # SGLang captures each layer once, in ascending order; the draft's W_c columns follow ids.
            raise ValueError(f"the sglang backend needs strictly increasing target.layer_ids, got {ids}")
        setter = getattr(self.model, "set_dflash_layers_to_capture", None)
        if setter is None:
            raise SGLangUnavailable(f"SGLang's {type(self.model).__name__} cannot capture layer outputs "
                                    "(no set_dflash_layers_to_capture): use a target family SGLang's DFLASH "
                                    "or DSPARK serve (Llama, Qwen2/3, ...)")
        setter(ids)
        self.model.logits_processor.register_forward_pre_hook(self._on_logits, with_kwargs=True)

    def _on_logits(self, _module, args, kwargs):
        # logits_processor(input_ids, hidden_states, lm_head, forward_batch, aux_hidden_states)
        self._final = args[1] if len(args) > 1 else kwargs["hidden_states"]
        aux = args[4] if len(args) > 4 else kwargs.get("aux_hidden_states")
        self._aux = None if aux is None else torch.cat(list(aux), dim=-1)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _extend(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One prefill of all rows -> final (ΣT, D), aux (ΣT, m*D), rows concatenated."""
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch
        from sglang.srt.runtime_context import get_schedule
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        total = sum(len(r) for r in rows)
        pool = getattr(self.runner, "max_total_num_tokens", None)
        if pool is not None and total > pool:
            raise ValueError(f"a capture of {total} tokens exceeds SGLang's KV pool of {pool} tokens "
                             "(raise target.sglang_mem_fraction or lower data.max_length)")
        reqs = []
        for i, ids in enumerate(rows):
            req = Req(rid=f"capture-{i}", origin_input_text="", origin_input_ids=array("q", ids),
                      sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
            req.full_untruncated_fill_ids = req.origin_input_ids
            req.logprob_start_len = -1
            req.extend_end = len(req.origin_input_ids)
            reqs.append(req)
        runner = self.runner
        tree_cache = _NoPrefixCache(page_size=get_schedule().page_size, device=runner.device,
                                    token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator)
        batch = ScheduleBatch.init_new(reqs=reqs, req_to_token_pool=runner.req_to_token_pool,
                                       token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
                                       tree_cache=tree_cache, model_config=runner.model_config, enable_overlap=False,
                                       spec_algorithm=SpeculativeAlgorithm.NONE)
        batch.prepare_for_extend()
        if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
            batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device, non_blocking=True)
            batch.prefill_input_ids_cpu = None
        forward_batch = ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)
        self._final = self._aux = None
        try:
            runner.forward(forward_batch)
        finally:  # nothing is cached between captures: every record depends on its own tokens only
            runner.req_to_token_pool.clear()
            runner.token_to_kv_pool_allocator.clear()
        final, aux = self._final, self._aux
        m_d = len(self.info.layer_ids) * self.info.hidden_size
        if final is None or aux is None or tuple(aux.shape) != (total, m_d) or final.shape[0] != total:
            raise RuntimeError(
                f"SGLang returned final {None if final is None else tuple(final.shape)} and aux "
                f"{None if aux is None else tuple(aux.shape)}; expected ({total}, {self.info.hidden_size}) and "
                f"({total}, {m_d}): this sglang captures layers differently from the release this backend targets"
            )
        return final, aux

    @torch.no_grad()
    def capture(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Capture:
        """input_ids: (B, T), right-padded where attention_mask says so -> aux (B, T, m*D),
        final (B, T, D); padded positions are zero. Each row is its own request (no padding
        reaches SGLang)."""
        b, t = input_ids.shape
        lengths = [t] * b if attention_mask is None else attention_mask.sum(-1).tolist()
        if attention_mask is not None and any(not attention_mask[i, :n].all() for i, n in enumerate(lengths)):
            raise ValueError("the sglang backend takes right-padded batches only")
        rows = [input_ids[i, :n].tolist() for i, n in enumerate(lengths)]
        final, aux = self._extend(rows)
        out_aux = aux.new_zeros(b, t, aux.shape[-1])  # (B, T, m*D)
        out_final = final.new_zeros(b, t, final.shape[-1])  # (B, T, D)
        start = 0
        for i, n in enumerate(lengths):
            out_aux[i, :n], out_final[i, :n] = aux[start : start + n], final[start : start + n]
            start += n
        return Capture(aux=out_aux, final=out_final)

    def embed_weight(self) -> torch.Tensor:
        # SGLang pads the vocab of its embedding / lm_head (VocabParallelEmbedding); keep V rows.
        return self.model.get_input_embeddings().weight[: self.info.vocab_size]

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.lm_head.weight[: self.info.vocab_size]


def load_sglang_target(cfg: TargetConfig, device: torch.device | str | None = None) -> SGLangTarget:
    """Check that SGLang can run here (before anything heavy), then start it on the target."""
    where = device if device is not None else cfg.device
    problems = missing_requirements(where)
    if problems:
        raise SGLangUnavailable("target.backend=sglang cannot start: " + "; ".join(problems))
    if cfg.dtype not in DTYPES:
        raise ValueError(f"target.dtype must be one of {sorted(DTYPES)}, got {cfg.dtype!r}")
    path = resolve_target_path(cfg.path)
    info = _info_from_config(load_target_config(cfg), cfg, cfg.name)
    gpu_id = _gpu_index(where)
    return SGLangTarget(start_runner(path, cfg, gpu_id), info, load_tokenizer(path, **hub_kwargs(cfg)), gpu_id)
