"""The serving engine is lossless and stays on the device: greedy output equals the target's own
greedy output (any draft, any accept pattern), T=1 sampling follows the target distribution,
and a round makes no host read but the one of its committed tokens."""

import host_reads
import pytest
import torch
from marginals import sample_two_tokens, two_token_marginals
from tiny import tiny_draft, tiny_target

from splitserve.config import EngineConfig
from splitserve.speculative.decode import target_decode
from splitserve.speculative.engine import ContextLengthError, Engine, SamplingParams, attention_windows

pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts(seed: int, n: int = 3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 90, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("gamma", [4, 8])
@pytest.mark.parametrize("markov_rank, head", [(0, "vanilla"), (8, "vanilla"), (8, "rnn")])
def test_greedy_equals_target_greedy(gamma, markov_rank, head):
    target = tiny_target(seed=gamma + markov_rank)
    draft = tiny_draft(target, block_size=gamma, markov_rank=markov_rank, markov_head_type=head)
    if draft.markov is not None:  # a non-zero Markov bias, so the sequential stage matters
        torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    engine = Engine(target, draft, EngineConfig(max_context=64))
    assert not engine.graphs.enabled  # CPU: CUDA graphs are off whatever the config says
    for prompt in _prompts(gamma):
        ref = target_decode(target, prompt, 24)
        stats = engine.generate(prompt, SamplingParams(max_tokens=24))
        assert stats.tokens == ref and stats.finish_reason == "length"
        assert 1 + sum(n + 1 for n in stats.accepts) >= 24
        assert engine.generate(prompt, SamplingParams(max_tokens=24), mode="ar").tokens == ref


@pytest.mark.parametrize("head", ["vanilla", "rnn"])
def test_draft_attention_in_place_equals_concatenated(head):
    """The engine's draft reads its context cache in place (the block's K/V written at its own
    slots, one attention over slots 0..p+γ-1) instead of concatenating context and block under a
    mask. Round by round the two give the same draft distributions (float32, to rounding) and the
    same tokens, through requests that grow over several windows and leave stale slots behind."""
    target = tiny_target(seed=6)
    draft = tiny_draft(target, block_size=4, markov_rank=8, markov_head_type=head)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    cfg = dict(max_context=64, min_window=8)
    engines = {a: Engine(target, draft, EngineConfig(draft_attention=a, **cfg)) for a in ("kernel", "sdpa")}
    seen = {a: [] for a in engines}
    real = draft.draft

    def record(*args, **kw):
        out = real(*args, **kw)
        seen["kernel" if kw.get("attend") is not None else "sdpa"].append(out[1].clone())
        return out

    draft.draft = record
    sampled = SamplingParams(max_tokens=40, temperature=1.0, seed=3)
    for prompt in _prompts(6):
        runs = {a: e.generate(prompt, sampled) for a, e in engines.items()}
        assert runs["kernel"].tokens == runs["sdpa"].tokens
        assert runs["kernel"].accepts == runs["sdpa"].accepts
    assert len(seen["kernel"]) == len(seen["sdpa"]) > 20
    for a, b in zip(seen["kernel"], seen["sdpa"]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_attention_windows_keep_every_token():
    """min_window: each step attends to the first W cache slots only (W covering every slot it
    writes). Greedy and seeded sampling give the same tokens as attending to the whole cache,
    and requests that grow through several windows use each of them."""
    assert attention_windows(256, 1041) == [256, 512, 1024, 1041]
    assert attention_windows(0, 69) == attention_windows(128, 69) == [69]
    with pytest.raises(ValueError, match="min_window"):
        attention_windows(-1, 69)
    target = tiny_target(seed=4)
    draft = tiny_draft(target, block_size=4, markov_rank=8)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    whole = Engine(target, draft, EngineConfig(max_context=64, min_window=0))
    windowed = Engine(target, draft, EngineConfig(max_context=64, min_window=8))
    assert whole.windows == [69] and windowed.windows == [8, 16, 32, 64, 69]
    used = []
    real = windowed._window_for
    windowed._window_for = lambda mode, seq_len: used.append(real(mode, seq_len)) or used[-1]
    sampled = SamplingParams(max_tokens=40, temperature=1.0, seed=5)
    for prompt in _prompts(4):
        ref = target_decode(target, prompt, 40)
        for mode in ("spec", "ar"):
            assert windowed.generate(prompt, SamplingParams(max_tokens=40), mode=mode).tokens == ref, mode
        # Same draws; the window only drops masked slots, which add exact zeros (the floats are
        # bit-equal here): a flip would need a draw within float32 drift of a decision boundary.
        assert windowed.generate(prompt, sampled).tokens == whole.generate(prompt, sampled).tokens
    assert {16, 32, 64} <= set(used)


def test_cache_window_must_cover_the_written_slots():
    from splitserve.target.static_cache import StaticKVCache

    cache = StaticKVCache(num_layers=1, max_len=16)
    with pytest.raises(ValueError, match="window"):
        cache.bind(torch.arange(3), window=17)


def _oracle(draft, truth: list[int], prompt_len: int, corrupt_every: int):
    """Make `draft.draft` propose the target's own continuation with every k-th token wrong, so
    rounds accept 0..γ tokens: exercises long accepts, partial accepts and the bonus."""
    real = draft.draft

    def fake(ctx_kv, anchor_id, anchor_pos, temperature=0.0, generator=None, **kw):
        tokens, _, conf = real(ctx_kv, anchor_id, anchor_pos, temperature, generator, **kw)
        start = int(anchor_pos) - prompt_len + 1  # index in `truth` of the token after the anchor
        for k in range(len(tokens)):
            i = start + k
            if i < len(truth):
                tokens[k] = truth[i] if (i % corrupt_every) else (truth[i] + 1) % 90
        return tokens, None, conf

    draft.draft = fake


def test_long_and_partial_accepts_commit_exactly():
    target = tiny_target(seed=11)
    draft = tiny_draft(target, block_size=8, markov_rank=8)
    prompt = [3, 1, 4, 1, 5]
    ref = target_decode(target, prompt, 60)
    _oracle(draft, ref, len(prompt), corrupt_every=11)
    engine = Engine(target, draft, EngineConfig(max_context=len(prompt) + 60))  # runs up to the last slot
    stats = engine.generate(prompt, SamplingParams(max_tokens=60))
    assert stats.tokens == ref
    assert max(stats.accepts) == 8 and min(stats.accepts) < 8  # full blocks and rejections
    assert stats.accept_length > 4


def test_eos_cancel_and_next_request():
    target = tiny_target(seed=3)
    draft = tiny_draft(target, block_size=4)
    engine = Engine(target, draft, EngineConfig(max_context=64))
    prompt = [5, 6, 7]
    ref = target_decode(target, prompt, 40)
    eos = frozenset({ref[7]})
    want = target_decode(target, prompt, 40, eos_ids=set(eos))
    stats = engine.generate(prompt, SamplingParams(max_tokens=40, eos_ids=eos))
    assert stats.tokens == want and stats.finish_reason == "stop"
    seen = []
    stats = engine.generate(prompt, SamplingParams(max_tokens=40), on_tokens=lambda t: seen.extend(t) or len(seen) < 3)
    assert stats.finish_reason == "cancelled" and len(stats.tokens) < 40 and seen == stats.tokens
    assert engine.generate([9, 9], SamplingParams(max_tokens=12)).tokens == target_decode(target, [9, 9], 12)


def test_context_limits():
    target = tiny_target(seed=0)
    engine = Engine(target, tiny_draft(target, block_size=4), EngineConfig(max_context=32))
    with pytest.raises(ContextLengthError, match="32"):
        engine.generate(list(range(32)), SamplingParams(max_tokens=1))
    with pytest.raises(ContextLengthError, match="exceeds"):
        engine.generate(list(range(10)), SamplingParams(max_tokens=23))
    assert len(engine.generate(list(range(10)), SamplingParams(max_tokens=22)).tokens) == 22


@pytest.mark.parametrize("draft_vocab, weight_format", [(0, "model"), (40, "model"), (0, "fp8")],
                         ids=["whole-vocab", "reduced-vocab", "fp8-draft"])
def test_round_has_no_host_reads(monkeypatch, draft_vocab, weight_format):
    """Every way a tensor value can reach Python is counted while rounds run: a spec round and
    an AR step make none, and generate() makes exactly one per round; with every draft head
    option (a reduced vocabulary once read the anchor's draft id on the host: x[n] for a 0-d n,
    which broke CUDA graph capture)."""
    target = tiny_target(seed=2)
    draft = tiny_draft(target, block_size=4, markov_rank=8, draft_vocab_size=draft_vocab).eval()
    engine = Engine(target, draft, EngineConfig(max_context=64, draft_weight_format=weight_format))
    engine.generate([1, 2, 3], SamplingParams(max_tokens=4))  # state: a prefilled request
    reads = host_reads.assert_steps_sync_free(monkeypatch, host_reads.round_steps(engine))
    stats = engine.generate([1, 2, 3], SamplingParams(max_tokens=20))
    # one read after the prefill (the first token, and whether the target's logits were finite),
    # then one `out.tolist()` per round
    assert reads.count("tolist") == len(reads) == len(stats.accepts) + 1, reads


def test_warmup_captures_without_grad(monkeypatch):
    """warmup() is called from plain code (serve's startup, bench): its steps must still trace
    without autograd, or a compiled step traces a backward our FP8 draft op does not have."""
    target = tiny_target(seed=2)
    engine = Engine(target, tiny_draft(target, block_size=4, markov_rank=8).eval(), EngineConfig(max_context=64))
    seen = []
    monkeypatch.setattr(engine, "_prepare", lambda *a, **k: seen.append(torch.is_grad_enabled()))
    assert torch.is_grad_enabled()
    engine.warmup("spec", 0.0)
    assert seen == [False]


@pytest.mark.parametrize("trunc", [(0, 1.0), (5, 0.8)])
def test_sampling_matches_target_distribution(trunc):
    """T=1 (and top_k/top_p truncation): exact marginals of the two tokens after a fixed anchor
    vs engine samples (V=16), as in test_spec_decode, through the static cache, static context and
    device-side verification.
    One prefill, then each sample rewinds the state to the anchor and runs rounds until it has
    two tokens: that is what generate() does after its prefill, without paying for the prefill."""
    target = tiny_target(seed=5, vocab=16, layers=3, layer_ids=(0, 1))
    with torch.no_grad():
        target.model.lm_head.weight.mul_(0.1)  # soften: many tokens get real probability
    draft = tiny_draft(target, block_size=3, markov_rank=4)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    prompt, anchor = [1, 2, 3], 7
    p1, p2 = two_token_marginals(target, prompt + [anchor], trunc=trunc)
    engine = Engine(target, draft, EngineConfig(max_context=16, seed=0))
    engine._prefill(prompt, 1.0)
    n = 2000
    first, second, _ = sample_two_tokens(engine, len(prompt), anchor, n, trunc)
    # 2000 samples: a frequency's std is at most ~0.011; 0.045 is ~4 sigma.
    assert (first / n - p1).abs().max() < 0.045
    assert (second / n - p2).abs().max() < 0.045
    assert first[p1 == 0].sum() == 0 and second[p2 == 0].sum() == 0  # truncated tokens never come out


def test_seeded_sampling_is_reproducible():
    target = tiny_target(seed=6)
    engine = Engine(target, tiny_draft(target, block_size=4), EngineConfig(max_context=64))
    params = SamplingParams(max_tokens=16, temperature=0.8, seed=123)
    # bit-equal: the same engine replays the same ops and draws
    assert engine.generate([4, 5], params).tokens == engine.generate([4, 5], params).tokens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_rounds_equal_eager_rounds():
    """On CUDA: the captured round and AR step replay to the same greedy tokens as eager
    execution and as the target's own greedy decoding; sampling runs under graphs too."""
    target = tiny_target(seed=8)
    target.model.to("cuda")
    draft = tiny_draft(target, block_size=8, markov_rank=8)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    graphed = Engine(target, draft, EngineConfig(max_context=128, use_cuda_graphs=True))
    assert graphed.graphs.enabled
    for prompt in _prompts(8):
        ref = target_decode(target, prompt, 48)
        for mode in ("spec", "ar"):
            assert graphed.generate(prompt, SamplingParams(max_tokens=48), mode=mode).tokens == ref, mode
    w, off = graphed.windows[-1], (0, 1.0)  # graph keys: (mode, temperature, window, (top_k, top_p))
    assert ("spec", 0.0, w, off) in graphed.graphs and ("ar", 0.0, w, off) in graphed.graphs
    windowed = Engine(target, draft, EngineConfig(max_context=128, min_window=16))
    for prompt in _prompts(8):
        ref = target_decode(target, prompt, 48)
        for mode in ("spec", "ar"):
            assert windowed.generate(prompt, SamplingParams(max_tokens=48), mode=mode).tokens == ref, mode
    assert sum(k[0] == "spec" for k in windowed.graphs._graphs) >= 3  # one graph per window in use
    stats = graphed.generate([1, 2, 3], SamplingParams(max_tokens=32, temperature=1.0, seed=1))
    assert len(stats.tokens) == 32 and all(0 <= t < target.info.vocab_size for t in stats.tokens)
    # top_k / top_p under graphs: the sort and top-k of the truncation capture too
    truncated = SamplingParams(max_tokens=32, temperature=1.0, seed=1, top_k=5, top_p=0.8)
    stats = graphed.generate([1, 2, 3], truncated)
    assert len(stats.tokens) == 32 and ("spec", 1.0, w, (5, 0.8)) in graphed.graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("markov_rank, draft_vocab", [(0, 0), (0, 10), (4, 10)], ids=["dflash", "dflash-reduced",
                                                                                       "dspark-reduced"])
def test_eager_cuda_rounds_equal_graphed_rounds(markov_rank, draft_vocab):
    """On CUDA the engine without graphs and with each round read before the next is queued runs
    the same kernels (programmatic dependent launches included) as the graphed engine that queues
    ahead. In float32 both give the target's own greedy tokens, in the same rounds with the same
    accepts. A 16-token vocabulary makes a random draft's tokens accepted often enough to compare."""
    target = tiny_target(seed=11, vocab=16)
    target.model.to("cuda")
    draft = tiny_draft(target, block_size=6, markov_rank=markov_rank, enable_confidence_head=markov_rank > 0,
                       draft_vocab_size=draft_vocab)
    eager = Engine(target, draft, EngineConfig(max_context=96, use_cuda_graphs=False, overlap_steps=False))
    graphed = Engine(target, draft, EngineConfig(max_context=96))
    assert graphed.graphs.enabled and not eager.graphs.enabled
    accepted = 0
    g = torch.Generator().manual_seed(11)
    for n in (3, 7, 1, 12):
        prompt = torch.randint(0, 15, (n,), generator=g).tolist()  # not the mask token (15)
        ref = target_decode(target, prompt, 40)
        a = eager.generate(prompt, SamplingParams(max_tokens=40))
        b = graphed.generate(prompt, SamplingParams(max_tokens=40))
        assert a.tokens == ref and b.tokens == ref
        assert a.accepts == b.accepts
        accepted += sum(a.accepts)
    assert accepted > 0


def test_compiled_round_equals_eager_round():
    """EngineConfig.compile_backend traces the round and the AR step with torch.compile; the
    traced code must give the same tokens, greedy and seeded sampling alike ("aot_eager" traces
    without generating code, which keeps this test fast; the GPU uses "inductor")."""
    target = tiny_target(seed=3)
    draft = tiny_draft(target, block_size=4, markov_rank=8)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    from torch._dynamo.utils import counters

    counters.clear()
    eager = Engine(target, draft, EngineConfig(max_context=64))
    traced = Engine(target, draft, EngineConfig(max_context=64, compile_backend="aot_eager"))
    prompt = [5, 7, 9, 11]
    greedy = SamplingParams(max_tokens=20)
    sampled = SamplingParams(max_tokens=20, temperature=1.0, seed=3)
    assert traced.generate(prompt, greedy).tokens == eager.generate(prompt, greedy).tokens == target_decode(
        target, prompt, 20)
    # bit-equal: aot_eager runs the traced aten ops eagerly, the same kernels on the same shapes
    assert traced.generate(prompt, sampled).tokens == eager.generate(prompt, sampled).tokens
    assert traced.generate(prompt, greedy, mode="ar").tokens == eager.generate(prompt, greedy, mode="ar").tokens
    assert counters["stats"]["unique_graphs"] >= 3  # greedy round, sampled round (pieces), AR step were traced


def _steps_counted(engine):
    """Count the steps the engine runs (graphs are off on a CPU, so each one is a call)."""
    calls = []
    for name in ("_spec_round", "_ar_step"):
        real = getattr(engine, name)
        setattr(engine, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    return calls


@pytest.mark.parametrize("mode", ["spec", "ar"])
def test_overlapped_steps_give_the_same_request(mode):
    """Queueing the next step before reading the running one (the CUDA default, forced here on a
    CPU) changes no token, accept count or confidence, greedy or seeded sampling, at EOS, on
    cancel and when a request runs to the last slot of the context; at most one step a request
    runs past what the request reads, and only when it ends early (EOS, cancel)."""
    target = tiny_target(seed=12)
    draft = tiny_draft(target, block_size=4, markov_rank=8)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    prompt = [2, 7, 1, 8]
    ref = target_decode(target, prompt, 40)
    requests = [SamplingParams(max_tokens=40),  # fills the context: the last step ends at its last slot
                SamplingParams(max_tokens=40, eos_ids=frozenset({ref[9]})),
                SamplingParams(max_tokens=33, temperature=0.9, seed=5, top_k=20),
                SamplingParams(max_tokens=1)]
    runs, confidences = {}, {}
    for overlap in (False, True):
        cfg = EngineConfig(max_context=len(prompt) + 40, min_window=8, overlap_steps=overlap,
                           record_confidence=True)  # windows 8, 16, 32 and the whole cache
        engine = Engine(target, draft, cfg)
        calls = _steps_counted(engine)
        out = []
        for params in requests:
            calls.clear()
            s = engine.generate(prompt, params, mode=mode)
            out.append((s.tokens, s.accepts, s.finish_reason))
            confidences.setdefault(overlap, []).append(torch.tensor(s.confidences))
            steps = len(s.accepts) if mode == "spec" else len(s.tokens) - 1
            extra = 1 if overlap and s.finish_reason == "stop" else 0  # queued before the EOS was read
            assert len(calls) == steps + extra, (overlap, params, len(calls), steps)
        seen = []
        s = engine.generate(prompt, SamplingParams(max_tokens=40), mode=mode,
                            on_tokens=lambda t: seen.extend(t) or len(seen) < 6)
        out.append((s.tokens, s.finish_reason, seen == s.tokens))
        out.append(engine.generate([9, 9], SamplingParams(max_tokens=12), mode=mode).tokens)  # the next request
        runs[overlap] = out
    assert runs[True] == runs[False]
    assert runs[True][0][0] == ref and runs[True][1][2] == "stop" and runs[True][4][1] == "cancelled"
    assert runs[True][5] == target_decode(target, [9, 9], 12)
    for on, off in zip(confidences[True], confidences[False]):
        # read through the overlap too; a step queued ahead may take a larger attention window,
        # whose masked slots change the draft's sums by an ulp
        assert on.shape == off.shape
        torch.testing.assert_close(on, off, rtol=0, atol=1e-5)
    assert mode == "ar" or confidences[True][0].numel() > 0


def test_host_reads_hand_back_each_stage():
    from splitserve.speculative.host_reads import HostReads

    reads = HostReads(torch.device("cpu"), slots=2)
    buf = torch.tensor([1, 2, 3])
    a = reads.stage(buf, torch.tensor([0.5]))
    buf.fill_(7)  # the staged copy is the value at stage time
    b = reads.stage(buf)
    with pytest.raises(RuntimeError, match="unread"):
        reads.stage(buf)  # both slots hold unread stages
    assert reads.read(a) == [[1, 2, 3], [0.5]] and reads.read(b) == [[7, 7, 7]]
    with pytest.raises(RuntimeError, match="no unread"):
        reads.read(a)
    reads.stage(buf)
    reads.drop_unread()
    assert reads.read(reads.stage(torch.tensor([4]))) == [[4]]


def test_verify_kernel_setting_picks_the_kernel_module():
    """--verify-kernel auto verifies through speculative/verify_kernel.py (Triton on CUDA, the
    reference elsewhere), torch through the reference itself."""
    from splitserve.speculative import verify, verify_kernel

    target = tiny_target(seed=2)
    draft = tiny_draft(target, block_size=4)
    auto = Engine(target, draft, EngineConfig(max_context=32))
    torch_only = Engine(target, draft, EngineConfig(max_context=32, verify_kernel="torch"))
    assert auto._verify_fns == {"greedy": verify_kernel.greedy_verify, "sampling": verify_kernel.sampling_verify}
    assert torch_only._verify_fns == {"greedy": verify.greedy_verify, "sampling": verify.sampling_verify}
