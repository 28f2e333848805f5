"""SGLang 0.5.23's capture of a hybrid target's hidden states for a DSPARK draft, as each hybrid
model class that splitserve/export/hybrid_serving.py says SGLang serves does it, compiled from the
wheel (tests/release_code.py) and run over a tiny hybrid target's residual stream on a CPU.

Which hidden states reach the draft is the target model class's code, and it differs between
classes: configure_aux_hidden_state_capture calls set_dspark_layers_to_capture where the class has
it (Kimi-Linear, Ling 3.0: the draft's layer ids as they are, captured after layer i) and
set_dflash_layers_to_capture otherwise (Qwen3-Next, Qwen3.5, Nemotron-H: ids + 1, captured as the
stream entering that layer). From the release, as it is: configure_aux_hidden_state_capture
(tests/sglang_layout.py compiles it), the class's hook(s), found through its bases in the wheel
(release_code.lineage), the inner model's (`self.model`'s) set_dflash_layers_to_capture where the
hook hands the ids on, what the inner model's __init__ sets before any hook runs, and the inner
model's forward (the capture loop). Stand-ins, each doing no layout work of its own: the decoder
layers (each records the stream entering it when its layer boundary is asked to: layers/
layer_boundary/stage.py _prepare_attention `capture_gathered` / `capture`, capture_output; then
hands back the target's stream after it), residual_batch (a stream held as one complete tensor:
complete_output and snapshot give it back, final_norm captures it first when asked), the expert
recorder, pipeline groups of one rank, and the forward batch's flags.
"""

from __future__ import annotations

import ast
import contextlib
import functools
from types import SimpleNamespace

import torch
from release_code import compile_resolved, lineage, named
from sglang_release import SRT, VERSION, tree, wheel

import sglang_layout

HOOKS = ("set_dspark_layers_to_capture", "set_dflash_layers_to_capture")  # configure_aux_hidden_state_capture's order
# model class (hybrid_serving's "path:Class") -> the class its __init__ builds as self.model
INNER = {
    SRT + "models/qwen3_next.py:Qwen3NextForCausalLM": SRT + "models/qwen3_next.py:Qwen3NextModel",
    # Qwen3VLForConditionalGeneration.__init__ builds the language_model_cls these two pass it
    SRT + "models/qwen3_5.py:Qwen3_5ForConditionalGeneration": SRT + "models/qwen3_5.py:Qwen3_5ForCausalLM",
    SRT + "models/qwen3_5.py:Qwen3_5MoeForConditionalGeneration": SRT + "models/qwen3_5.py:Qwen3_5MoeForCausalLM",
    # the text-only classes build their body_cls
    SRT + "models/qwen3_5_text.py:Qwen3_5ForCausalLM": SRT + "models/qwen3_5.py:Qwen3_5ForCausalLM",
    SRT + "models/qwen3_5_text.py:Qwen3_5MoeForCausalLM": SRT + "models/qwen3_5.py:Qwen3_5MoeForCausalLM",
    SRT + "models/kimi_linear.py:KimiLinearForCausalLM": SRT + "models/kimi_linear.py:KimiLinearModel",
    SRT + "models/bailing_moe_v3.py:BailingMoeV3ForCausalLM": SRT + "models/bailing_moe_v3.py:BailingMoELinearModel",
    SRT + "models/nemotron_h.py:NemotronHForCausalLM": SRT + "models/nemotron_h.py:NemotronHModel",  # by _init_model
}
# what an inner model's __init__ sets that its hook or forward reads
INIT_ATTRS = ("layers_to_capture", "dspark_layers_to_capture", "capture_aux_hidden_states",
              "flashinfer_mnnvl_cutedsl_fusion")
GROUP = SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1)  # pipeline and tensor parallel 1


@functools.lru_cache(maxsize=None)
def _parse(path: str) -> ast.Module | None:
    """A file of the wheel by its full path, or None (a base class from outside sglang/srt)."""
    if not path.startswith(SRT) or path not in wheel().namelist():
        return None
    return tree(path.removeprefix(SRT))


def _classes(model_class: str):
    path, cls = model_class.split(":")
    return lineage(_parse, path, cls)


def _init_values(classes, attrs) -> dict:
    """attr -> the literal ([], None, set(), ...) the lineage's __init__ assigns to self.attr, the
    least nested assignment first (a later one sits under a condition)."""
    out = {}
    for _, node in reversed(classes):  # a subclass's __init__ runs its own assignments last
        init = named(node.body).get("__init__")
        if init is None:
            continue
        seen = {}
        for stmt in ast.walk(init):
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
            if (isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name) and target.value.id == "self" and target.attr in attrs
                    and target.attr not in seen):
                value = ast.unparse(stmt.value)
                seen[target.attr] = set() if value == "set()" else ast.literal_eval(value)
        out.update(seen)
    return out


def _final_norm(hidden_states, forward_batch, norm, capture=None, **kw):
    if capture is not None:
        capture(hidden_states)
    return norm(hidden_states)


def _namespace() -> dict:
    rel = sglang_layout.release()
    residual_batch = SimpleNamespace(start=lambda fb: None, complete_output=lambda h, fb: h,
                                     snapshot=lambda h, fb: h.clone(), final_norm=_final_norm)
    return dict(rel.capture, torch=torch, residual_batch=residual_batch, Layers=_StreamLayer,
                get_global_expert_distribution_recorder=lambda: SimpleNamespace(
                    with_current_layer=lambda i: contextlib.nullcontext()),
                get_parallel=lambda: SimpleNamespace(pp_group=GROUP), BumpAllocator=lambda **kw: None)


class _StreamLayer:
    """A target decoder layer: records the stream entering it when its boundary is asked to
    capture, then hands back the target's stream after it."""

    def __init__(self, owner, i):
        self.owner, self.i = owner, i
        self.boundary = SimpleNamespace(capture_output=lambda h, fb: (h, h.clone()))

    def __call__(self, hidden_states, captured_last_layer_outputs=None, capture_output=None, **kw):
        if captured_last_layer_outputs is not None:
            captured_last_layer_outputs.capture(hidden_states)
        if capture_output is not None:
            capture_output(hidden_states)
        return self.owner.streams[self.i + 1][self.owner.positions]

    forward = __call__


def target_capture(model_class: str, num_layers: int, layer_ids: list[int]):
    """`model_class` (a served hybrid row's SGLang class) set up by configure_aux_hidden_state_capture
    for DSPARK with `layer_ids` -> capture(streams, positions) -> the (T, m*D) target hidden SGLang
    hands the draft. capture.hook: the hook that ran; capture.points: where the class then
    captures, in its own terms (the layers it marked, or the ids it keeps)."""
    rel = sglang_layout.release()
    ns = _namespace()
    outer = _classes(model_class)
    inner = _classes(INNER[model_class])
    assert any(INNER[model_class].split(":")[1] in ast.unparse(node) for _, node in outer), (
        f"sglang {VERSION} {model_class} no longer builds {INNER[model_class]}")
    init = _init_values(inner, INIT_ATTRS)

    class Decoder(*compile_resolved(inner, ["forward", *HOOKS], ns, "sglang_hybrid")):
        start_layer, end_layer, pp_group = 0, num_layers, GROUP

        def __init__(self):
            self.__dict__.update(init)
            self.layers = [_StreamLayer(self, i) for i in range(num_layers)]
            self.streams, self.positions = None, None

        def embed_tokens(self, input_ids):
            return self.streams[0][self.positions]

        word_embeddings = embed_tokens

        def norm(self, hidden_states):
            return hidden_states

        norm_f = norm

    called = []

    class Target(*compile_resolved(outer, list(HOOKS), ns, "sglang_hybrid")):
        pp_group = GROUP
        config = SimpleNamespace(num_hidden_layers=num_layers)

        def __init__(self):
            self.model = Decoder()
            self.capture_aux_hidden_states = False

    for hook in HOOKS:  # record which one configure_aux_hidden_state_capture calls
        if hasattr(Target, hook):
            setattr(Target, hook, _recording(getattr(Target, hook), hook, called))
    target = Target()
    rel.capture["configure_aux_hidden_state_capture"](
        model=target, eagle_use_aux_hidden_state=False, eagle_aux_hidden_state_layer_ids=None,
        dflash_use_aux_hidden_state=True, dflash_target_layer_ids=layer_ids, is_dspark=True)

    def capture(streams, positions):
        target.model.streams, target.model.positions = streams, positions
        batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False), can_run_tbo=False,
                                capture_hidden_mode=SimpleNamespace(need_capture=lambda: True))
        out = target.model.forward(None, positions, batch)
        assert isinstance(out, tuple), f"{model_class} captured nothing"
        return rel.capture["pack_aux_hidden_states"](out[1])

    decoder = target.model
    marked = [i for i, layer in enumerate(decoder.layers) if getattr(layer, "_is_layer_to_capture", False)]
    kept = getattr(decoder, "dspark_layers_to_capture", None) or getattr(decoder, "layers_to_capture", None)
    capture.hook, capture.points = called[0], marked or sorted(kept)
    return capture


def _recording(fn, name, called):
    def hook(self, layer_ids):
        called.append(name)
        return fn(self, layer_ids)
    return hook
