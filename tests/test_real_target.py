"""The real embedded target (SmolLM2-135M-Instruct) on real held-out chitchat prompts.

A briefly trained draft (so rounds accept some tokens and reject others) must reproduce the
target's greedy output token for token on 20 prompts, through the reference loop and through the
serving engine (whose target forward is the native decoder).
"""

import pytest
import torch

from splitserve.config import DraftConfig, LossConfig, TargetConfig
from splitserve.data import load_samples, resolve_train_path
from splitserve.evaluation.evaluate import evaluate
from splitserve.evaluation.heldout import load_prompt_ids
from splitserve.models.build import build_draft, resolve_arch
from splitserve.stream.sources import TargetSource
from splitserve.target.eos import eos_ids
from splitserve.target.hf import load_hf_target
from splitserve.target.native.target import NativeTarget, native_target
from splitserve.train.step import collate, draft_loss


@pytest.fixture(scope="module")
def smollm2():
    return load_hf_target(TargetConfig(device="cpu"))


@pytest.fixture(scope="module")
def trained_draft(smollm2):
    """A one-layer draft after 12 steps on real chitchat: enough that it proposes tokens the
    target accepts and rejects, so both branches of every round run."""
    target = smollm2
    assert target.info.num_layers == 30 and target.info.vocab_size == 49152
    torch.manual_seed(0)
    arch = resolve_arch(DraftConfig(num_layers=1, block_size=8), target.info, target.model.config, target.tokenizer)
    draft = build_draft(arch, target)
    samples, _ = load_samples(resolve_train_path("chitchat"), target.tokenizer, 128, limit=48)
    source = TargetSource(target, samples)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-3)
    for step in range(12):
        batch = collate(source.get(list(range(4 * step, 4 * step + 4))), target.device, torch.float32)
        out, _ = draft_loss(draft, batch, 16, LossConfig(ce_weight=1.0), torch.Generator().manual_seed(step))
        opt.zero_grad()
        out.total.backward()
        opt.step()
    return draft.eval()


# 20 held-out prompts in four groups of five, so a slow machine shows progress between them
@pytest.mark.parametrize("engine", [False, True], ids=["reference", "engine"])
@pytest.mark.parametrize("group", range(4))
def test_greedy_exact_on_20_real_prompts(smollm2, trained_draft, group, engine):
    """Greedy speculative output equals transformers' `generate` on real prompts, through the
    reference loop and through the serving engine (whose static steps run the native decoder,
    target/native/)."""
    target = smollm2
    if engine:
        assert isinstance(native_target(target), NativeTarget)
    prompts = load_prompt_ids("chitchat", target.tokenizer, 20)[5 * group: 5 * group + 5]
    report = evaluate(target, trained_draft, prompts, max_new_tokens=24, eos_ids=eos_ids(target), engine=engine)
    assert report.num_prompts == 5
    bad = [5 * group + i for i, r in enumerate(report.results) if not r.exact]
    assert report.exact_matches == 5, f"prompts {bad} diverged from target greedy"
