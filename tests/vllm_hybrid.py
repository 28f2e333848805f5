"""vLLM 0.33.0's capture of a hybrid target's hidden states for a dspark draft, as each hybrid
model class that splitserve/export/hybrid_serving.py says vLLM serves does it, compiled from the
wheel (tests/release_code.py) and run over a tiny hybrid target's residual stream on a CPU.

The model runner hands the class the draft config's capture points
(v1/worker/gpu/spec_decode/eagle/eagle3_utils.py set_eagle3_aux_hidden_state_layers over
get_eagle3_aux_layers_from_config: our layer l is point l + 1); the class's
set_aux_hidden_state_layers (SupportsEagle3's, which goes through get_language_model on a
multimodal class, or Qwen3.5's own) sets them on its decoder, and the decoder's forward takes
point k as the stream after layer k - 1. From the release, as it is: set_eagle3_aux_hidden_state_layers
and reserve_aux_intermediate_tensor_slots, the class's set_aux_hidden_state_layers and, where
the class has it, SupportsMultiModal.get_language_model (each found through the class's bases in
the wheel, release_code.lineage), EagleModelMixin, and the decoder's own forward and
_set_aux_hidden_state_layers where it overrides the mixin's (Kimi-Linear, with its super()).
Stand-ins, each doing no layout work of its own: the decoder layers (each hands back the target's
stream after it split in two halves, hidden_states + residual, so that a capture of one half
alone shows), the final norm, pipeline groups of one rank, supports_eagle3 (the class has
SupportsEagle3 among its bases in the wheel), and what __init__ sets: which child is the language
model (`_mark_language_model`), no sequence parallelism, no Kimi-K3 attention residuals (the
kimi_linear config's attn_res_block_size defaults to None).
"""

from __future__ import annotations

import ast
import functools
import itertools
import logging
import typing
from types import SimpleNamespace

import torch
from release_code import compile_into, compile_resolved, defining, lineage, pick, release_imports
from vllm_release import VERSION, tree, wheel

import vllm_layout

M = "vllm/model_executor/models/"
KIMI = "vllm/models/kimi_k3/nvidia/model.py"
# model class (hybrid_serving's "path:Class") -> the chain of attributes its __init__ builds down
# to the decoder (an EagleModelMixin): [(attribute, class)]
INNER = {
    M + "qwen3_next.py:Qwen3NextForCausalLM": [("model", M + "qwen3_next.py:Qwen3NextModel")],
    M + "qwen3_5.py:Qwen3_5ForConditionalGeneration": [("language_model", M + "qwen3_5.py:Qwen3_5ForCausalLM"),
                                                       ("model", M + "qwen3_5.py:Qwen3_5Model")],
    M + "qwen3_5.py:Qwen3_5MoeForConditionalGeneration": [("language_model", M + "qwen3_5.py:Qwen3_5MoeForCausalLM"),
                                                          ("model", M + "qwen3_5.py:Qwen3_5Model")],
    M + "qwen3_5.py:Qwen3_5ForCausalLM": [("model", M + "qwen3_5.py:Qwen3_5Model")],
    M + "qwen3_5.py:Qwen3_5MoeForCausalLM": [("model", M + "qwen3_5.py:Qwen3_5Model")],
    KIMI + ":KimiLinearForCausalLM": [("model", KIMI + ":KimiLinearModel")],
    M + "nemotron_h.py:NemotronHForCausalLM": [("model", M + "nemotron_h.py:NemotronHModel")],
}
# what the decoder's forward may take from a class other than EagleModelMixin
DECODER_METHODS = ("forward", "_set_aux_hidden_state_layers", "_maybe_add_hidden_state", "_cache_aux_pp_layout",
                   "collect_remote_aux_hidden_states", "pack_local_aux_hidden_states")
GROUP = SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1)  # pipeline parallel 1
NO_PARALLEL_STATE = {"vllm.distributed.parallel_state": {"model_parallel_is_initialized": lambda: False,
                                                         "get_pp_group": lambda: GROUP}}


@functools.lru_cache(maxsize=None)
def _parse(path: str):
    return tree(path) if path in wheel().namelist() else None


def _classes(model_class: str):
    path, cls = model_class.split(":")
    return lineage(_parse, path, cls)


def _compile(path: str, names: list[str], namespace: dict) -> dict:
    """Top-level definitions of a release file, in a module of this file's own (tests/vllm_layout.py
    compiles others of the same files)."""
    nodes = pick(tree(path), names, f"vllm {VERSION} {path}")
    return compile_into(nodes, path, "vllm_hybrid." + path.removesuffix(".py").replace("/", "."), namespace)


@functools.lru_cache(maxsize=1)
def _release() -> SimpleNamespace:
    """The model runner's entry and the multimodal lookup, compiled once."""
    rel = vllm_layout.release()
    base = dict(rel.ns, logger=logging.getLogger("vllm_release"), cast=typing.cast, SupportsEagle3=object,
                supports_eagle3=lambda model: getattr(model, "supports_eagle3", False),
                get_eagle3_aux_layers_from_config=rel.get_aux_layers)
    entry = _compile("vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
                     ["set_eagle3_aux_hidden_state_layers", "reserve_aux_intermediate_tensor_slots"], dict(base))
    mm = _compile("vllm/utils/collection_utils.py", ["common_prefix"], {})
    mm = _compile(M + "interfaces.py", ["_is_language_model"], dict(mm, TypeIs=object, VllmModel=object))
    ns = dict(base, EagleModelMixin=rel.mixin, **mm, _language_model_by_module={}, islice=itertools.islice,
              get_pp_group=lambda: GROUP, IntermediateTensors=dict)
    return SimpleNamespace(set_layers=entry["set_eagle3_aux_hidden_state_layers"], ns=ns, mixin=rel.mixin)


class _TextModel:
    """A multimodal class's text model (Qwen3_5ForCausalLM): what get_language_model looks for."""

    def embed_input_ids(self, input_ids):
        raise AssertionError("not reached")

    forward = embed_input_ids


class _StreamLayer:
    """A target decoder layer: hands back the target's stream after it as hidden_states +
    residual (two halves: exact in floating point), and an unchanged prefix_sum where asked."""

    use_attn_reduce_scatter_for_moe = False

    def __init__(self, owner, i):
        self.owner, self.i = owner, i

    def __call__(self, positions, hidden_states, residual, **kw):
        half = self.owner.streams[self.i + 1][positions] * 0.5
        return (half, kw["prefix_sum"], half) if "prefix_sum" in kw else (half, half)


def target_capture(model_class: str, num_layers: int, hf_config):
    """`model_class` (a served hybrid row's vLLM class) set up by the model runner for a dspark
    draft whose HF config vLLM built is `hf_config` -> capture(streams, positions) -> the aux hidden
    states vLLM hands the drafter, a list of (T, D). capture.points: the decoder's
    aux_hidden_state_layers; capture.hook: where the class's set_aux_hidden_state_layers comes from."""
    rel = _release()
    ns = rel.ns
    outer, chain = _classes(model_class), INNER[model_class]
    builder = outer
    for attr, cls in chain:  # each class is built by the one before it (its name is in that one's source)
        assert any(cls.split(":")[1] in ast.unparse(node) for _, node in builder), (
            f"vllm {VERSION}: {builder[0][1].name} no longer builds {cls}")
        builder = _classes(cls)
    inner = builder

    class Decoder(*compile_resolved(inner, list(DECODER_METHODS), ns, "vllm_hybrid", bases=("EagleModelMixin",),
                                    provided=("EagleModelMixin",)), rel.mixin):
        start_layer, end_layer = 0, num_layers
        use_sequence_parallel, use_attn_res = False, False

        def __init__(self):
            self.layers = [_StreamLayer(self, i) for i in range(num_layers)]
            self.aux_hidden_state_layers = ()
            self.streams, self.positions = None, None

        def embed_input_ids(self, input_ids):
            return self.streams[0][self.positions]

        def norm(self, hidden_states, residual):
            return hidden_states + residual, None

        norm_f = norm

    decoder = Decoder()
    hooks = ["set_aux_hidden_state_layers", "get_language_model"]

    class Model(*compile_resolved(outer, hooks, ns, "vllm_hybrid"), torch.nn.Module):
        supports_eagle3 = any(node.name == "SupportsEagle3" for _, node in outer)

        def __init__(self):
            super().__init__()
            holder = self
            for attr, _ in chain[:-1]:  # a multimodal class's text model, which _mark_language_model names
                self._language_model_names = [attr]
                setattr(holder, attr, _TextModel())
                holder = getattr(holder, attr)
            setattr(holder, chain[-1][0], decoder)

    model = Model()
    spec_config = SimpleNamespace(method="dspark", draft_model_config=SimpleNamespace(hf_config=hf_config))
    with release_imports(NO_PARALLEL_STATE):
        rel.set_layers(model, spec_config)

    def capture(streams, positions):
        decoder.streams, decoder.positions = streams, positions
        out = decoder.forward(None, positions, None)
        return out[1] if isinstance(out, tuple) else []

    where = defining(outer, "set_aux_hidden_state_layers")
    capture.points, capture.hook = tuple(decoder.aux_hidden_state_layers), f"{where[0]}:{where[1].name}"
    return capture
