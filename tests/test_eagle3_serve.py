"""EAGLE-3 served through the drafter seam (speculative/drafter.py, speculative/eagle3_chain.py):
every round drafts what a chain drafted afresh over the committed tokens drafts, greedy output is
the target's own through full and partial accepts (reference loop and engine), T=1 samples follow
the target's distribution, a round makes no host read, a draft made for another target is refused
in one line before serving, and its run loads, evaluates and runs training's held-out evaluation."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import host_reads
import marginals
from tiny import tiny_target

import splitserve.speculative.decode as decode
from splitserve.config import DraftConfig, EngineConfig, ModelsConfig
from splitserve.models.build import DraftMismatchError, build_draft, resolve_arch
from splitserve.models.eagle3 import Eagle3Cache, Eagle3Draft
from splitserve.models.vocab_map import VocabMap, build_vocab_map, count_tokens
from splitserve.speculative.decode import SpecDecoder, target_decode
from splitserve.speculative.engine import Engine, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


def _eagle3(target, gamma: int = 3, vocab: int = 64, std: float = 0.2, seed: int = 0) -> Eagle3Draft:
    """A one-layer EAGLE-3 draft of γ = gamma chain steps over the target's captured layers;
    std > 0 redraws its trained matrices so that every one of them matters."""
    torch.manual_seed(seed)
    cfg = DraftConfig(family="eagle3", num_layers=1, intermediate_size=48, draft_vocab_size=vocab, ttt_steps=gamma)
    draft = build_draft(resolve_arch(cfg, target.info, target.model.config), target).eval()
    if std:
        for p in draft.parameters():
            if p.requires_grad and p.dim() == 2:
                torch.nn.init.normal_(p, std=std)
    return draft


def _recording(drafter, log: list):
    """Wrap drafter.propose to keep each round's (p, tokens, probabilities)."""
    real = drafter.propose

    def propose(anchor, p, temperature=0.0, generator=None, window=None):
        tokens, probs, conf = real(anchor, p, temperature, generator, window)
        log.append((int(p), tokens.clone(), None if probs is None else probs.clone()))
        return tokens, probs, conf

    drafter.propose = propose
    return drafter


@torch.no_grad()
def _fresh_chain(target, draft, seq: list[int], tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """The distributions (γ, V) of a chain drafted from an empty cache after seq = x_0..x_p (x_p
    the anchor), reading `tokens` (γ,): the target's states at 0..p-1 read with x_1..x_p, then
    one `Eagle3Draft.step` per token."""
    ids, p = torch.tensor([seq]), len(seq) - 1
    cache = Eagle3Cache()
    h = draft.backbone(draft.fuse(target.capture(ids[:, :p]).aux), ids[:, 1:], torch.arange(1, p + 1)[None], cache)
    logits = [draft.target_logits(draft.draft_logits(h[0, -1]))]
    h = h[:, -1:]
    for j in range(1, len(tokens)):
        step_logits, h = draft.step(h, tokens[j - 1].view(1, 1), torch.tensor([[p + j]]), cache)
        logits.append(step_logits[0, 0])
    return torch.softmax(torch.stack(logits) / temperature, dim=-1)


def test_every_round_drafts_what_a_fresh_chain_drafts(monkeypatch):
    """T=1 through the reference loop and the engine (windows 8.., stale slots left behind by
    rejections): each round's draft distributions equal those of a chain drafted from scratch
    over the committed tokens, so the cache kept across rounds (extended with the committed
    positions, rid of the rejected ones) is the one a fresh prefill would build; they are zero
    outside the draft vocabulary."""
    target = tiny_target(seed=5, vocab=16, layers=3, layer_ids=(0, 1))
    with torch.no_grad():
        target.model.lm_head.weight.mul_(0.1)  # soften: rounds accept 0..γ
    draft = _eagle3(target, gamma=3, vocab=12, std=0.3)
    logs = {"reference": [], "engine": []}
    real = decode.reference_drafter
    monkeypatch.setattr(decode, "reference_drafter", lambda d: _recording(real(d), logs["reference"]))
    engine = Engine(target, draft, EngineConfig(max_context=40, min_window=8, seed=1))
    _recording(engine.drafter, logs["engine"])
    gen = torch.Generator().manual_seed(2)
    accepts = []
    for prompt in ([1, 2, 3], [9, 4, 9, 4, 0, 13, 2]):
        runs = {"reference": SpecDecoder(target, draft).generate(prompt, 30, temperature=1.0, generator=gen),
                "engine": engine.generate(prompt, SamplingParams(max_tokens=30, temperature=1.0, seed=3))}
        for name, run in runs.items():
            full = prompt + run.tokens
            for p, tokens, probs in logs[name]:
                want = _fresh_chain(target, draft, full[: p + 1], tokens, 1.0)
                torch.testing.assert_close(probs, want, rtol=0, atol=1e-5, msg=f"{name} round at p={p}")
                assert probs[:, ~draft.t2d].eq(0).all() and draft.t2d[tokens].all()
            accepts += run.accepts
            logs[name].clear()
    assert {0, 3} <= set(accepts) and set(accepts) & {1, 2}  # rejections at every depth, and full chains


def _overfit(target, draft: Eagle3Draft, seq: list[int], steps: int = 120) -> None:
    """Teach the draft one sequence: the training-time test's chains of γ steps, cross-entropy
    on the draft vocabulary (the sequence's own tokens)."""
    ids, gamma = torch.tensor([seq], device=target.device), draft.arch.block_size
    draft.set_vocab(build_vocab_map(count_tokens([(seq, [1] * len(seq))], draft.arch.vocab_size),
                                    draft.arch.draft_vocab_size))
    labels = draft.vocab.to_draft(ids[0])  # (T,)
    with torch.no_grad():
        aux = target.capture(ids).aux
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-2)
    draft.train()
    for _ in range(steps):
        states = draft.unroll(aux, ids, gamma)  # γ x (1, T-1, D); row t of step j predicts x_{t+2+j}
        loss = sum(F.cross_entropy(draft.draft_logits(s[0, : len(seq) - 2 - j]), labels[2 + j:], ignore_index=-1)
                   for j, s in enumerate(states))
        opt.zero_grad()
        loss.backward()
        opt.step()
    draft.eval()


def _corrupting(drafter, bad: set[int], vocab: int):
    """Wrap drafter.propose so that the draft token at each position in `bad` is wrong (as
    test_serve_engine's `_oracle`): on a sequence the draft knows, rounds stop where they meet one."""
    real = drafter.propose

    def propose(anchor, p, temperature=0.0, generator=None, window=None):
        tokens, probs, conf = real(anchor, p, temperature, generator, window)
        wrong = torch.tensor([int(p) + 1 + k in bad for k in range(len(tokens))])  # d_k sits at position p + k
        return torch.where(wrong, (tokens + 1) % vocab, tokens), probs, conf

    drafter.propose = propose
    return drafter


def test_greedy_equals_target_greedy_through_full_and_partial_accepts(monkeypatch):
    """A draft overfit to one continuation accepts whole chains on it, stops at every depth where
    an oracle spoils a token, and accepts little elsewhere; every way the reference loop and the
    engine (run to the last slot of its context, through several attention windows) return the
    target's own greedy tokens, in the same rounds, in float32."""
    target = tiny_target(seed=11)
    vocab, gamma, new = target.info.vocab_size, 4, 40
    trained = [3, 1, 4, 1, 5, 9, 2, 6]
    draft = _eagle3(target, gamma=gamma, std=0)
    _overfit(target, draft, trained + target_decode(target, trained, new + gamma + 1))
    real = decode.reference_drafter
    accepts = {}
    bad = {11, 18, 24, 33, 38, 42}  # on the trained prompt (P = 8): rounds stop at depths 2, 1, 0, 3, 3
    for prompt, spoilt in ((trained, set()), (trained, bad), ([7, 7, 2], set()), ([50, 8, 61, 3, 3, 90, 12, 5], set())):
        ref = target_decode(target, prompt, new)
        with monkeypatch.context() as m:
            if spoilt:
                m.setattr(decode, "reference_drafter", lambda d: _corrupting(real(d), spoilt, vocab))
            loop = SpecDecoder(target, draft).generate(prompt, new)
        engine = Engine(target, draft, EngineConfig(max_context=len(prompt) + new, min_window=8))
        if spoilt:
            _corrupting(engine.drafter, spoilt, vocab)
        served = engine.generate(prompt, SamplingParams(max_tokens=new))
        assert loop.tokens == ref and served.tokens == ref, (prompt, spoilt)
        assert served.accepts == loop.accepts, (prompt, spoilt)  # the same rounds: the chains' argmaxes agree
        accepts[len(accepts)] = loop.accepts
    assert sum(accepts[0]) / len(accepts[0]) > gamma - 1, accepts[0]  # it learnt the continuation
    assert gamma in accepts[1] and {0, 1, 2, 3} <= set(accepts[1]), accepts[1]  # and stops at every depth
    assert min(accepts[2] + accepts[3]) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_rounds_equal_eager_rounds():
    """On CUDA: EAGLE-3's round captured as CUDA graphs (one per attention window, rounds queued
    ahead of the host's read) gives the eager engine's tokens and rounds and the target's greedy
    tokens; sampled and truncated rounds capture too."""
    target = tiny_target(seed=11)
    target.model.to("cuda")
    gamma, trained = 4, [3, 1, 4, 1, 5, 9, 2, 6]
    draft = _eagle3(target, gamma=gamma, std=0)
    _overfit(target, draft, trained + target_decode(target, trained, 48 + gamma + 1))
    eager = Engine(target, draft, EngineConfig(max_context=128, min_window=16, use_cuda_graphs=False))
    graphed = Engine(target, draft, EngineConfig(max_context=128, min_window=16, use_cuda_graphs=True))
    assert graphed.graphs.enabled and not eager.graphs.enabled
    accepts = []
    for prompt in (trained, [7, 7, 2], [50, 8, 61, 3, 3, 90, 12, 5]):
        ref = target_decode(target, prompt, 48)
        a, b = (e.generate(prompt, SamplingParams(max_tokens=48)) for e in (eager, graphed))
        assert a.tokens == b.tokens == ref and a.accepts == b.accepts, prompt
        accepts += b.accepts
    assert max(accepts) == gamma and min(accepts) == 0
    assert graphed.graphs.enabled  # no capture failed (that would turn graphs off and run eagerly)
    assert sum(k[0] == "spec" for k in graphed.graphs._graphs) >= 2  # one graph per window in use
    for params in (SamplingParams(max_tokens=32, temperature=1.0, seed=1),
                   SamplingParams(max_tokens=32, temperature=1.0, seed=1, top_k=5, top_p=0.8)):
        stats = graphed.generate([1, 2, 3], params)
        assert len(stats.tokens) == 32 and all(0 <= t < target.info.vocab_size for t in stats.tokens)
        assert ("spec", 1.0, graphed.windows[0], (params.top_k, params.top_p)) in graphed.graphs


def sample_two_tokens(target, draft, prompt: list[int], anchor: int, n: int):
    """T=1 engine rounds of a chain draft after prompt + [anchor], each sample rewinding the
    committed length, the anchor and the chain's first state: -> counts (V,) of the first and of
    the second token, and every round's accepted count. One prefill, whose draw is replaced by
    `anchor` (the draft reads it with the prompt's last state, as after a prefill that drew it)."""
    engine = Engine(target, draft, EngineConfig(max_context=16, seed=0))
    engine._prefill(prompt, 1.0)
    with torch.no_grad():
        engine.drafter.commit(target.capture(torch.tensor([prompt])).aux, 0, torch.tensor(prompt[1:] + [anchor]),
                              len(prompt) - 1)
    h0 = engine.drafter.h0.clone()
    return marginals.sample_two_tokens(engine, len(prompt), anchor, n, rewind=lambda: engine.drafter.h0.copy_(h0))


def test_sampling_matches_target_distribution():
    """T=1: exact marginals of the two tokens after a fixed anchor vs engine samples (V=16), as
    test_serve_engine's; the draft proposes from 12 of the 16 ids, the target's two most likely
    next tokens left out, so those come only from the residual (the draft's probabilities there
    are zero). One prefill; each sample rewinds
    the committed length, the anchor and the chain's first state to it."""
    target = tiny_target(seed=5, vocab=16, layers=3, layer_ids=(0, 1))
    with torch.no_grad():
        target.model.lm_head.weight.mul_(0.1)
    prompt, anchor = [1, 2, 3], 7
    p1, p2 = marginals.two_token_marginals(target, prompt + [anchor])
    left_out = p1.topk(2).indices
    draft = _eagle3(target, gamma=3, vocab=12, std=0)
    kept = torch.tensor([i for i in range(16) if i not in left_out.tolist()][:12])
    draft.set_vocab(VocabMap.from_ids(kept, 16))  # the draft's lm_head: the target's rows of its 12 ids
    n = 1500
    first, second, accepted = sample_two_tokens(target, draft, prompt, anchor, n)
    # 1500 samples: a frequency's std is at most ~0.013; 0.05 is ~4 sigma.
    assert (first / n - p1).abs().max() < 0.05
    assert (second / n - p2).abs().max() < 0.05
    assert p1[left_out].sum() > 0.1 and first[left_out].sum() > 0  # never proposed: the residual gives them
    assert max(accepted) == 3 and min(accepted) == 0


def test_round_has_no_host_reads(monkeypatch):
    """An EAGLE-3 round (the chain, the verify, the commit into the draft's cache) makes no host
    read and no value-dependent-shape op, greedy and sampled; generate() reads once a round."""
    target = tiny_target(seed=2)
    engine = Engine(target, _eagle3(target, gamma=3), EngineConfig(max_context=64))
    engine.generate([1, 2, 3], SamplingParams(max_tokens=4))  # state: a prefilled request
    reads = host_reads.assert_steps_sync_free(monkeypatch, host_reads.round_steps(engine, ar=False))
    stats = engine.generate([1, 2, 3], SamplingParams(max_tokens=20))
    assert reads.count("tolist") == len(reads) == len(stats.accepts) + 1, reads  # the prefill's read, then one a round


def _run_dir(path: Path, draft: Eagle3Draft, target_path: str) -> Path:
    """A run directory as training leaves it: draft_arch.json and one checkpoint."""
    from safetensors.torch import save_file

    from splitserve.models.run_files import point_latest, save_arch

    save_arch(path, draft.arch, target_path, family="eagle3")
    ckpt = path / "checkpoints" / "step_0000001"
    ckpt.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in draft.trainable_state_dict().items()}, str(ckpt / "draft.safetensors"))
    point_latest(path / "checkpoints", ckpt.name)
    return path


@pytest.fixture(scope="module")
def smol(tiny_smol_dir):
    from splitserve.config import TargetConfig
    from splitserve.target.hf import load_hf_target

    target = load_hf_target(TargetConfig(name="tiny-smol", path=str(tiny_smol_dir), layer_ids=[0, 1, 2], device="cpu"))
    return target, _eagle3(target, gamma=3)


def test_a_draft_for_another_target_is_refused_in_one_line(smol, tiny_smol_dir, tmp_path, monkeypatch):
    """Another hidden size, vocabulary, captured layer or layer count: load_models refuses it in
    one line naming the difference, from config.json alone (no target weight is read); the
    engine and the reference loop refuse a draft built for another target the same way."""
    import splitserve.target.hf as hf
    from splitserve.loading import load_models

    target, draft = smol
    monkeypatch.setattr(hf, "load_hf_target", lambda *a, **k: pytest.fail("a target weight was read"))
    a = draft.arch
    cases = {"hidden size 48 vs target 32": replace(a, hidden_size=48),
             f"vocab size {a.vocab_size + 1} vs target {a.vocab_size}": replace(a, vocab_size=a.vocab_size + 1),
             "captured layer ids [5] do not exist": replace(a, target_layer_ids=(0, 1, 5)),
             "target layer count 6 vs 4": replace(a, target_num_layers=6)}
    for i, (says, arch) in enumerate(cases.items()):
        from splitserve.models.run_files import save_arch

        save_arch(tmp_path / str(i), arch, str(tiny_smol_dir), family="eagle3")
        with pytest.raises(DraftMismatchError) as err:
            load_models(ModelsConfig(draft=str(tmp_path / str(i)), target=str(tiny_smol_dir), device="cpu"))
        assert says in str(err.value) and "\n" not in str(err.value), err.value
    other = tiny_target(seed=0, hidden=48)
    for serve in (lambda: Engine(other, draft, EngineConfig(max_context=32)), lambda: SpecDecoder(other, draft)):
        with pytest.raises(DraftMismatchError, match="hidden size 32 vs target 48") as err:
            serve()
        assert "\n" not in str(err.value)


def test_a_run_loads_evaluates_benches_and_runs_the_held_out_evaluation(smol, tiny_smol_dir, tmp_path):
    """load_models gives back the run's EAGLE-3 draft; `evaluate` through the reference loop and
    the engine gives the target's own replies in the same rounds; bench runs it; training's
    held-out evaluation (draft=eagle3 now leaves it on) writes its table, the untrained baseline
    included."""
    from splitserve.config import BenchConfig, DataConfig, EvalConfig, RunConfig, compose
    from splitserve.evaluation.bench import run_bench
    from splitserve.evaluation.evaluate import evaluate
    from splitserve.evaluation.heldout import evaluate_run
    from splitserve.loading import load_models

    target, draft = smol
    run = _run_dir(tmp_path / "run", draft, str(tiny_smol_dir))
    _, loaded = load_models(ModelsConfig(draft=str(run), device="cpu", dtype="float32"))
    assert isinstance(loaded, Eagle3Draft) and torch.equal(loaded.d2t, draft.d2t)
    prompts = [[1, 2, 3, 4], [40, 41, 42]]
    ref, eng = (evaluate(target, loaded, prompts, 12, engine=e) for e in (False, True))
    assert ref.exact_matches == eng.exact_matches == 2 and ref.block_size == 3
    assert [r.accepts for r in ref.results] == [r.accepts for r in eng.results]
    models = ModelsConfig(draft=str(run), target=str(tiny_smol_dir), device="cpu")
    bench = run_bench(models, EngineConfig(), BenchConfig(input_len=6, output_len=5, num_requests=2, warmup=0))
    assert list(bench["results"]) == ["engine spec"] and bench["block_size"] == 3
    assert compose(["draft=eagle3"]).eval.enabled
    prompts_file = Path(__file__).resolve().parents[1] / "data" / "sample_prompts.jsonl"
    cfg = RunConfig(data=DataConfig(heldout_prompts=str(prompts_file)),
                    eval=EvalConfig(num_prompts=2, max_new_tokens=6), run_dir=str(run))
    evaluate_run(cfg, target, loaded)
    reports = json.loads((run / "eval.json").read_text())
    assert reports["trained"]["exact_matches"] == 2 and reports["trained"]["block_size"] == 3
    assert "untrained" in reports and not (run / "calibration.json").exists()  # no confidence head to fit
