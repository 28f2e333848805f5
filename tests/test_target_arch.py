"""Targets through the model's own API: refusals from the config before any weight is read,
hub options passed through, sliding windows in every cache and mask, the target's own logit
transform, and a non-`model.layers` layout."""

import json

import pytest
import torch
import transformers as tf
from floats import assert_float32_close
from marginals import sample_two_tokens, two_token_marginals

from splitserve.config import TargetConfig
from splitserve.target.arch import LogitTransform, UnsupportedTargetError, attention_layout
from splitserve.target.bucketed import BucketedCapture
from splitserve.target.hf import load_hf_target, peek_target_info, wrap_hf_model

pytestmark = pytest.mark.usefixtures("one_thread")

V = 64
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)


def tiny(config) -> "HFTarget":  # noqa: F821
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(10.0)
    return wrap_hf_model(model, TargetConfig(name=config.model_type, layer_ids=[0, 1, 2]))


WINDOWED = {
    "mistral": lambda: tf.MistralConfig(**SMALL, sliding_window=5),
    "gemma2": lambda: tf.Gemma2Config(**SMALL, head_dim=8, sliding_window=5),
    "gemma3": lambda: tf.Gemma3TextConfig(**SMALL, head_dim=8, sliding_window=5,
                                          layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                       "sliding_attention"]),
}


def _config_only(tmp_path, config, arch):
    config.architectures = [arch]
    config.save_pretrained(tmp_path)
    return TargetConfig(name=arch, path=str(tmp_path), device="cpu")


@pytest.mark.parametrize("config, arch, reason", [
    (tf.RwkvConfig(num_hidden_layers=2, hidden_size=16), "RwkvForCausalLM", "purely recurrent model .*kind rwkv"),
    (tf.Lfm2Config(**SMALL, layer_types=["conv", "full_attention"] * 2), "Lfm2ForCausalLM", "layers of kind conv"),
    (tf.Llama4TextConfig(**SMALL, head_dim=8), "Llama4ForCausalLM", "chunked_attention"),
])
def test_unservable_targets_refused_from_config_alone(tmp_path, monkeypatch, config, arch, reason):
    def no_weights(*a, **k):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr(tf.AutoModelForCausalLM, "from_pretrained", no_weights)
    cfg = _config_only(tmp_path, config, arch)
    for load in (load_hf_target, peek_target_info):
        with pytest.raises(UnsupportedTargetError, match=reason) as err:
            load(cfg)
        assert arch in str(err.value) and "\n" not in str(err.value)


def test_cli_refusal_is_one_line(tmp_path):
    import subprocess
    import sys

    cfg = _config_only(tmp_path / "rwkv", tf.RwkvConfig(num_hidden_layers=2, hidden_size=16), "RwkvForCausalLM")
    proc = subprocess.run([sys.executable, "-m", "splitserve.cli", "train", f"target.path={cfg.path}",
                           f"run_dir={tmp_path / 'run'}", "train.device=cpu"], capture_output=True, text=True)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("splitserve train: target ") and "RwkvForCausalLM" in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_revision_and_trust_remote_code_reach_from_pretrained(tiny_smol_dir, monkeypatch):
    seen = []
    for cls in (tf.AutoConfig, tf.AutoModelForCausalLM, tf.AutoTokenizer):
        real = cls.from_pretrained.__func__

        def record(kls, path, *a, _real=real, _name=cls.__name__, **kw):
            seen.append((_name, kw.pop("revision", None), kw.pop("trust_remote_code", None)))
            return _real(kls, path, *a, **kw)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(record))
    load_hf_target(TargetConfig(path=str(tiny_smol_dir), device="cpu", layer_ids=[0, 1], revision="v1.0",
                                trust_remote_code=True))
    first = {}
    for name, rev, trust in seen:  # later calls are transformers' own (the tokenizer reads the config)
        first.setdefault(name, (rev, trust))
    assert first == {n: ("v1.0", True) for n in ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer")}, seen


def test_attention_layout_reads_every_window_form():
    assert attention_layout(tf.LlamaConfig(**SMALL)).windows == (None,) * 4
    assert attention_layout(tf.MistralConfig(**SMALL, sliding_window=7)).windows == (7,) * 4
    assert attention_layout(tf.Gemma2Config(**SMALL, sliding_window=7)).windows == (7, None, 7, None)
    nested = tf.Gemma3Config(text_config=dict(SMALL, sliding_window=7, layer_types=["sliding_attention"] * 3
                                              + ["full_attention"]))
    assert attention_layout(nested).windows == (7, 7, 7, None)


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_windowed_capture_equals_the_model_forward(name):
    """Training capture (eager and padded to a bucket) on a sequence 4x the window."""
    target = tiny(WINDOWED[name]())
    ids = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hs = target.model(ids, output_hidden_states=True).hidden_states
    want = torch.cat([hs[i + 1] for i in target.info.layer_ids], -1)
    assert_float32_close(target.capture(ids).aux, want)
    padded = BucketedCapture(target, max_len=64, min_bucket=32, use_graphs=False)(ids[0])
    assert_float32_close(padded.aux, want)


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_windowed_reference_cache_rewinds_exactly(name):
    """Chunks, then a crop below the window's reach, then more chunks: equal to one forward."""
    target = tiny(WINDOWED[name]())
    ids = torch.randint(0, V, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = target.model(ids).logits[0]
    cache = target.new_cache()
    a, _ = target.forward_cached(ids[:, :10], cache)
    b, _ = target.forward_cached(ids[:, 10:19], cache)
    assert_float32_close(torch.cat([a[0], b[0]]), want[:19])
    target.crop_cache(cache, 12)  # rejected: 12..18
    c, _ = target.forward_cached(ids[:, 12:], cache)
    assert_float32_close(c[0], want[12:])


# Gemma-2 has no SDPA path in transformers (its attention soft-caps the scores): eager only.
@pytest.mark.parametrize("name, impl", [(n, i) for n in sorted(WINDOWED) for i in ("sdpa", "eager")
                                        if (n, i) != ("gemma2", "sdpa")])
def test_windowed_static_cache_rewinds_exactly(name, impl):
    """The serving path: static cache, 4-D masks per layer window, rewinds by position, and the
    engine's attention width below the capacity."""
    config = WINDOWED[name]()
    config._attn_implementation = impl
    target = tiny(config)
    ids = torch.randint(0, V, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = target.model(ids).logits[0]
    cache = target.new_static_cache(40)
    a, _ = target.forward_static(ids[:, :10], cache, torch.arange(10))
    target.forward_static(ids[:, 10:19], cache, torch.arange(10, 19))  # stale beyond 12 after the rewind
    c, _ = target.forward_static(ids[:, 12:], cache, torch.arange(12, 24), window=32)
    assert_float32_close(a[0], want[:10])
    assert_float32_close(c[0], want[12:])


@pytest.mark.parametrize("config, expect", [
    (tf.Gemma2Config(**SMALL, head_dim=8, final_logit_softcapping=3.0), LogitTransform(softcap=3.0)),
    (tf.GraniteConfig(**SMALL, logits_scaling=6.0), LogitTransform(divisor=6.0)),
    (tf.CohereConfig(**SMALL, logit_scale=0.25), LogitTransform(multiplier=0.25)),
])
def test_verification_logits_are_the_targets_own(config, expect):
    target = tiny(config)
    assert target.logit_transform == expect
    ids = torch.randint(0, V, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = target.model(ids).logits[0].float()
        raw = target.model.get_output_embeddings()(target.decoder(ids).last_hidden_state)[0]
    assert (raw - want).abs().max() > 0.05 * want.abs().max()  # the transform matters here
    got, _ = target.forward_cached(ids, target.new_cache())
    assert_float32_close(got[0], want)
    static, _ = target.forward_static(ids, target.new_static_cache(12), torch.arange(9))
    assert_float32_close(static[0], want)


def test_gpt2_layout_without_model_layers():
    """GPT-2 keeps its blocks in `transformer.h`: found through get_decoder, captured by hooks."""
    config = tf.GPT2Config(vocab_size=V, n_embd=32, n_layer=4, n_head=4, n_positions=64)
    target = tiny(config)
    ids = torch.randint(0, V, (1, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hs = target.model(ids, output_hidden_states=True).hidden_states
    assert_float32_close(target.capture(ids).aux, torch.cat([hs[i + 1] for i in (0, 1, 2)], -1))


def test_layout_and_info_from_a_saved_multimodal_config(tmp_path):
    text = dict(SMALL, head_dim=8, sliding_window=7, layer_types=["sliding_attention", "full_attention"] * 2)
    tf.Gemma3Config(text_config=text).save_pretrained(tmp_path)
    info = peek_target_info(TargetConfig(path=str(tmp_path), layer_ids=[0, 1]))
    assert (info.vocab_size, info.hidden_size, info.num_layers) == (V, 32, 4)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gemma3"


def test_soft_capped_target_sampled_at_t1_matches_its_distribution():
    """T=1 on Gemma-2 with a tight soft-cap: the tokens the serving engine's speculative rounds
    commit follow the soft-capped distribution, which here is far from the raw lm_head's. (Both
    decoding paths take their logits from the same transform, checked against the model's own
    above; the sampling maths itself is tested in test_spec_decode / test_serve_engine.)"""
    from tiny import tiny_draft

    from splitserve.config import EngineConfig
    from splitserve.speculative.engine import Engine

    config = tf.Gemma2Config(**{**SMALL, "vocab_size": 16, "num_hidden_layers": 3}, head_dim=8, sliding_window=3,
                             final_logit_softcapping=1.5)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # raw logits of a few units: the cap at 1.5 reshapes them
    target = wrap_hf_model(model, TargetConfig(name="gemma2-capped", layer_ids=[0, 1]))
    draft = tiny_draft(target, block_size=3, markov_rank=4)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    prompt = [1, 2, 3, 4, 5]  # longer than the window
    p1, p2 = two_token_marginals(target, prompt)  # the model's own (capped) logits
    with torch.no_grad():  # the uncapped distribution, to show the test tells them apart
        q1 = torch.softmax(model.lm_head(target.decoder(torch.tensor([prompt])).last_hidden_state[0, -1]), -1)
    assert (q1 - p1).abs().max() > 0.15

    engine = Engine(target, draft, EngineConfig(max_context=16, seed=0))
    engine._prefill(prompt[:-1], 1.0)
    n = 1200  # each sample from the prompt's last token as the anchor
    first, second, _ = sample_two_tokens(engine, len(prompt) - 1, prompt[-1], n)
    # 1200 samples: a frequency's std is at most ~0.0144; 0.055 is ~3.8 sigma.
    assert (first / n - p1).abs().max() < 0.055
    assert (second / n - p2).abs().max() < 0.055


def test_training_distils_the_targets_own_distribution(monkeypatch):
    """The teacher logits of the training loss are the target's own (Granite divides by its
    logits_scaling), not the raw lm_head of the captured final hidden state."""
    from tiny import tiny_draft

    from splitserve.config import LossConfig
    from splitserve.records import HiddenRecord
    from splitserve.train import step

    target = tiny(tf.GraniteConfig(**SMALL, logits_scaling=5.0))
    draft = tiny_draft(target, block_size=3)
    ids = torch.randint(0, V, (16,), generator=torch.Generator().manual_seed(6))
    cap = target.capture(ids[None])
    record = HiddenRecord(sample_id=0, input_ids=ids, loss_mask=torch.ones(16, dtype=torch.bool), aux=cap.aux[0],
                          final=cap.final[0])
    seen = {}
    real = step.compute_loss
    monkeypatch.setattr(step, "compute_loss", lambda inputs, cfg: seen.setdefault("in", inputs) and real(inputs, cfg))
    batch = step.collate([record], torch.device("cpu"), torch.float32)
    step.draft_loss(draft, batch, 4, LossConfig(), torch.Generator().manual_seed(0))
    with torch.no_grad():
        own = target.model(ids[None]).logits[0]  # (T, V)
    got = seen["in"].target_logits  # (P, V), one row per trained position
    rows = torch.stack([own[(own - g).abs().sum(-1).argmin()] for g in got])  # each row: its position's own
    assert_float32_close(got, rows)
    assert (got * 5.0 - rows).abs().max() > 0.1  # raw lm_head logits would be 5x these


def test_an_unknown_logit_transform_is_refused_at_load(tiny_smol_dir, monkeypatch):
    """A model whose own forward scales its logits in a way the config does not say (a custom
    head) is refused when loaded, instead of being verified against raw lm_head logits."""
    real = tf.LlamaForCausalLM.forward

    def scaled(self, *a, **k):
        out = real(self, *a, **k)
        out.logits = out.logits * 0.5
        return out

    cfg = TargetConfig(path=str(tiny_smol_dir), device="cpu", layer_ids=[0, 1])
    load_hf_target(cfg)  # as saved: accepted
    monkeypatch.setattr(tf.LlamaForCausalLM, "forward", scaled)
    with pytest.raises(UnsupportedTargetError, match="computes its logits in a way"):
        load_hf_target(cfg)


@pytest.mark.parametrize("command", ["eval", "calibrate", "export", "serve", "bench"])
def test_every_command_that_loads_the_target_passes_revision_and_trust(command, tiny_smol_dir, tmp_path, monkeypatch):
    """--revision / --trust-remote-code reach the TargetConfig each command builds (train and dump
    take target.revision / target.trust_remote_code through Hydra)."""
    from tiny import export_tiny_draft

    import splitserve.target.hf as hf
    import splitserve.target.shared_weights as sw
    from splitserve.cli import main

    draft = export_tiny_draft(tiny_smol_dir, tmp_path / "draft")
    seen = []

    class Stop(Exception):
        pass

    def capture(cfg, *a, **k):
        seen.append((cfg.revision, cfg.trust_remote_code))
        raise Stop

    monkeypatch.setattr(hf, "peek_target_info", capture)
    monkeypatch.setattr(hf, "load_hf_target", capture)
    monkeypatch.setattr(sw.SharedWeightsTarget, "__init__", lambda self, cfg, *a, **k: capture(cfg))
    args = {"eval": ["eval", "--draft", str(draft)], "calibrate": ["calibrate", str(draft)],
            "export": ["export", str(draft), str(tmp_path / "out")],
            "serve": ["serve", "--draft", str(draft), "--port", "0"],
            "bench": ["bench", "--draft", str(draft)]}[command]
    with pytest.raises(Stop):
        main([*args, "--target", str(tiny_smol_dir), "--revision", "v2", "--trust-remote-code"])
    assert seen == [("v2", True)]
