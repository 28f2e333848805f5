"""The pinned SGLang release's own Python source, run on a CPU without importing sglang.

sglang 0.5.23 imports its CUDA kernel library at package import, so the tests never import it.
They download its wheel once (`pip download --no-deps`, cached), read the source files from the zip,
and compile chosen top-level functions and classes (by name, with `ast`) into a namespace in which
the few CUDA-backed primitives those definitions call are replaced by CPU stand-ins below
(`cpu_primitives`). Everything else is SGLang's own code. A name the extracted code reaches that
is neither extracted nor stubbed raises NameError: a changed code path fails the test, loudly.
"""

from __future__ import annotations
import __future__ as future_flags

import ast
import enum
import functools
import logging
import os
import sys
import types
import zipfile
from types import SimpleNamespace

import torch
from release_code import release_wheel
from torch import nn

VERSION = "0.5.23"
SRT = "sglang/srt/"


@functools.lru_cache(maxsize=1)
def wheel() -> zipfile.ZipFile:
    """The sglang wheel (SPLITSERVE_SGLANG_WHEEL, else downloaded into the user cache). Skips,
    naming pip's error, only when the package index cannot be reached."""
    return release_wheel("sglang", VERSION, "manylinux_2_34_x86_64", "SPLITSERVE_SGLANG_WHEEL", timeout_s=900)


def source(path: str) -> str:
    """A file of the release, e.g. source("models/dspark.py") for sglang/srt/models/dspark.py."""
    return wheel().read(SRT + path).decode()


@functools.lru_cache(maxsize=None)
def tree(path: str) -> ast.Module:
    return ast.parse(source(path), filename=path)


def top_level(path: str) -> dict[str, ast.stmt]:
    """name -> its top-level def, class or assignment in a release file."""
    out = {}
    for node in tree(path).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node
    return out


def load(path: str, names: list[str], namespace: dict) -> dict:
    """Compile the named top-level definitions of a release file, in file order, into namespace.
    The file's own `from __future__ import annotations` is kept (annotations stay strings)."""
    defs = top_level(path)
    missing = [n for n in names if n not in defs]
    assert not missing, f"sglang {VERSION} {path} no longer defines {missing}"
    wanted = {id(defs[n]) for n in names}
    body = [node for node in tree(path).body if id(node) in wanted]
    code = compile(ast.Module(body=body, type_ignores=[]), f"sglang/srt/{path}", "exec",
                   flags=future_flags.annotations.compiler_flag, dont_inherit=True)
    # a registered module: dataclasses and pickling look classes up through sys.modules
    module = types.ModuleType(f"sglang_release.{path.removesuffix('.py').replace('/', '.')}")
    module.__dict__.update(namespace)
    sys.modules[module.__name__] = module
    exec(code, module.__dict__)
    namespace.update(module.__dict__)
    return namespace


def env_defaults() -> dict[str, object]:
    """The defaults environ.py declares (`NAME = EnvStr("static")` and the like), by name."""
    out = {}
    for node in ast.walk(tree("environ.py")):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id.startswith("Env") and node.value.args
                and isinstance(node.value.args[0], ast.Constant)):
            out[node.targets[0].id] = node.value.args[0].value
    return out


class Envs:
    """`envs.NAME.get()`: the process environment, else environ.py's default."""

    def __init__(self):
        self._defaults = env_defaults()

    def __getattr__(self, name):
        default = self._defaults[name]
        return SimpleNamespace(get=lambda: os.environ.get(name, default))


# ---- CPU stand-ins for the CUDA-backed primitives (tensor parallel 1) ----------------------

class Recorder:
    """Every checkpoint tensor that reached a weight loader (by id), so a test can tell the ones a
    loader dropped on the floor."""

    def __init__(self):
        self.loaded: set[int] = set()

    def wrap(self, loader):
        def recording(param, loaded, *args):
            self.loaded.add(id(loaded))
            return loader(param, loaded, *args)
        return recording


RECORDER = Recorder()


class Struct:
    """msgspec.Struct as used by the extracted classes: keyword/positional fields in annotation
    order, class attributes as defaults, frozen by convention."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__()

    def __init__(self, *args, **kwargs):
        names = [n for c in reversed(type(self).__mro__) for n in getattr(c, "__annotations__", {})]
        names = list(dict.fromkeys(names))
        values = dict(zip(names, args)) | kwargs
        for n in names:
            if n not in values and not hasattr(type(self), n):
                raise TypeError(f"{type(self).__name__} missing field {n!r}")
            object.__setattr__(self, n, values.get(n, getattr(type(self), n, None)))
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()


class Norm(nn.Module):
    """layers/layernorm.py RMSNorm / GemmaRMSNorm: one `weight` (hidden,)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size))
        self.variance_epsilon = eps


class Linear(nn.Module):
    """layers/linear.py Row/Replicated linear at tp=1: `weight` (out, in), optional bias."""

    def __init__(self, input_size, output_size, bias=True, quant_config=None, prefix="", **kw):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.bias = nn.Parameter(torch.empty(output_size)) if bias else None


class Stacked(nn.Module):
    """A fused linear at tp=1 whose checkpoint shards land at fixed row offsets of `weight`
    (QKVParallelLinear: q, k, v; MergedColumnParallelLinear: 0, 1, ...). The weight loader
    checks each shard's shape and writes its rows."""

    def __init__(self, input_size, shards: dict, bias: bool):
        super().__init__()
        self.offsets, start = {}, 0
        for sid, size in shards.items():
            self.offsets[sid] = (start, size)
            start += size
        self.weight = nn.Parameter(torch.empty(start, input_size))
        self.weight.weight_loader = self._load
        self.bias = None
        assert not bias, "the stand-in covers bias-free fused linears only"

    def _load(self, param, loaded, shard_id):
        RECORDER.loaded.add(id(loaded))
        start, size = self.offsets[shard_id]
        assert tuple(loaded.shape) == (size, param.shape[1]), (shard_id, tuple(loaded.shape), (size, param.shape[1]))
        param.data[start : start + size].copy_(loaded)


def qkv_parallel_linear(hidden_size, head_size, total_num_heads, total_num_kv_heads, bias=False, **kw):
    return Stacked(hidden_size, {"q": total_num_heads * head_size, "k": total_num_kv_heads * head_size,
                                 "v": total_num_kv_heads * head_size}, bias)


def merged_column_parallel_linear(input_size, output_sizes, bias=False, **kw):
    return Stacked(input_size, dict(enumerate(output_sizes)), bias)


class Stub(nn.Module):
    """A module without parameters (attention kernels, rotary caches, activations)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.kwargs = kwargs


def refuse(what):
    def f(*a, **k):
        raise AssertionError(f"the replay reached {what}, which this export should never need")
    return f


def cpu_primitives() -> dict:
    """Globals the extracted model code calls, in their CPU, tensor-parallel-1 form."""
    return {
        "torch": torch, "nn": nn, "F": torch.nn.functional, "logger": logging.getLogger("sglang_release"),
        "partial": functools.partial, "enum": enum, "Enum": enum.Enum,
        "Optional": object, "Tuple": object, "Iterable": object, "Callable": object, "List": object,
        "Any": object, "Sequence": object,
        "get_parallel": lambda: SimpleNamespace(tp_size=1), "get_spec": refuse("get_spec (Nemotron drafts)"),
        "RMSNorm": Norm, "GemmaRMSNorm": Norm, "RowParallelLinear": Linear, "ReplicatedLinear": Linear,
        "QKVParallelLinear": qkv_parallel_linear, "MergedColumnParallelLinear": merged_column_parallel_linear,
        "get_rope": Stub, "RadixAttention": Stub, "SiluAndMul": Stub,
        "VocabParallelEmbedding": refuse("VocabParallelEmbedding (Nemotron drafts)"),
        "DFlashGroupedConv": refuse("DFlashGroupedConv"), "set_weight_attrs": refuse("set_weight_attrs"),
        "sharded_weight_loader": refuse("sharded_weight_loader"),
        "DraftParallelSpec": lambda **kw: SimpleNamespace(**kw), "DraftTPExecution": SimpleNamespace(SINGLE_GROUP=0),
        "_is_npu": False, "msgspec": SimpleNamespace(Struct=Struct),
    }


@functools.lru_cache(maxsize=1)
def dspark_release() -> SimpleNamespace:
    """SGLang's DSPARK draft config parsing and model classes, compiled from the release:
    .parse_dspark_draft_config / .resolve_runtime_config / .get_dspark_sample_from_anchor
    (speculative/dspark_components/dspark_config.py over speculative/dflash_utils.py),
    .Qwen3DSparkModel (models/dspark.py over models/dflash.py), .read_ragged_verify_mode."""
    import collections.abc
    from abc import ABC, abstractmethod
    from dataclasses import dataclass
    from numbers import Integral

    typing_names = {"Optional": object, "List": object, "Any": object, "Tuple": object,
                    "Sequence": collections.abc.Sequence, "Integral": Integral, "dataclass": dataclass,
                    "logger": logging.getLogger("sglang_release")}
    du = load("speculative/dflash_utils.py", [
        "DEFAULT_DFLASH_MASK_TOKEN", "build_target_layer_ids", "get_dflash_layer_types",
        "get_dflash_attention_sliding_window_size", "_cfg_get", "_get_text_config", "_get_dflash_config",
        "is_nemotron_35_draft_config", "_parse_optional_int", "DFlashDraftConfig", "parse_dflash_draft_config",
    ], dict(typing_names))
    dc = load("speculative/dspark_components/dspark_config.py", [
        "DEFAULT_DSPARK_GAMMA", "SUPPORTED_DSPARK_MARKOV_HEAD_TYPES", "get_dspark_sample_from_anchor",
        "dspark_gamma_from_num_draft_tokens", "DSparkDraftConfig", "DSparkRuntimeConfig", "resolve_runtime_config",
        "_cfg_get", "_get_text_config", "_get_nested_config", "_get_dspark_config", "parse_dspark_draft_config",
    ], dict(typing_names, msgspec=SimpleNamespace(Struct=Struct),
            parse_dflash_draft_config=du["parse_dflash_draft_config"]))
    rv = load("speculative/ragged_verify.py", ["RaggedVerifyMode", "read_ragged_verify_mode"],
              {"Enum": enum.Enum, "envs": Envs()})
    weight_utils = load("model_loader/weight_utils.py", ["default_weight_loader"], {"torch": torch})
    loader = RECORDER.wrap(weight_utils["default_weight_loader"])
    common = {**cpu_primitives(), **typing_names, "default_weight_loader": loader}
    df = dict(common)
    df["AttentionType"] = load("layers/radix_attention.py", ["AttentionType"], {"Enum": enum.Enum})["AttentionType"]
    df["get_rope_config"] = load("utils/hf_transformers/common.py", ["get_rope_config"], {})["get_rope_config"]
    for name in ("get_dflash_layer_types", "get_dflash_attention_sliding_window_size", "is_nemotron_35_draft_config",
                 "parse_dflash_draft_config"):
        df[name] = du[name]
    load("models/dflash.py", ["_get_dflash_attention_type", "_get_dflash_layer_attention_params",
                              "_ROPE_DIM_SUPERSEDED_KEYS", "DFlashAttention", "DFlashMLP", "DFlashDecoderLayer",
                              "DFlashDraftModel"], df)
    ds = dict(common, ABC=ABC, abstractmethod=abstractmethod, DFlashDraftModel=df["DFlashDraftModel"],
              parse_dspark_draft_config=dc["parse_dspark_draft_config"],
              get_dspark_sample_from_anchor=dc["get_dspark_sample_from_anchor"],
              RaggedVerifyMode=rv["RaggedVerifyMode"], read_ragged_verify_mode=rv["read_ragged_verify_mode"],
              envs=rv["envs"])
    load("models/dspark.py", ["BaseDSparkMarkovHead", "VanillaMarkov", "GatedMarkovHead", "RNNHead",
                              "build_markov_head", "DSparkConfidenceHead", "build_confidence_head",
                              "_DSPARK_SKIPPED_WEIGHT_PREFIXES", "DSparkDraftMixin", "DSparkDraftModel",
                              "Qwen3DSparkModel"], ds)
    sts = load("speculative/dspark_components/dspark_sts.py", ["DSparkStsCalibration"],
               {"msgspec": SimpleNamespace(Struct=Struct)})
    return SimpleNamespace(parse_dspark_draft_config=dc["parse_dspark_draft_config"],
                           DSparkStsCalibration=sts["DSparkStsCalibration"],
                           resolve_runtime_config=dc["resolve_runtime_config"],
                           get_dspark_sample_from_anchor=dc["get_dspark_sample_from_anchor"],
                           read_ragged_verify_mode=rv["read_ragged_verify_mode"],
                           RaggedVerifyMode=rv["RaggedVerifyMode"], Qwen3DSparkModel=ds["Qwen3DSparkModel"])
