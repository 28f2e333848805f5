"""Served acceptance through vLLM 0.33.0's own draft-input code (tests/vllm_layout.py lists what
runs from the release and what stands in).

The contract (served_rounds.check_served_layout): our `--format speculators` export, read by
vLLM's config code, drafted from the block vLLM's prepare-inputs kernel builds (run under Triton's
interpreter, with sample_from_anchor as vLLM derives it from our config.json) and from the target
layers vLLM's capture rule picks, accepts every block of the sequence the draft was overfit on:
tau = γ+1, over a prefill and three verify rounds. The same draft with the block one slot later
(an export that leaves sample_from_anchor to vLLM's default) or with each captured layer one
earlier (capture ids written without the +1) is refused by the same check.

Covered: the vanilla head and markov_rank=0 (served as a zero rank-1 vanilla head). vLLM 0.33's
Qwen3 DSpark model builds the vanilla head only (model_executor/models/qwen3_dspark.py
DSparkMarkovHead: markov_w1, markov_w2), so the export prints no vLLM command for a gated or rnn
draft (tests/test_export_speculators.py); those heads are covered on SGLang.
"""

import json

import pytest
import torch
from served_rounds import (GAMMA, TRAINED_LAYERS, DraftCompute, check_served_layout, loud_target, overfit, reference,
                           residual_streams, served_draft)

from splitserve.export.speculators import export_speculators, vllm_command

pytest.importorskip("triton", reason="triton is not installed (its interpreter runs vLLM's kernel on a CPU)")
import vllm_layout  # noqa: E402

# integration tier, as tests/test_sglang_contract.py: the first run downloads the wheel (336 MB)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("triton_numpy_fix", "one_thread")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """variant -> (target, trained draft, export dir, printed command), each exported once."""
    done = {}

    def get(variant: str):
        if variant not in done:
            target, trained = loud_target(), overfit(variant)
            exp = export_speculators(trained, tmp_path_factory.mktemp(variant) / "spec", "/models/target",
                                     ["LlamaForCausalLM"], target.info.hidden_size, 512)
            done[variant] = target, trained, exp.out_dir, vllm_command(exp, "/models/target")
        return done[variant]

    return get


def _engine(exported, variant: str, edit=None):
    """vLLM's engine over the export; `edit(config)` first changes its config.json in place."""
    target, trained, out, command = exported(variant)
    if edit is not None:
        cfg_path = out.parent / "edited" / "config.json"
        cfg_path.parent.mkdir(exist_ok=True)
        (cfg_path.parent / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes())
        cfg = json.loads((out / "config.json").read_text())
        edit(cfg)
        cfg_path.write_text(json.dumps(cfg))
        out = cfg_path.parent
    return vllm_layout.VllmEngine(out, command, DraftCompute(served_draft(out, trained, target)), target), trained


@pytest.mark.parametrize("variant", ["vanilla", "rank0"])
def test_vllm_builds_the_trained_block_and_accepts_all_of_it(exported, variant):
    engine, trained = _engine(exported, variant)
    spec, hf = engine.spec, engine.view.hf_config
    # the printed --speculative-config is what vLLM's own reading of config.json gives
    cfg = json.loads((exported(variant)[2] / "config.json").read_text())
    assert vllm_layout.release().speculators_config.extract_vllm_speculative_config(cfg) == {
        k: engine.view.speculative[k] for k in ("method", "num_speculative_tokens")}
    # update_dspark read our sample_from_anchor; DSparkSpeculator: γ query rows, every one a draft
    assert (hf.sample_from_anchor, hf.dspark_bonus_anchor) == (True, False)
    assert (spec.sample_from_anchor, spec.num_query_per_req, spec.num_speculative_steps) == (True, GAMMA, GAMMA)
    assert spec.parallel_drafting_token_id == trained.arch.mask_token_id
    assert spec.requires_non_causal  # the block attends to itself both ways, as trained
    accepts = check_served_layout(engine)
    assert accepts == [GAMMA] * len(accepts)
    ref, mask = reference(), trained.arch.mask_token_id
    p, ctx = len(ref.prompt), list(range(len(ref.prompt)))  # the anchor's position; the step's valid context rows
    for step in engine.steps:  # what _prepare_dflash_inputs_kernel wrote: the prefill, then each verify
        assert step["input_ids"] == [ref.tokens[p]] + [mask] * (GAMMA - 1)  # anchor in slot 0, then masks
        assert step["positions"] == list(range(p, p + GAMMA))
        assert step["sample_indices"] == list(range(GAMMA))  # every query row is sampled...
        assert step["sample_pos"] == list(range(p + 1, p + GAMMA + 1))  # ...as the token after it
        assert step["context_positions"] == ctx and step["seq_len"] == p + GAMMA
        ctx, p = list(range(p, p + GAMMA + 1)), p + GAMMA + 1


def test_vllm_captures_the_layers_the_draft_was_trained_on(exported):
    engine, trained = _engine(exported, "vanilla")
    # "before layer i" capture points: our layer l (HF hidden_states[l + 1]) is l + 1
    assert engine.view.aux_layers == tuple(sorted(l + 1 for l in TRAINED_LAYERS))
    prompt = reference().prompt
    got = engine.capture(residual_streams(engine.target, prompt), torch.arange(len(prompt)))
    ours = engine.target.capture(torch.tensor([prompt])).aux[0]  # (T, m*D), trained order
    d = engine.target.info.hidden_size
    by_layer = {l: ours[:, i * d : (i + 1) * d] for i, l in enumerate(TRAINED_LAYERS)}
    assert len(got) == len(TRAINED_LAYERS)
    for tensor, layer in zip(got, sorted(TRAINED_LAYERS)):  # concatenated in ascending layer order
        assert torch.equal(tensor, by_layer[layer]), layer


def test_vllm_drafts_from_the_accepted_prefix_after_a_rejection(exported):
    """A verify round that accepts one token of four: the kernel keeps the anchor and that token
    as context, drops the three rejected rows, and anchors the next block on the bonus token."""
    engine, trained = _engine(exported, "vanilla")
    ref = reference()
    p = len(ref.prompt)
    drafted = engine.first_block(ref.prompt, ref.tokens[p])
    wrong = [t + 1 for t in drafted[1:]]
    drafted = engine.next_block([ref.tokens[p], drafted[0]] + wrong, 1, ref.tokens[p + 2])
    step = engine.steps[-1]
    assert step["context_positions"] == [p, p + 1]
    assert step["input_ids"][0] == ref.tokens[p + 2] and step["positions"][0] == p + 2
    assert step["seq_len"] == p + 2 + GAMMA
    assert drafted == ref.tokens[p + 3 : p + 3 + GAMMA]


def test_vllm_block_one_slot_late_is_caught(exported):
    """An export that leaves sample_from_anchor out gets update_dspark's default, the 1+N block with
    the anchor as a bonus token: γ+1 query rows, rows 1..γ sampled, each as the token at its own
    position. Slot k's prediction then lands one token late, and the contract check refuses it."""
    engine, _ = _engine(exported, "vanilla", edit=lambda cfg: cfg.pop("sample_from_anchor"))
    assert engine.view.hf_config.dspark_bonus_anchor is True and engine.spec.num_query_per_req == GAMMA + 1
    with pytest.raises(AssertionError, match=r"served tau \d\.\d\d, not gamma\+1 = 5") as err:
        check_served_layout(engine)
    step = engine.steps[0]
    assert step["sample_indices"] == list(range(1, GAMMA + 1)) and step["sample_pos"] == step["positions"][1:]
    print(err.value)


def test_vllm_captured_layer_one_off_is_caught(exported):
    """Capture ids written as our layer ids (without the +1): vLLM captures each layer one earlier,
    the draft reads other hidden states, and the contract check refuses it."""
    ids = list(TRAINED_LAYERS)
    engine, _ = _engine(exported, "vanilla", edit=lambda cfg: cfg.update(aux_hidden_state_layer_ids=ids))
    assert engine.view.aux_layers == TRAINED_LAYERS
    with pytest.raises(AssertionError, match=r"served tau \d\.\d\d, not gamma\+1 = 5") as err:
        check_served_layout(engine)
    print(err.value)


def test_version_guard_reads_the_checked_release_as_honouring_sample_from_anchor():
    """export/engine_versions.py warns about a vLLM build whose config loader hard-codes the 1+N
    block; 0.33.0's derives it from our sample_from_anchor (the test above), and is not flagged."""
    from vllm_release import source

    from splitserve.export import engine_versions as ev

    loader = source(ev.VLLM_CONFIG_LOADER)
    assert not ev.bonus_anchor_hard_coded(loader) and ev.layout_warning("vllm", "0.33.0", loader) is None
    hard_coded = loader.replace('pre_trained_config["dspark_bonus_anchor"] = not sample_from_anchor',
                                'pre_trained_config["dspark_bonus_anchor"] = True')
    assert hard_coded != loader and ev.bonus_anchor_hard_coded(hard_coded)
    assert ev.layout_warning("vllm", "0.33.0", hard_coded).startswith("warning: vllm 0.33.0 would serve")
