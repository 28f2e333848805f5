"""Recurrent layers (gated DeltaNet, KDA, Mamba-2) rewound exactly after a rejected draft token
(target/recurrent.py): rejections mid-block leave the output equal to the target's own greedy
output in the reference loop and the serving engine, and committing the wrong state (the last
verify position's, or none) changes it, so these tests can fail. Sampling at T=1 on a hybrid
follows the target's distribution."""

import pytest
import torch
import transformers as tf
from arch_matrix import build_config, scale_recurrent_mixers
from tiny import tiny_draft

from splitserve.config import EngineConfig, TargetConfig
from splitserve.speculative.decode import SpecDecoder, target_decode
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.hf import HFTarget, wrap_hf_model
from splitserve.target.recurrent import RecurrentStore

pytestmark = pytest.mark.usefixtures("one_thread")

V = 128
NEW = 24


def hybrid(arch: str, vocab: int = V, seed: int = 0) -> HFTarget:
    """A tiny `arch` target whose recurrent mixers decide its greedy tokens (scaled x30)."""
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(build_config(arch, vocab, 1, 2)).eval()
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.mul_(20.0 * torch.exp(torch.randn(head.shape[0], 1)))
        assert scale_recurrent_mixers(model) > 0
    return wrap_hf_model(model, TargetConfig(name=arch, layer_ids=[0, 1, 2]))


def greedy_reference(target: HFTarget, prompt: list[int]) -> list[int]:
    x = torch.tensor([prompt])
    with torch.no_grad():
        return target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW,
                                     do_sample=False)[0, len(prompt):].tolist()


def decode_all(target, draft, prompt):
    engine = Engine(target, draft, EngineConfig(max_context=64))
    stats = engine.generate(prompt, SamplingParams(max_tokens=NEW))
    return SpecDecoder(target, draft).generate(prompt, NEW).tokens, stats


@pytest.mark.parametrize("arch", ["qwen3-next", "kimi-linear", "nemotron-h", "falcon-h1", "mamba2"])
def test_rejections_mid_block_rewind_the_state(arch, monkeypatch):
    target = hybrid(arch)
    draft = tiny_draft(target, block_size=4)  # untrained: most blocks are cut after 0-2 tokens
    prompt = torch.randint(3, V, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    want = greedy_reference(target, prompt)
    assert target_decode(target, prompt, NEW) == want
    reference, stats = decode_all(target, draft, prompt)
    assert reference == want
    assert stats.tokens == want
    cut = [n for n in stats.accepts if n < draft.arch.block_size]
    assert any(0 < n for n in cut), f"no block was cut after an accepted token: {stats.accepts}"

    # The same rounds with the state of the last verify position committed instead of the
    # accepted one (engine), or never rewound (reference loop): the output changes.
    real_commit = HFTarget.commit_static
    monkeypatch.setattr(HFTarget, "commit_static",
                        lambda self, cache, keep: real_commit(self, cache, draft.arch.block_size + 1))
    monkeypatch.setattr(HFTarget, "crop_cache", lambda self, cache, length: _crop_attention_only(cache, length))
    wrong_reference, wrong = decode_all(target, draft, prompt)
    assert wrong.tokens != want
    assert wrong_reference != want


def _crop_attention_only(cache, length):
    from transformers.cache_utils import DynamicLayer

    excess = cache.splitserve_len - length
    cache.splitserve_len = length
    for layer in cache.layers:
        if isinstance(layer, DynamicLayer):
            DynamicLayer.crop(layer, -excess)


def test_a_verify_forward_leaves_the_committed_state_alone():
    """Trial mode reads the conv window ahead of the new columns and writes nothing; commit
    mode keeps the last K columns and the new recurrent state."""
    store = RecurrentStore()
    first = torch.arange(6.0).view(1, 1, 6)  # (1, C=1, T=6)
    assert torch.equal(store.update_conv_state(first, 0, conv_kernel_size=4), torch.cat([torch.zeros(1, 1, 4), first], -1))
    store.update_recurrent_state(torch.ones(2, 2), 0)
    store.trial = True
    full = store.update_conv_state(torch.full((1, 1, 3), 9.0), 0)
    assert full.tolist() == [[[2.0, 3.0, 4.0, 5.0, 9.0, 9.0, 9.0]]]
    store.update_recurrent_state(torch.full((2, 2), 7.0), 0)
    assert store.get_conv_state(0).tolist() == [[[2.0, 3.0, 4.0, 5.0]]]
    assert torch.equal(store.get_recurrent_state(0), torch.ones(2, 2))
    store.reset()
    assert not store.get_conv_state(0).any() and not store.get_recurrent_state(0).any()


def _marginals(target: HFTarget, prompt: list[int], k: int) -> list[torch.Tensor]:
    """The target's own marginal distributions of the next k tokens, by enumerating every prefix
    (V^(k-1) sequences, fine for a 16-token vocabulary)."""
    vocab = target.info.vocab_size
    prefixes, weights, out = [[]], torch.ones(1), []
    with torch.no_grad():
        for _ in range(k):
            x = torch.tensor([prompt + p for p in prefixes])  # (N, P+i)
            probs = torch.softmax(target.model(x).logits[:, -1].float(), -1)  # (N, V)
            out.append(weights @ probs)
            weights = (weights[:, None] * probs).reshape(-1)
            prefixes = [p + [t] for p in prefixes for t in range(vocab)]
    return out


def test_hybrid_sampled_at_t1_matches_its_distribution():
    """T=1 on a gated-DeltaNet hybrid: the tokens the engine's speculative rounds commit, with a
    replayed state after every rejection, follow the target's own distribution of the next
    three tokens (the third one nearly always drawn after a rewind)."""
    target = hybrid("qwen3-next", vocab=16)
    with torch.no_grad():  # a flatter head than greedy tests want: many tokens carry mass at T=1
        target.model.get_output_embeddings().weight.mul_(0.25)
    draft = tiny_draft(target, block_size=3, markov_rank=4)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    prompt = [3, 7, 1, 12, 5]
    want = _marginals(target, prompt, 3)
    assert max(float(p.max()) for p in want) < 0.8  # no token dominates: distributions can be told apart

    engine = Engine(target, draft, EngineConfig(max_context=24, seed=0))
    n = 1200
    counts, replayed = torch.zeros(3, 16), 0
    for _ in range(n):  # the prompt but its last token, then that token as the anchor, rounds until three tokens
        engine._prefill(prompt[:-1], 1.0)
        engine.anchor.fill_(prompt[-1])
        toks, cut = [], False
        while len(toks) < 3:
            replayed += cut and len(toks) < 3 and len(toks) + engine.gamma + 1 >= 3  # this round draws token 3
            engine._spec_round(1.0, engine.windows[-1])
            out = engine.out.tolist()
            engine._commit_state(out[0] + 1)
            cut |= out[0] < draft.arch.block_size
            toks += out[1 : out[0] + 2]
        for i in range(3):
            counts[i, toks[i]] += 1
    assert replayed > n // 2, replayed  # most third tokens came from a state replayed after a rejection
    # 1200 samples: a frequency's std is at most ~0.0144; 0.055 is ~3.8 sigma.
    for i in range(3):
        assert (counts[i] / n - want[i]).abs().max() < 0.055, i
