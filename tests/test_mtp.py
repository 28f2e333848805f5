"""The target's own MTP head served as a chain draft (draft=mtp, models/mtp.py), on tiny random
checkpoints (no real MTP weights are available offline): a tiny DeepSeek-V3 (MLA, MoE, MTP under
model.layers.N.) and a tiny Qwen3-Next (gated DeltaNet, MoE, MTP under mtp.). Its weights are the
checkpoint's and its step agrees with transformers' own MTP module; greedy output is the
target's own in float32 through the reference loop and the engine, through full and partial
accepts; at T=1 every round drafts what a fresh chain drafts and samples follow the target's
distribution; a target without MTP layers, or whose checkpoint lacks them, is refused in one line."""

import json

import pytest
import torch
import torch.nn.functional as F
from mtp_tiny import load_mtp_target, mtp_draft, save_mtp_target
from safetensors import safe_open
from test_eagle3_serve import _corrupting, sample_two_tokens

import splitserve.speculative.decode as decode
from splitserve.config import DraftConfig, EngineConfig, RunConfig, TargetConfig
from splitserve.errors import UserError
from splitserve.models.build import resolve_arch
from splitserve.models.eagle3 import Eagle3Cache
from splitserve.speculative.decode import SpecDecoder, target_decode
from splitserve.speculative.engine import Engine, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")
KINDS = ("deepseek_v3", "qwen3_next")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return {kind: save_mtp_target(tmp_path_factory.mktemp(kind), kind) for kind in KINDS}


@pytest.fixture(scope="module")
def targets(saved):
    return {kind: load_mtp_target(path) for kind, path in saved.items()}


def test_the_draft_holds_the_checkpoints_mtp_weights(saved, targets):
    """The head's tensors are the checkpoint's, the frozen final norm is the target's, and only
    the embedding and lm_head are left out of what a checkpoint of the draft holds."""
    names = {"deepseek_v3": ("model.layers.2.eh_proj.weight", "model.layers.2.shared_head.norm.weight",
                             "model.layers.2.self_attn.kv_b_proj.weight"),
             "qwen3_next": ("mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight")}
    for kind, target in targets.items():
        draft = mtp_draft(target)
        with safe_open(str(saved[kind] / "model.safetensors"), "pt") as f:
            proj, out_norm, attn = (f.get_tensor(k) for k in names[kind])
        assert torch.equal(draft.heads[0].proj.weight, proj) and torch.equal(draft.out_norms[0].weight, out_norm)
        block = dict(draft.blocks[0].named_parameters())
        assert torch.equal(block[names[kind][2].split(".", 3)[-1]], attn)
        assert "mlp.experts.gate_up_proj" in block  # the MoE's experts, fused by transformers' own loader
        assert torch.equal(draft.target_norm.weight, target.decoder.norm.weight)
        assert not any(k.startswith(("embed_tokens.", "target_lm_head.")) for k in draft.trainable_state_dict())
        assert draft.vocab.size == target.info.vocab_size  # the whole vocabulary


@torch.no_grad()
def test_a_step_equals_transformers_own_mtp_module(targets):
    """DeepSeek-V3: transformers 5.x ships an MTP module of its own (MtpModel); built over the
    same target and checkpoint, its layer gives our step's state (after shared_head.norm) from the
    target's final hidden states, in float32."""
    mtp_layers = pytest.importorskip("transformers.modeling_layers")
    if not hasattr(mtp_layers, "MtpModel"):
        pytest.skip("this transformers has no MtpModel")
    target = targets["deepseek_v3"]
    model = target.model
    model._keys_to_ignore_on_load_unexpected = [r"model\.layers\.2.*"]  # DeepSeek-V3's is layer 61
    theirs = mtp_layers.MtpModel.from_pretrained(model)
    draft = mtp_draft(target)
    ids = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(0))
    final = model.model(ids).last_hidden_state  # (1, 10, D) after the final norm
    torch.testing.assert_close(draft.fuse(target.capture(ids).aux), final)
    pos = torch.arange(1, 10)[None]
    ours = draft.backbone(final[:, :9], ids[:, 1:], pos, Eagle3Cache())
    from transformers.cache_utils import DynamicCache

    want = theirs.forward_layer(0, final[:, :9], pos, DynamicCache(config=theirs.config), input_ids=ids[:, 1:])
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5)


def _overfit(target, draft, seq: list[int], steps: int = 80) -> None:
    """Teach the MTP head one sequence by the training-time test's chains (cross-entropy)."""
    ids, gamma = torch.tensor([seq]), draft.arch.block_size
    with torch.no_grad():
        aux = target.capture(ids).aux
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-2)
    draft.train()
    for _ in range(steps):
        states = draft.unroll(aux, ids, gamma)
        loss = sum(F.cross_entropy(draft.draft_logits(s[0, : len(seq) - 2 - j]), ids[0, 2 + j:])
                   for j, s in enumerate(states))
        opt.zero_grad()
        loss.backward()
        opt.step()
    draft.eval()


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_target_greedy_through_full_and_partial_accepts(kind, targets, monkeypatch):
    """A head overfit to one continuation accepts whole chains on it and stops where an oracle
    spoils a token; the reference loop and the engine return the target's own greedy tokens in
    the same rounds, in float32."""
    target = targets[kind]
    gamma, new, trained = 3, 24, [3, 1, 4, 1, 5, 9, 2, 6]
    draft = mtp_draft(target, steps=gamma)
    _overfit(target, draft, trained + target_decode(target, trained, new + gamma + 1))
    real = decode.reference_drafter
    accepts = []
    for prompt, spoilt in ((trained, set()), (trained, {11, 17, 22}), ([7, 7, 2], set())):
        ref = target_decode(target, prompt, new)
        with monkeypatch.context() as m:
            if spoilt:
                m.setattr(decode, "reference_drafter", lambda d: _corrupting(real(d), spoilt, 96))
            loop = SpecDecoder(target, draft).generate(prompt, new)
        engine = Engine(target, draft, EngineConfig(max_context=len(prompt) + new, min_window=8))
        if spoilt:
            _corrupting(engine.drafter, spoilt, 96)
        served = engine.generate(prompt, SamplingParams(max_tokens=new))
        assert loop.tokens == ref and served.tokens == ref, (kind, prompt, spoilt)
        assert served.accepts == loop.accepts, (kind, prompt, spoilt)
        accepts.append(loop.accepts)
    assert gamma in accepts[0] and {0, 1} & set(accepts[1]), accepts


def _recording(drafter, log: list):
    real = drafter.propose

    def propose(anchor, p, temperature=0.0, generator=None, window=None):
        tokens, probs, conf = real(anchor, p, temperature, generator, window)
        log.append((int(p), tokens.clone(), probs.clone()))
        return tokens, probs, conf

    drafter.propose = propose
    return drafter


@torch.no_grad()
def _fresh_chain(target, draft, seq: list[int], tokens: torch.Tensor) -> torch.Tensor:
    """T=1 distributions (γ, V) of a chain drafted from an empty cache after seq = x_0..x_p."""
    ids, p = torch.tensor([seq]), len(seq) - 1
    cache = Eagle3Cache()
    h = draft.backbone(draft.fuse(target.capture(ids[:, :p]).aux), ids[:, 1:], torch.arange(1, p + 1)[None], cache)
    h = h[:, -1:]
    logits = [draft.draft_logits(h[0, -1])]
    for j in range(1, len(tokens)):
        h = draft.backbone(h, tokens[j - 1].view(1, 1), torch.tensor([[p + j]]), cache, step=j)
        logits.append(draft.draft_logits(h[0, -1]))
    return torch.softmax(torch.stack(logits), dim=-1)


@pytest.mark.parametrize("kind", KINDS)
def test_every_round_drafts_what_a_fresh_chain_drafts(kind, targets, monkeypatch):
    """T=1 through the reference loop and the engine: each round's draft distributions equal
    those of a chain drafted from scratch over the committed tokens (the MTP layer's cache, MLA's
    latent included, is extended by the committed positions and rid of the rejected ones)."""
    target = targets[kind]
    draft = mtp_draft(target, steps=3)
    logs = {"reference": [], "engine": []}
    real = decode.reference_drafter
    monkeypatch.setattr(decode, "reference_drafter", lambda d: _recording(real(d), logs["reference"]))
    engine = Engine(target, draft, EngineConfig(max_context=40, min_window=8, seed=1))
    _recording(engine.drafter, logs["engine"])
    prompt = [9, 4, 9, 4, 0, 13, 2]
    runs = {"reference": SpecDecoder(target, draft).generate(prompt, 16, temperature=1.0,
                                                              generator=torch.Generator().manual_seed(2)),
            "engine": engine.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=3))}
    for name, run in runs.items():
        full = prompt + run.tokens
        for p, tokens, probs in logs[name]:
            torch.testing.assert_close(probs, _fresh_chain(target, draft, full[: p + 1], tokens), rtol=0, atol=1e-5,
                                       msg=f"{kind} {name} round at p={p}")


def test_sampling_matches_target_distribution(targets):
    """T=1: exact marginals of the two tokens after a fixed anchor vs engine samples (as
    test_eagle3_serve's), drafted by the DeepSeek-V3 target's MTP head: the target's distribution."""
    target = targets["deepseek_v3"]
    prompt, anchor = [1, 2, 3], 7
    ctx = prompt + [anchor]
    with torch.no_grad():
        lm = target.model
        lm.lm_head.weight.mul_(0.05)  # soften (restored below): rounds accept and reject
        try:
            p1 = torch.softmax(lm(torch.tensor([ctx])).logits[0, -1], -1)  # (V,)
            nxt = torch.cat([torch.tensor([ctx]).expand(96, 4), torch.arange(96)[:, None]], 1)
            p2 = p1 @ torch.softmax(lm(nxt).logits[:, -1], -1)
            n = 600
            first, second, accepted = sample_two_tokens(target, mtp_draft(target, steps=2), prompt, anchor, n)
        finally:
            lm.lm_head.weight.div_(0.05)
    # 600 samples: a frequency's std is at most ~0.02; 0.08 is ~4 sigma.
    assert (first / n - p1).abs().max() < 0.08 and (second / n - p2).abs().max() < 0.08
    assert max(accepted) >= 1 and min(accepted) == 0


def test_a_target_without_mtp_layers_is_refused_in_one_line(tmp_path):
    """From config.json alone (checks.py, before any weight loads) and from the resolver."""
    from transformers import LlamaConfig

    from splitserve.checks import check_draft_target
    from tiny import tiny_target

    LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    cfg = RunConfig(target=TargetConfig(name="llama", path=str(tmp_path), layer_rule="last"),
                    draft=DraftConfig(family="mtp"))
    with pytest.raises(UserError) as err:
        check_draft_target(cfg)
    msg = str(err.value)
    assert "\n" not in msg and "LlamaForCausalLM has no MTP layers" in msg, msg
    assert "num_nextn_predict_layers / mtp_num_hidden_layers" in msg, msg
    target = tiny_target()
    with pytest.raises(UserError, match="has no MTP layers"):
        resolve_arch(DraftConfig(family="mtp"), target.info, target.model.config)


def test_mtp_layers_in_config_but_not_in_the_checkpoint_are_refused_in_one_line(tmp_path):
    target = load_mtp_target(save_mtp_target(tmp_path / "no_mtp", "deepseek_v3", with_mtp=False))
    with pytest.raises(UserError) as err:
        mtp_draft(target)
    msg = str(err.value)
    assert "\n" not in msg and "num_nextn_predict_layers=1" in msg and "model.layers.2.*" in msg, msg


def test_the_last_layer_is_read_only_under_its_rule(targets):
    """draft=mtp refuses other captured layers; the last layer is captured only by layer_rule=last."""
    from dataclasses import replace

    from splitserve.target.layers import check_layer_ids

    target = targets["deepseek_v3"]
    with pytest.raises(UserError, match="set target.layer_rule=last"):
        resolve_arch(DraftConfig(family="mtp"), replace(target.info, layer_ids=(0,)), target.model.config)
    with pytest.raises(UserError, match="captured only by target.layer_rule=last"):
        check_layer_ids([1], 2)
    check_layer_ids([1], 2, allow_last=True)
    arch = resolve_arch(DraftConfig(family="mtp"), target.info, target.model.config)
    assert json.loads(json.dumps(arch.to_dict())) == arch.to_dict() and arch.target_layer_ids == (1,)  # resumable
