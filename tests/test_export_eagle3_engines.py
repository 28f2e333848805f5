"""EAGLE-3 exports read by the engines' own code: vLLM 0.33.0's speculators config code and its
target capture, SGLang 0.5.23's LlamaForCausalLMEagle3 (load_weights, the d2t hot-token map, its
forward) and its target capture, compiled from the released wheels on a CPU
(tests/eagle3_release.py). Both engines must capture exactly the layers the draft was trained
on, each from its own convention; an id written without vLLM's +1 is caught.
"""

import copy
import json

import pytest
import torch
from floats import assert_float32_close
from safetensors.torch import load_file
from eagle3_tiny import STEPS, T, ascending, eagle3_draft, inputs
from served_rounds import residual_streams

import eagle3_release as er
from splitserve.export.eagle3 import export_eagle3
from splitserve.models.build import build_draft
from splitserve.models.eagle3 import Eagle3Cache

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: thread hand-offs cost more than the work

CASES = [dict(), dict(layers=2, layer_ids=(4, 1, 2)), dict(vocab=96)]
CASE_IDS = ["one-layer", "two-layers-unsorted-capture", "full-vocab"]


def _ours_by_layer(draft, aux):
    d = draft.arch.hidden_size
    return {l: aux[0, :, i * d:(i + 1) * d] for i, l in enumerate(draft.arch.target_layer_ids)}


# ---- vLLM ----------------------------------------------------------------------------------


def test_vllm_config_code_reads_our_eagle3_export(tmp_path):
    target, draft = eagle3_draft()
    exp = export_eagle3(draft, tmp_path / "spec", "speculators", "/models/target", ["LlamaForCausalLM"], 512)
    hf, spec, aux_layers = er.vllm_reads(exp.out_dir)
    assert hf["architectures"] == ["Eagle3LlamaForCausalLM"]  # update_eagle3's map for model_type llama
    assert hf["draft_vocab_size"] == draft.arch.draft_vocab_size and hf["vocab_size"] == draft.arch.vocab_size
    assert hf["norm_before_residual"] is False and hf["target_hidden_size"] == draft.arch.hidden_size
    assert hf["norm_before_fc"] is False and hf["fc_norm"] is False and hf["norm_output"] is False
    assert spec == {"method": "eagle3", "num_speculative_tokens": STEPS}
    assert aux_layers == tuple(l + 1 for l in sorted(draft.arch.target_layer_ids))
    # why norm_before_residual is written: left out, vLLM's default is the other residual
    cfg = json.loads((exp.out_dir / "config.json").read_text())
    cfg.pop("norm_before_residual")
    assert er.vllm().config.extract_transformers_pre_trained_config(copy.deepcopy(cfg))["norm_before_residual"] is True


@pytest.mark.parametrize("kw", CASES[:2], ids=CASE_IDS[:2])
def test_vllm_captures_the_layers_the_draft_was_trained_on(tmp_path, kw):
    target, draft = eagle3_draft(**kw)
    exp = export_eagle3(draft, tmp_path / "spec", "speculators", "/models/target", ["LlamaForCausalLM"], 512)
    _, _, aux_layers = er.vllm_reads(exp.out_dir)
    ids, aux = inputs(target)
    got = er.vllm_capture(aux_layers, residual_streams(target, ids[0].tolist()))
    by_layer = _ours_by_layer(draft, aux)
    assert len(got) == len(by_layer)
    for tensor, layer in zip(got, sorted(by_layer)):  # concatenated in ascending layer order, as fc was permuted
        assert torch.equal(tensor, by_layer[layer]), layer
    # ids written as ours, without the +1: vLLM would capture each layer one earlier
    early = er.vllm_capture(tuple(sorted(draft.arch.target_layer_ids)), residual_streams(target, ids[0].tolist()))
    assert not any(torch.equal(t, by_layer[layer]) for t, layer in zip(early, sorted(by_layer)))


# ---- SGLang ----------------------------------------------------------------------------------


def _expected(name: str, w: dict) -> torch.Tensor:
    """What SGLang's parameter `name` holds after loading: fused ones are our shards stacked."""
    name = name.removeprefix("model.")
    if ".qkv_proj." in name:
        return torch.cat([w[name.replace("qkv_proj", p)] for p in ("q_proj", "k_proj", "v_proj")])
    if ".gate_up_proj." in name:
        return torch.cat([w[name.replace("gate_up_proj", p)] for p in ("gate_proj", "up_proj")])
    return w[name]


def _loaded_sglang_model(exp, target):
    model = er.sglang_model(exp.out_dir)
    w = load_file(str(exp.out_dir / "model.safetensors"))
    er.RECORDER.loaded.clear()
    model.load_weights(iter(w.items()))
    with torch.no_grad():  # eagle_worker_v2.py init_lm_head: set_embed(the target's embedding)
        model.model.embed_tokens.weight.copy_(target.embed_weight())
    return model, w


@pytest.mark.parametrize("kw", CASES, ids=CASE_IDS)
def test_sglang_load_weights_fills_every_parameter_from_our_tensors(tmp_path, kw):
    target, draft = eagle3_draft(**kw)
    exp = export_eagle3(draft, tmp_path / "sg", "sglang")
    model = er.sglang_model(exp.out_dir)
    w = load_file(str(exp.out_dir / "model.safetensors"))
    er.RECORDER.loaded.clear()
    model.load_weights(iter(w.items()))
    # every tensor reaches a weight loader, but d2t, which becomes the hot-token map
    assert sorted(k for k, t in w.items() if id(t) not in er.RECORDER.loaded) == (["d2t"] if "d2t" in w else [])
    if "d2t" in w:
        assert torch.equal(model.hot_token_id, draft.vocab.used)  # draft id -> target id
    else:
        assert model.hot_token_id is None and draft.arch.draft_vocab_size == draft.arch.vocab_size
    for name, p in model.named_parameters():
        if name == "model.embed_tokens.weight":  # the worker sets the target's (set_embed)
            continue
        assert not p.isnan().any(), f"{name} was never loaded"
        assert torch.equal(p, _expected(name, w).float()), name
    assert model.model.num_aux_hidden_states == len(draft.arch.target_layer_ids)


@pytest.mark.parametrize("kw", CASES[:2], ids=CASE_IDS[:2])
def test_sglang_forward_drafts_our_chain(tmp_path, kw):
    """SGLang's own draft forward over the loaded export (the first step over a prefill of target
    features, then one chain step that reads its own states) gives our draft's logits, on its N
    tokens mapped through the hot-token map. Ours runs with the weights rounded to the
    export's bfloat16, so the two differ only by float32 kernel drift."""
    target, draft = eagle3_draft(**kw)
    exp = export_eagle3(draft, tmp_path / "sg", "sglang")
    model, _ = _loaded_sglang_model(exp, target)
    ref = build_draft(draft.arch, target).eval()
    ref.load_state_dict({k: v.to(torch.bfloat16).float() if v.is_floating_point() and not k.startswith(
        ("embed_tokens", "target_lm_head")) else v for k, v in draft.state_dict().items()})
    ids, aux = inputs(target)
    u = T - 1
    pos = torch.arange(1, u + 1)
    got, states = er.sglang_draft(model, ascending(draft, aux)[0, :u], ids[0, 1:], pos)
    cache = Eagle3Cache()
    with torch.no_grad():
        want, h = ref.step(ref.fuse(aux[:, :u]), ids[:, 1:], pos[None], cache)
    used = model.hot_token_id if model.hot_token_id is not None else torch.arange(draft.arch.vocab_size)
    assert_float32_close(got, want[0][:, used])
    assert_float32_close(states, h[0])
    nxt = want[0, -1].argmax().view(1)  # the chain's next token, at the next position
    got, _ = er.sglang_draft(model, states[-1:], nxt, torch.tensor([u + 1]))
    with torch.no_grad():
        want, _ = ref.step(h[:, -1:], nxt[None], torch.tensor([[u + 1]]), cache)
    assert_float32_close(got, want[0][:, used])


@pytest.mark.parametrize("kw", CASES[:2], ids=CASE_IDS[:2])
def test_sglang_captures_the_layers_the_draft_was_trained_on(tmp_path, kw):
    target, draft = eagle3_draft(**kw)
    exp = export_eagle3(draft, tmp_path / "sg", "sglang")
    layer_ids = er.sglang_capture_ids(exp.out_dir)  # what the target worker reads from the draft's config
    assert layer_ids == sorted(draft.arch.target_layer_ids)
    ids, aux = inputs(target)
    got, layers_to_capture = er.sglang_capture(layer_ids, residual_streams(target, ids[0].tolist()))
    assert layers_to_capture == [l + 1 for l in layer_ids]  # SGLang's +1: the stream entering layer l + 1
    assert torch.equal(got, ascending(draft, aux)[0])


def test_both_engines_capture_the_same_trained_layers(tmp_path):
    """One trained draft, two conventions: vLLM reads [l + 1], SGLang [l]; both capture the
    outputs of the layers in arch.target_layer_ids."""
    target, draft = eagle3_draft(layer_ids=(0, 2, 4))
    spec = export_eagle3(draft, tmp_path / "spec", "speculators", "/models/target", ["LlamaForCausalLM"], 512)
    sg = export_eagle3(draft, tmp_path / "sg", "sglang")
    ids, aux = inputs(target)
    streams = residual_streams(target, ids[0].tolist())
    vllm_ids, sglang_ids = er.vllm_reads(spec.out_dir)[2], er.sglang_capture_ids(sg.out_dir)
    assert (list(vllm_ids), sglang_ids) == ([1, 3, 5], [0, 2, 4])
    want = ascending(draft, aux)[0]
    assert torch.equal(torch.cat(er.vllm_capture(vllm_ids, streams), -1), want)
    assert torch.equal(er.sglang_capture(sglang_ids, streams)[0], want)
