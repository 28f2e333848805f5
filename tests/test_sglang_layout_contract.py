"""Served acceptance through SGLang 0.5.23's own draft-input code (tests/sglang_layout.py lists
what runs from the release and what stands in).

The contract (served_rounds.check_served_layout): our `--format sglang` export, parsed by SGLang's
DSPARK config code, drafted from the block SGLang's DraftBlockProposer builds (its buffers, its
embedding, the verify window's positions) over the context SGLang's TargetHiddenKvInjector writes
(the prefill's positions, and each verify's committed rows) from the target layers SGLang's
capture code picks, with SGLang's own Markov head and sequential draft step, accepts every block
of the sequence the draft was overfit on: tau = γ+1, over a prefill and three verify rounds. The
same draft with the block one slot later (sample_from_anchor false: γ+1 rows, row 0 dropped) or
with each captured layer one earlier is refused by the same check.

Covered: every head SGLang 0.5.23 builds (models/dspark.py build_markov_head: vanilla, gated,
rnn) and markov_rank=0, served as a zero rank-1 vanilla head (SGLang refuses rank 0).
"""

import json

import pytest
import torch
from served_rounds import (GAMMA, TRAINED_LAYERS, VARIANTS, DraftCompute, check_served_layout, loud_target, overfit,
                           reference, residual_streams, served_draft)

from splitserve.export.sglang import export_sglang, launch_command

import sglang_layout  # noqa: E402  (after the splitserve imports: it reads the wheel lazily)

# integration tier, as tests/test_sglang_contract.py: the first run downloads the wheel
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]
HEADS = {"vanilla": "VanillaMarkov", "gated": "GatedMarkovHead", "rnn": "RNNHead", "rank0": "VanillaMarkov"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """variant -> (target, trained draft, export dir, printed command), each exported once."""
    done = {}

    def get(variant: str):
        if variant not in done:
            target, trained = loud_target(), overfit(variant)
            exp = export_sglang(trained, tmp_path_factory.mktemp(variant) / "sg", target.info.num_layers)
            done[variant] = target, trained, exp.out_dir, launch_command(exp, "/models/target")
        return done[variant]

    return get


def _engine(exported, variant: str, edit=None):
    """SGLang's engine over the export; `edit(config)` changes a copy of its config.json first."""
    target, trained, out, command = exported(variant)
    if edit is not None:
        edited = out.parent / "edited"
        edited.mkdir(exist_ok=True)
        (edited / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes())
        cfg = json.loads((out / "config.json").read_text())
        edit(cfg)
        (edited / "config.json").write_text(json.dumps(cfg))
        out = edited
    return sglang_layout.SglangEngine(out, command, DraftCompute(served_draft(out, trained, target)), target), trained


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sglang_builds_the_trained_block_and_accepts_all_of_it(exported, variant):
    engine, trained = _engine(exported, variant)
    proposer = engine.proposer
    assert (proposer.sample_from_anchor, proposer.query_token_num, engine.verify_width) == (True, GAMMA, GAMMA + 1)
    assert type(engine.model.markov_head).__name__ == HEADS[variant]  # SGLang's own head, our weights
    assert not engine.runner.causal  # full_attention layers: ENCODER_ONLY, as trained
    accepts = check_served_layout(engine)
    assert accepts == [GAMMA] * len(accepts)
    ref, mask = reference(), trained.arch.mask_token_id
    p = len(ref.prompt)  # the anchor's position = the committed length
    for step in engine.steps:  # what the proposer handed the draft: the prefill's block, then each verify's
        assert step["anchor"] == ref.tokens[p]
        assert step["input_ids"] == [ref.tokens[p]] + [mask] * (GAMMA - 1)  # anchor in slot 0, then masks
        assert step["positions"] == list(range(p, p + GAMMA))
        assert step["seq_len"] == p  # the block attends to the committed context 0 .. p-1
        assert step["verify_positions"] == list(range(p, p + GAMMA + 1))  # [anchor | γ drafts]
        p += GAMMA + 1


def test_sglang_captures_the_layers_the_draft_was_trained_on(exported):
    engine, _ = _engine(exported, "vanilla")
    assert engine.layer_ids == sorted(TRAINED_LAYERS)
    # set_dflash_layers_to_capture: a layer captures the stream entering it, so l is read at l + 1
    assert engine.capture.layers_to_capture == [l + 1 for l in sorted(TRAINED_LAYERS)]
    prompt = reference().prompt
    got = engine.capture(residual_streams(engine.target, prompt), torch.arange(len(prompt)))  # (T, m*D)
    ours = engine.target.capture(torch.tensor([prompt])).aux[0]  # (T, m*D), trained order
    d = engine.target.info.hidden_size
    by_layer = {l: ours[:, i * d : (i + 1) * d] for i, l in enumerate(TRAINED_LAYERS)}
    assert torch.equal(got, torch.cat([by_layer[l] for l in sorted(TRAINED_LAYERS)], dim=-1))


def test_sglang_drafts_from_the_accepted_prefix_after_a_rejection(exported):
    """A verify round that accepts one token of four: commit_hidden writes the anchor and that
    token as context (commit_lens 2 of the window's 5 rows), and the next block is anchored on the
    bonus token after them."""
    engine, _ = _engine(exported, "vanilla")
    ref = reference()
    p = len(ref.prompt)
    drafted = engine.first_block(ref.prompt, ref.tokens[p])
    wrong = [t + 1 for t in drafted[1:]]
    drafted = engine.next_block([ref.tokens[p], drafted[0]] + wrong, 1, ref.tokens[p + 2])
    written = sorted(pos for pos, _ in engine.model.kv.slots.values())
    assert written == list(range(p + 2))  # the rejected rows p+2 .. p+4 were not injected
    step = engine.steps[-1]
    assert (step["anchor"], step["positions"][0], step["seq_len"]) == (ref.tokens[p + 2], p + 2, p + 2)
    assert drafted == ref.tokens[p + 3 : p + 3 + GAMMA]


def test_sglang_block_one_slot_late_is_caught(exported):
    """sample_from_anchor false: SGLang runs γ+1 rows [anchor, masks] and keeps rows 1..γ
    (select_draft_hidden_without_anchor), so slot k's prediction lands one token late."""
    engine, _ = _engine(exported, "vanilla", edit=lambda cfg: cfg.update(sample_from_anchor=False))
    assert engine.proposer.query_token_num == GAMMA + 1
    with pytest.raises(AssertionError, match=r"served tau \d\.\d\d, not gamma\+1 = 5") as err:
        check_served_layout(engine)
    print(err.value)


def test_sglang_captured_layer_one_off_is_caught(exported):
    """Target layer ids one lower than trained: SGLang captures each layer one earlier."""
    def shift(cfg):
        ids = [l - 1 for l in cfg["target_layer_ids"]]
        cfg["target_layer_ids"] = cfg["dflash_config"]["target_layer_ids"] = ids

    engine, _ = _engine(exported, "vanilla", edit=shift)
    assert engine.layer_ids == [l - 1 for l in sorted(TRAINED_LAYERS)]
    with pytest.raises(AssertionError, match=r"served tau \d\.\d\d, not gamma\+1 = 5") as err:
        check_served_layout(engine)
    print(err.value)
