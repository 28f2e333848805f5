"""The native decoder (target/native/) computes the transformers forward of every family it
claims, in float32 to rounding: logits and captured layers of a prefill, then of a verify block
written over stale slots (a rewind), inside an attention window; greedy serving through it
equals the target's own greedy output; its weights are the model's own storage; a target
outside the family keeps the transformers forward, and asking for native there names why."""

import pytest
import torch
from floats import assert_float32_close
from tiny import tiny_draft

from splitserve.config import EngineConfig, TargetConfig
from splitserve.speculative.decode import target_decode
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.hf import HFTarget, wrap_hf_model
from splitserve.target.native.support import native_reason
from splitserve.target.native.target import NativeTarget, native_target

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 97
COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=4, num_attention_heads=6,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)


def _config(family: str):
    import transformers as tf

    if family == "llama":
        return tf.LlamaConfig(**COMMON)
    if family == "llama-bias-llama3-rope":  # biases on every attention product; llama3 frequency scaling
        rope = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64)
        return tf.LlamaConfig(**COMMON, attention_bias=True, rope_parameters=rope)
    if family == "qwen2":  # q/k/v biases
        return tf.Qwen2Config(**COMMON)
    if family == "qwen3":  # per-head q/k RMSNorm, head_dim independent of hidden/heads
        return tf.Qwen3Config(**COMMON, head_dim=16)
    if family == "mistral-window":  # a sliding window shorter than the prompts
        return tf.MistralConfig(**COMMON, sliding_window=6, head_dim=16)
    raise KeyError(family)


FAMILIES = ("llama", "llama-bias-llama3-rope", "qwen2", "qwen3", "mistral-window")


def _target(family: str, seed: int = 0) -> HFTarget:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(family)).eval()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial norms and biases, so a skipped one shows
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
        model.lm_head.weight.mul_(20.0)
    return wrap_hf_model(model, TargetConfig(name=family, layer_ids=[0, 2]))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("products", ["triton", "cublas"])
def test_native_forward_equals_transformers(family, products):
    hf = _target(family)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (1, 14), generator=g)
    block = torch.randint(0, VOCAB, (1, 5), generator=g)
    want = []
    cache = hf.new_static_cache(48)
    want.append(hf.forward_static(prompt, cache, torch.arange(14)))
    want.append(hf.forward_static(block, cache, torch.arange(14, 19), window=32))  # slots 14..18 written
    want.append(hf.forward_static(block.flip(1), cache, torch.arange(16, 21), window=32))  # rewound to 16
    native = native_target(hf, decoder="native", products=products)
    assert isinstance(native, NativeTarget) and native.native.products == products
    cache = native.new_static_cache(48)
    got = [native.forward_static(prompt, cache, torch.arange(14)),
           native.forward_static(block, cache, torch.arange(14, 19), window=32),
           native.forward_static(block.flip(1), cache, torch.arange(16, 21), window=32)]
    for (g_logits, g_cap), (w_logits, w_cap) in zip(got, want):
        assert g_logits.shape == w_logits.shape and g_cap.aux.shape == w_cap.aux.shape
        assert_float32_close(g_logits, w_logits)
        assert_float32_close(g_cap.aux, w_cap.aux)
    logits_from = native.forward_static(prompt, native.new_static_cache(48), torch.arange(14), logits_from=13)[0]
    assert_float32_close(logits_from, want[0][0][:, 13:])


def test_packed_weights_are_the_models_own():
    """q|k|v and gate|up are packed into new storage, and the transformers modules then read
    views of it: one copy in memory, and the transformers forward is unchanged."""
    hf = _target("qwen2")
    ids = torch.randint(0, VOCAB, (1, 9))
    before = hf.model(ids).logits
    native = native_target(hf)
    attn = hf.decoder.layers[1].self_attn
    packed = native.native.layers[1].qkv
    packed_ln1 = native.native.layers[1].ln1
    assert attn.q_proj.weight.data_ptr() == packed.w.data_ptr()
    assert attn.k_proj.weight.data_ptr() == packed.w[attn.q_proj.weight.shape[0]:].data_ptr()
    assert attn.v_proj.bias.data_ptr() == packed.bias[-attn.v_proj.bias.shape[0]:].data_ptr()
    assert_float32_close(hf.model(ids).logits, before)
    assert native_target(hf) is native  # packed once per target
    fp8 = native_target(hf, weight_format="fp8")  # quantised from the same packing, not a second one
    assert fp8.native.layers[1].ln1 is packed_ln1 and attn.q_proj.weight.data_ptr() == packed.w.data_ptr()


@pytest.mark.parametrize("family", ["qwen3", "mistral-window"])
def test_engine_on_native_decoder_is_lossless(family):
    hf = _target(family, seed=3)
    draft = tiny_draft(hf, block_size=4, markov_rank=8)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    engine = Engine(hf, draft, EngineConfig(max_context=64, min_window=16))
    assert isinstance(engine.target, NativeTarget)
    for prompt in ([5, 9, 11], list(range(3, 20))):
        ref = target_decode(hf, prompt, 30)
        assert engine.generate(prompt, SamplingParams(max_tokens=30)).tokens == ref
        assert engine.generate(prompt, SamplingParams(max_tokens=30), mode="ar").tokens == ref
    hf_engine = Engine(hf, draft, EngineConfig(max_context=64, decoder="hf"))
    assert hf_engine.target is hf


def test_fp8_weights_are_close_but_labelled_lossy():
    """weight_format=fp8: every layer product reads FP8 weights. Its logits stay near the
    model's (a quantisation error, not a bug) but are not the model's; the transformers
    forward is untouched."""
    hf = _target("llama")
    ids = torch.randint(0, VOCAB, (1, 10))
    want, _ = hf.forward_static(ids, hf.new_static_cache(16), torch.arange(10))
    fp8 = native_target(hf, weight_format="fp8")
    assert fp8.native.layers[0].qkv.w.dtype == torch.float8_e4m3fn
    got, _ = fp8.forward_static(ids, fp8.new_static_cache(16), torch.arange(10))
    err = float((got - want).abs().max() / want.abs().max())
    assert 0 < err < 0.1
    with pytest.raises(ValueError, match="needs the native decoder"):
        native_target(hf, decoder="hf", weight_format="fp8")


def test_targets_outside_the_family_keep_transformers():
    import transformers as tf

    from splitserve.target.native.support import FAMILY

    gemma = tf.Gemma2Config(**COMMON, head_dim=8)
    assert "gemma2" in native_reason(gemma) and "gemma2" not in FAMILY
    assert "hidden_act" in native_reason(tf.LlamaConfig(**COMMON, hidden_act="gelu"))
    assert "rope type 'dynamic'" in native_reason(
        tf.LlamaConfig(**COMMON, rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)))
    model = tf.AutoModelForCausalLM.from_config(gemma).eval()
    hf = wrap_hf_model(model, TargetConfig(name="tiny-gemma2", layer_ids=[0, 1]))
    assert native_target(hf) is hf
    with pytest.raises(ValueError, match="native decoder does not serve this target: model_type 'gemma2'"):
        native_target(hf, decoder="native")


def test_quantised_or_wrapped_projections_keep_transformers():
    """A projection that is not a plain nn.Linear of the model's dtype (a quantised layer, an
    adapter) is never packed: auto keeps the transformers forward, native names the module."""
    from torch import nn

    hf = _target("llama")

    class Adapter(nn.Linear):
        pass

    old = hf.decoder.layers[2].mlp.up_proj
    hf.decoder.layers[2].mlp.up_proj = Adapter(old.in_features, old.out_features, bias=False)
    assert native_target(hf) is hf
    with pytest.raises(ValueError, match="layer 2 mlp.up_proj is Adapter, not a plain nn.Linear"):
        native_target(hf, decoder="native")
