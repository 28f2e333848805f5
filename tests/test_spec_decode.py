"""Speculative decoding is lossless: greedy output equals the target's own, and T=1 sampling
follows the target distribution. Tiny random models, so any draft quality is exercised."""

import pytest
import torch
from tiny import check_draft_ties, tiny_draft, tiny_target

from splitserve.config import LossConfig
from splitserve.evaluation.evaluate import acceptance_stats, evaluate
from splitserve.records import HiddenRecord
from splitserve.speculative.decode import SpecDecoder, target_decode
from splitserve.train.step import collate, draft_loss


@pytest.mark.parametrize("block_size", [1, 4, 8, 16])
@pytest.mark.parametrize("markov", [(0, "vanilla"), (8, "vanilla"), (8, "gated"), (8, "rnn")])
def test_greedy_equals_target_greedy(block_size, markov):
    target = tiny_target(seed=block_size)
    draft = tiny_draft(target, block_size=block_size, markov_rank=markov[0], markov_head_type=markov[1])
    if draft.markov is not None:  # a non-zero Markov bias, so the sequential stage matters
        torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    g = torch.Generator().manual_seed(0)
    dec = SpecDecoder(target, draft)
    for _ in range(4):
        prompt = torch.randint(0, 90, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        res = dec.generate(prompt, 30)
        assert res.tokens == target_decode(target, prompt, 30)
        # the prefill yields one token, then each round commits n accepted + 1 bonus
        assert len(res.tokens) == 30 and 1 + sum(n + 1 for n in res.accepts) >= 30


def test_greedy_stops_at_eos_like_target():
    target = tiny_target(seed=3)
    draft = tiny_draft(target, block_size=4)
    prompt = [5, 6, 7]
    ref = target_decode(target, prompt, 40)
    eos = {ref[7]}
    expected = target_decode(target, prompt, 40, eos_ids=eos)
    assert expected[-1] in eos and len(expected) <= 8
    assert SpecDecoder(target, draft).generate(prompt, 40, eos_ids=eos).tokens == expected


def test_sampling_matches_target_distribution():
    """Exact marginals of the first two sampled tokens vs speculative samples (V=16)."""
    target = tiny_target(seed=5, vocab=16)
    with torch.no_grad():
        target.model.lm_head.weight.mul_(0.1)  # soften: many tokens get real probability
    draft = tiny_draft(target, block_size=3, markov_rank=4)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    prompt = [1, 2, 3]
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt])).logits[0, -1]
        p1 = torch.softmax(logits, -1)  # (V,)
        nxt = torch.cat([torch.tensor([prompt]).expand(16, 3), torch.arange(16)[:, None]], 1)
        p2_given = torch.softmax(target.model(nxt).logits[:, -1], -1)  # (V, V)
        p2 = p1 @ p2_given
    dec = SpecDecoder(target, draft)
    gen = torch.Generator().manual_seed(0)
    n = 3000
    first, second = torch.zeros(16), torch.zeros(16)
    for _ in range(n):
        toks = dec.generate(prompt, 2, temperature=1.0, generator=gen).tokens
        first[toks[0]] += 1
        second[toks[1]] += 1
    # 3000 samples: a frequency's std is at most ~0.009; 0.035 is ~4 sigma.
    assert (first / n - p1).abs().max() < 0.035
    assert (second / n - p2).abs().max() < 0.035


def test_acceptance_stats():
    tau, per_pos = acceptance_stats([0, 2, 4, 4], gamma=4)
    assert tau == pytest.approx((1 + 3 + 5 + 5) / 4)
    # P(n>=1)=3/4; P(n>=2 | n>=1)=3/3; P(n>=3 | n>=2)=2/3; P(n>=4 | n>=3)=2/2
    assert per_pos == pytest.approx([0.75, 1.0, 2 / 3, 1.0])


def test_overfit_one_sequence_reaches_gamma_plus_one():
    """A draft trained on one target-generated sequence accepts every block on it."""
    torch.manual_seed(0)
    target = tiny_target(seed=7)
    gamma = 4
    draft = tiny_draft(target, block_size=gamma, markov_rank=8, layers=2)
    prompt = [11, 12, 13, 14, 15, 16, 17, 18]
    cont = target_decode(target, prompt, 48)
    ids = torch.tensor(prompt + cont)
    loss_mask = torch.zeros(len(ids), dtype=torch.bool)
    loss_mask[len(prompt) :] = True
    cap = target.capture(ids[None])
    rec = HiddenRecord(0, ids, loss_mask, cap.aux[0], cap.final[0])
    batch = collate([rec], torch.device("cpu"), torch.float32)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    cfg = LossConfig(ce_weight=1.0)
    for step in range(300):
        out, _ = draft_loss(draft, batch, 64, cfg, torch.Generator().manual_seed(step))
        opt.zero_grad()
        out.total.backward()
        opt.step()
    draft.eval()
    # Keep every round's block inside the trained sequence: 8 + 7 rounds * 5 + 4 <= 55.
    report = evaluate(target, draft, [prompt], max_new_tokens=36)
    assert report.exact_matches == 1
    assert report.tau == gamma + 1, report.results[0].accepts  # every round full: τ = 5n / n, exact


@pytest.mark.parametrize("check_exact,engine", [(True, False), (False, False), (True, True)])
def test_evaluate_run_counts_exact_replies_only_when_asked(tiny_smol_dir, tmp_path, check_exact, engine):
    import json
    from pathlib import Path

    from splitserve.config import DataConfig, EvalConfig, RunConfig, TargetConfig
    from splitserve.evaluation.heldout import evaluate_run
    from splitserve.target.hf import load_hf_target

    target = load_hf_target(TargetConfig(name="tiny-smol", path=str(tiny_smol_dir), layer_ids=[0, 1, 2], device="cpu"))
    torch.manual_seed(0)
    draft = tiny_draft(target, block_size=4, markov_rank=4)
    prompts = Path(__file__).resolve().parents[1] / "data" / "sample_prompts.jsonl"
    cfg = RunConfig(data=DataConfig(heldout_prompts=str(prompts)),
                    eval=EvalConfig(num_prompts=2, max_new_tokens=6, compare_untrained=False, check_exact=check_exact,
                                    engine=engine),
                    run_dir=str(tmp_path))
    evaluate_run(cfg, target, draft)
    trained = json.loads((tmp_path / "eval.json").read_text())["trained"]
    assert trained["exact_matches"] == (2 if check_exact else None)
    assert [r["exact"] for r in trained["results"]] == ([True, True] if check_exact else [None, None])
    assert json.loads((tmp_path / "calibration.json").read_text())["fits"][0]["rounds"] == trained["rounds"]


def test_engine_evaluation_equals_the_reference_loop():
    """EvalConfig.engine: greedy through the serving engine gives the reference loop's tokens,
    rounds and recorded confidences (the STS data); at T=1 it records one confidence row per round."""
    target = tiny_target(seed=7)
    draft = tiny_draft(target, block_size=4, markov_rank=8)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    # The engine drafts from its static context (another layout and mask: the floats differ by
    # ulps), so equal accepts need draft rounds without near ties.
    check_draft_ties(draft)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 90, (n,), generator=g).tolist() for n in (3, 9, 5)]
    eos = {target_decode(target, prompts[2], 20)[6]}  # the third prompt stops early
    ref = evaluate(target, draft, prompts, 20, eos_ids=eos, record_confidence=True)
    eng = evaluate(target, draft, prompts, 20, eos_ids=eos, record_confidence=True, engine=True)
    assert eng.exact_matches == ref.exact_matches == 3
    # bit-equal: the same function of the same integer accepts
    assert (eng.tau, eng.rounds, eng.per_position) == (ref.tau, ref.rounds, ref.per_position)
    for a, b in zip(ref.results, eng.results):
        assert (a.tokens, a.accepts) == (b.tokens, b.accepts)
        assert torch.allclose(torch.tensor(a.confidences), torch.tensor(b.confidences), atol=1e-5)
    sampled = evaluate(target, draft, prompts, 20, temperature=1.0, record_confidence=True, engine=True)
    assert sampled.exact_matches is None
    for r in sampled.results:
        assert len(r.tokens) == 20 and len(r.confidences) == len(r.accepts) and len(r.confidences[0]) == 4
