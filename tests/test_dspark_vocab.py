"""draft.draft_vocab_size for DSpark: a head over the N most frequent trained tokens, mapped back
to target ids (models/vocab_map.py, shared with EAGLE-3). Drafting maps ids and spreads the
distributions back over the target's vocabulary, the losses read the target's mass off the N
tokens, training fits the map and checkpoints keep it, and exports for engines without a map
write the head expanded: equal to the reduced logits on the N tokens."""

import json

import pytest
import torch
from floats import assert_float32_close
from marginals import sample_two_tokens, two_token_marginals
from tiny import random_samples, tiny_draft, tiny_target

import splitserve.train.loop as loop
from splitserve.config import EngineConfig, compose
from splitserve.errors import UserError
from splitserve.loading import load_draft, read_draft_meta
from splitserve.models.dspark_vocab import expand_vocab
from splitserve.models.vocab_map import VocabMap
from splitserve.speculative.decode import SpecDecoder, target_decode
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.stream.sources import TargetSource
from splitserve.train.losses import row_terms

pytestmark = pytest.mark.usefixtures("one_thread")
N = 40


def _reduced(target, used=None, head="vanilla", rank=8, gamma=4, seed=0):
    torch.manual_seed(seed)
    draft = tiny_draft(target, block_size=gamma, markov_rank=rank, markov_head_type=head, draft_vocab_size=N).eval()
    for p in draft.parameters():  # every trained weight non-trivial, W2 and the norms included
        if p.requires_grad:
            torch.nn.init.normal_(p, mean=0.1 if p.dim() == 1 else 0.0, std=0.3)
    if used is None:
        used = torch.randperm(target.info.vocab_size, generator=torch.Generator().manual_seed(seed))[:N]
    draft.set_vocab(VocabMap.from_ids(torch.as_tensor(used), target.info.vocab_size))
    return draft


def _block(target, draft, ids, at: int):
    """Teacher-forced block at position `at` of ids (1, T) -> (h (γ, D), prev ids (γ,), context K/V)."""
    g = draft.arch.block_size
    with torch.no_grad():
        ctx = draft.context_kv(target.capture(ids).aux[:, :at], torch.arange(at)[None])
        h = draft.backbone(draft.block_inputs(ids[:, at]), torch.arange(at, at + g)[None], ctx, None)[0]
    return h, ids[0, at: at + g], ctx


def test_the_arch_resolves_reduced_only_below_the_target_vocabulary():
    target = tiny_target(seed=1)
    v = target.info.vocab_size
    assert tiny_draft(target, draft_vocab_size=N).arch.reduced
    for size in (0, v, v + 10):  # 0 and anything not below V: the whole vocabulary, nothing mapped
        draft = tiny_draft(target, draft_vocab_size=size)
        assert not draft.arch.reduced and draft.lm_head.weight.shape[0] == v and draft.vocab is None
    with pytest.raises(UserError, match="draft.draft_vocab_size=-1"):
        tiny_draft(target, draft_vocab_size=-1)


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_the_head_is_the_targets_rows_and_the_expansion_equals_it_on_its_tokens(head):
    """The reduced lm_head is the target's rows of the N tokens; the expanded whole-vocabulary draft
    (what vLLM and SGLang are given) gives the reduced logits and confidences at those N target
    ids, for previous tokens inside and outside the vocabulary."""
    target = tiny_target(seed=2)
    draft = _reduced(target, head=head)
    used = draft.vocab.used
    assert torch.equal(draft.lm_head.weight, target.lm_head_weight()[used])
    full = expand_vocab(draft).eval()
    assert not full.arch.reduced and full.lm_head.weight.shape[0] == target.info.vocab_size
    ids = torch.randint(0, 95, (1, 24), generator=torch.Generator().manual_seed(3))
    outside = [t for t in range(95) if not draft.vocab.t2d[t]]
    ids[0, 13:15] = torch.tensor(outside[:2])  # previous tokens the reduced W1 reads through its shared row
    h, prev, _ = _block(target, draft, ids, 12)
    with torch.no_grad():
        reduced, expanded = draft.logits(h, prev), full.logits(h, prev)
        assert reduced.shape == (4, N)
        assert_float32_close(expanded[:, used], reduced)
        assert_float32_close(full.confidence_logit(h, prev), draft.confidence_logit(h, prev))


def test_a_round_drafts_target_ids_from_the_reduced_logits():
    """Greedy: the round's tokens are the target ids of the teacher-forced argmaxes, whichever
    Markov path runs (loop, one-launch kernel reference, top-K candidates); T=1: the distributions
    are (γ, V), zero off the vocabulary, the reduced softmax at the N ids."""
    target = tiny_target(seed=4)
    draft = _reduced(target, seed=1)
    ids = torch.randint(0, 95, (1, 20), generator=torch.Generator().manual_seed(5))
    _, _, ctx = _block(target, draft, ids, 12)
    anchor = ids[0, 12]
    runs = [draft.draft(ctx, anchor, 12, markov_kernel=k, markov_topk=t) for k, t in ((False, 0), (True, 0), (True, 8))]
    tokens = runs[0][0]
    assert all(torch.equal(r[0], tokens) for r in runs)
    assert bool(draft.vocab.t2d[tokens].all())
    with torch.no_grad():
        h = draft.backbone(draft.block_inputs(anchor.view(1)), torch.arange(12, 16)[None], ctx, None)[0]
        logits = draft.logits(h, torch.cat([anchor.view(1), tokens[:-1]]))  # (γ, N)
    assert torch.equal(draft.vocab.used[logits.argmax(-1)], tokens)
    sampled, probs, conf = draft.draft(ctx, anchor, 12, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert probs.shape == (4, target.info.vocab_size) and conf.shape == (4,)
    assert float(probs[:, ~draft.vocab.t2d].abs().sum()) == 0.0
    assert_float32_close(probs.sum(-1), torch.ones(4))
    with torch.no_grad():
        logits = draft.logits(h, torch.cat([anchor.view(1), sampled[:-1]]))
    assert_float32_close(probs[:, draft.vocab.used], torch.softmax(logits, -1))


def test_row_terms_on_a_reduced_vocabulary_equal_the_whole_vocabulary_terms():
    """(P, N) draft logits against (P, V) target logits: tv and the greedy mass equal the terms of
    the same draft written over V with -inf off its tokens; ce equals them where x* is a draft
    token and is 0 where it is not."""
    g = torch.Generator().manual_seed(0)
    v, p = 96, 64
    vocab = VocabMap.from_ids(torch.randperm(v, generator=g)[:N], v)
    draft = torch.randn(p, N, generator=g, dtype=torch.float64) * 2
    target = torch.randn(p, v, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, v, (p,), generator=g)
    wide = torch.full((p, v), float("-inf"), dtype=torch.float64).index_copy(1, vocab.used, draft)
    got, want = row_terms(draft, target, labels, True, vocab), row_terms(wide, target, labels, True)
    inside = vocab.t2d[labels]
    assert 0 < int(inside.sum()) < p and bool((vocab.t2d[target.argmax(-1)]).any())
    torch.testing.assert_close(got.tv, want.tv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.mass, want.mass, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.ce[inside], want.ce[inside], rtol=1e-12, atol=1e-12)
    assert bool((got.ce[~inside] == 0).all()) and bool(torch.isinf(want.ce[~inside]).all())
    assert bool((got.tv > want.tv.new_tensor(0)).all())


def _bigram_draft(target, prompts, steps: int, gamma: int = 4):
    """A reduced draft that drafts the target's own greedy bigrams: its vocabulary the tokens the
    target's greedy continuations use, less the most common one (so rounds meet tokens it cannot
    propose), and its Markov head (rank N+1, one-hot W1) a table next = succ(prev) learned from
    those continuations; the backbone's logits are zeroed. Drafting through it only works when
    every id is mapped right."""
    seqs = [target_decode(target, p, steps) for p in prompts]
    counts = torch.bincount(torch.tensor([t for s in seqs for t in s]), minlength=target.info.vocab_size)
    common = int(counts.argmax())
    seen = [t for t in (counts > 0).nonzero().flatten().tolist() if t != common][:N]
    pad = [t for t in range(target.info.vocab_size) if t not in seen and t != common]
    used = torch.tensor(sorted(seen + pad[: N - len(seen)]))
    draft = tiny_draft(target, block_size=gamma, markov_rank=N + 1, draft_vocab_size=N).eval()
    draft.set_vocab(VocabMap.from_ids(used, target.info.vocab_size))
    with torch.no_grad():
        draft.lm_head.weight.zero_()  # U = 0: the Markov table alone picks the tokens
        draft.markov.w1.weight.copy_(torch.eye(N + 1))
        w2 = torch.zeros(N, N + 1)
        for p, s in zip(prompts, seqs):
            full = p + s
            for a, b in zip(full[:-1], full[1:]):
                if draft.vocab.t2d[b]:
                    w2[draft.head_ids(torch.tensor(b)), draft.head_ids(torch.tensor(a))] = 10.0
        draft.markov.w2.weight.copy_(w2)
    return draft, common


@pytest.mark.parametrize("attention", ["kernel", "sdpa"])
def test_greedy_output_is_the_targets_own_and_the_engine_drafts_as_the_loop(attention):
    target = tiny_target(seed=3)
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [7, 7, 2], [50, 8, 61, 3, 3, 90, 12, 5, 33, 21]]
    draft, common = _bigram_draft(target, prompts, 30)
    engine = Engine(target, draft, EngineConfig(max_context=64, min_window=8, draft_attention=attention))
    accepts, outside = [], 0
    for prompt in prompts:
        ref = target_decode(target, prompt, 30)
        loop_out = SpecDecoder(target, draft).generate(prompt, 30)
        served = engine.generate(prompt, SamplingParams(max_tokens=30))
        assert served.tokens == loop_out.tokens == ref
        assert served.accepts == loop_out.accepts, (prompt, served.accepts, loop_out.accepts)
        accepts += served.accepts
        outside += ref.count(common)
    assert max(accepts) == 4 and outside > 0  # whole blocks accepted, and tokens the draft cannot propose


def test_sampling_matches_target_distribution():
    """T=1: exact marginals of the two tokens after a fixed anchor vs engine samples (V=16, as
    test_serve_engine's); the draft proposes from 12 of the 16 ids, the target's two likeliest
    next tokens left out, so those come only from the residual."""
    target = tiny_target(seed=5, vocab=16, layers=3, layer_ids=(0, 1))
    with torch.no_grad():
        target.model.lm_head.weight.mul_(0.1)
    prompt, anchor = [1, 2, 3], 7
    p1, p2 = two_token_marginals(target, prompt + [anchor])
    left_out = p1.topk(2).indices.tolist()
    torch.manual_seed(0)
    draft = tiny_draft(target, block_size=3, markov_rank=4, draft_vocab_size=12)
    draft.set_vocab(VocabMap.from_ids(torch.tensor([i for i in range(16) if i not in left_out][:12]), 16))
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    engine = Engine(target, draft, EngineConfig(max_context=16, seed=0))
    engine._prefill(prompt, 1.0)
    n = 1500
    first, second, accepted = sample_two_tokens(engine, len(prompt), anchor, n)
    # 1500 samples: a frequency's std is at most ~0.013; 0.05 is ~4 sigma.
    assert (first / n - p1).abs().max() < 0.05
    assert (second / n - p2).abs().max() < 0.05
    assert p1[left_out].sum() > 0.1 and first[left_out].sum() > 0  # never proposed: the residual gives them
    assert max(accepted) >= 2


def test_training_fits_the_vocabulary_and_the_run_loads_it_back(tmp_path, capsys):
    """draft.draft_vocab_size=N through the one pipeline: the map is the data's most frequent
    trained tokens, the loss falls, the run's checkpoint keeps the map, and loading re-selects the
    lm_head's rows from the target by it."""
    target = tiny_target(seed=5)
    g = torch.Generator().manual_seed(1)
    skew = torch.randint(0, 30, (8, 30), generator=g)  # the data's tokens: mostly ids below 30
    samples = random_samples([30] * 8, target.info.vocab_size, seed=1)
    for s, row in zip(samples, skew):
        s.input_ids[:20] = row[:20].tolist()
    cfg = compose(["target.name=tiny-llama", "target.layer_ids=[1,2,4]", "draft.num_layers=1",
                   "draft.intermediate_size=48", "draft.block_size=4", "draft.markov_rank=8",
                   f"draft.draft_vocab_size={N}", "train.batch_size=4", "train.device=cpu", "train.log_every=1",
                   "train.save_every=6", "train.max_steps=6", "train.lr=6e-3", "train.warmup_steps=1",
                   "eval.enabled=false", f"run_dir={tmp_path / 'run'}"])
    result = loop.train(cfg, target, source=TargetSource(target, samples))
    assert f"draft vocabulary: {N} of the target's 96 tokens" in capsys.readouterr().out
    counts = torch.bincount(torch.tensor([t for s in samples for t in s.input_ids]), minlength=96)
    used = result.draft.vocab.used.cpu()
    assert set(range(30)) <= set(used.tolist())  # every frequent id is in the map
    assert counts[used].min() >= counts[~result.draft.vocab.t2d.cpu()].max()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"]
    loaded = load_draft(read_draft_meta(tmp_path / "run"), target)
    assert loaded.arch.reduced and torch.equal(loaded.vocab.used, used)
    assert torch.equal(loaded.lm_head.weight, target.lm_head_weight()[used])
    assert torch.equal(loaded.markov.w2.weight, result.draft.markov.w2.weight)


def test_our_own_export_keeps_the_reduced_head_and_loads_back(tmp_path):
    """--format hf (splitserve's own) keeps the map: the export loads back as the reduced draft."""
    from splitserve.export import export_draft

    target = tiny_target(seed=2)
    draft = _reduced(target, seed=4)
    export_draft(draft, tmp_path / "hf", target.info)
    loaded = load_draft(tmp_path / "hf", target)
    assert loaded.arch == draft.arch and torch.equal(loaded.vocab.used, draft.vocab.used)
    for k, v in draft.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v, rtol=0, atol=0, msg=k)
    assert torch.equal(loaded.head_index, draft.head_index)
