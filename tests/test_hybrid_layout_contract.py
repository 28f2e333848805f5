"""The served-layout contract (tests/test_vllm_layout_contract.py, tests/test_sglang_layout_contract.py)
for hybrid targets: for each hybrid model class that splitserve/export/hybrid_serving.py says an
engine serves a DSpark draft for, that engine's own capture code for the class, compiled from its
wheel (tests/sglang_hybrid.py, tests/vllm_hybrid.py list what runs and what stands in), reads from
our export exactly the hidden states splitserve trains the draft on.

Per engine and class, over a tiny random target of the family (tests/arch_matrix.py's config at 96
tokens, served_rounds.loud_hybrid_target; a multimodal Qwen3.5 class over the text target its
language model wraps), captured layers HYBRID_LAYERS:
  - the layer ids the engine reads from our export are the trained ones (info.layer_ids);
  - the hook it calls and where the class then captures, in its own terms: SGLang's
    set_dflash_layers_to_capture adds 1 and captures the stream entering that layer (Qwen3-Next,
    Qwen3.5, Nemotron-H), its set_dspark_layers_to_capture keeps our ids and captures after the
    layer (Kimi-Linear, Ling 3.0); vLLM's capture point is our id + 1 in every class, set by
    SupportsEagle3's set_aux_hidden_state_layers or, on text-only Qwen3.5, the class's own;
  - over the reference sequence, the hidden states it hands the draft equal the trained capture
    (`target.capture(ids).aux`) bit for bit;
  - the export written one layer off makes the same code read other hidden states.
And the rounds, through the engine's whole draft-input path (tests/vllm_layout.py,
tests/sglang_layout.py) with that class's capture: a draft overfit on the reference sequence over
the family's hidden states accepts every block (tau = gamma+1, served_rounds.check_served_layout),
and the same draft with its export written one layer off is refused by the same check.

Classes an engine does not serve (Ling 2.5, Falcon-H1, Granite-4.0-H; Ling 3.0 on vLLM): that they
lack the capture hook is checked over every row of the table by tests/test_hybrid_serving.py
(test_table_matches_sglang_release, test_table_matches_vllm_release).
"""

import functools
import json
import shutil

import pytest
import torch
from served_rounds import (GAMMA, HYBRID_LAYERS, ROUNDS, DraftCompute, check_served_layout, loud_hybrid_target,
                           overfit, reference, residual_streams, served_draft)
from transformers import AutoConfig

from splitserve.export.hybrid_serving import TABLE
from splitserve.export.sglang import export_sglang, launch_command
from splitserve.export.speculators import export_speculators, vllm_command

pytest.importorskip("triton", reason="triton is not installed (its interpreter runs vLLM's kernel on a CPU)")
import sglang_hybrid  # noqa: E402
import sglang_layout  # noqa: E402
import vllm_hybrid  # noqa: E402
import vllm_layout  # noqa: E402

# integration tier: reads both wheels, downloaded once (tests/conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("triton_numpy_fix", "one_thread")]
# hybrid_serving's model_type -> tests/arch_matrix.py's tiny target of that family
ARCH = {"qwen3_next": "qwen3-next", "qwen3_5": "qwen3.5", "qwen3_5_moe": "qwen3.5-moe", "qwen3_5_text": "qwen3.5",
        "qwen3_5_moe_text": "qwen3.5-moe", "kimi_linear": "kimi-linear", "bailing_hybrid": "ling",
        "nemotron_h": "nemotron-h"}
# SGLang: model_type -> (the hook configure_aux_hidden_state_capture calls, what the class adds to our
# ids); every other served class: DFLASH_HOOK
DSPARK_HOOK, DFLASH_HOOK = ("set_dspark_layers_to_capture", 0), ("set_dflash_layers_to_capture", 1)
SGLANG_HOOK = {"kimi_linear": DSPARK_HOOK, "bailing_hybrid": DSPARK_HOOK}
# vLLM: model_type -> the class whose set_aux_hidden_state_layers runs; every other: SupportsEagle3's
VLLM_HOOK = {"qwen3_5_text": "Qwen3_5ForCausalLMBase", "qwen3_5_moe_text": "Qwen3_5ForCausalLMBase"}
TARGET = "/models/target"


def served(fmt: str) -> list[tuple[str, str]]:
    """(model_type, engine's model class) of every hybrid row (one with the SSM-state flag) the
    format's engine serves."""
    return [(row.model_type, row.engine(fmt).model_class) for row in TABLE.values()
            if row.engine(fmt).serves and row.engine(fmt).flags]


SGLANG, VLLM = served("sglang"), served("speculators")
by_class = functools.partial(pytest.mark.parametrize, "model_type,model_class")


def _edited(out, edit):
    """A copy of an export dir whose config.json `edit(config)` changed."""
    if edit is None:
        return out
    copy = out.parent / (out.name + "-edited")
    shutil.copytree(out, copy, dirs_exist_ok=True)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg)
    (copy / "config.json").write_text(json.dumps(cfg))
    return copy


def _one_lower(cfg):
    """SGLang's fault: target_layer_ids one lower than trained."""
    ids = [l - 1 for l in cfg["target_layer_ids"]]
    cfg["target_layer_ids"] = cfg["dflash_config"]["target_layer_ids"] = ids


def _without_plus_one(cfg):
    """vLLM's fault: capture points written as our layer ids (no +1)."""
    cfg["aux_hidden_state_layer_ids"] = list(HYBRID_LAYERS)


@functools.lru_cache(maxsize=None)
def _captured(arch: str):
    """(target, trained capture over the reference (T, m*D), streams over it) of a family."""
    target, ids = loud_hybrid_target(arch), reference().tokens
    return target, target.capture(torch.tensor([ids])).aux[0], residual_streams(target, ids)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(fmt, arch) -> (target, draft overfit on its hidden states, export dir, printed
    command), each exported once."""
    done = {}

    def get(fmt: str, arch: str):
        if (fmt, arch) not in done:
            target, trained = loud_hybrid_target(arch), overfit("vanilla", arch)
            out = tmp_path_factory.mktemp(f"{fmt}-{arch}") / "export"
            if fmt == "sglang":
                exp = export_sglang(trained, out, target.info.num_layers, target_config=target.config)
                done[fmt, arch] = target, trained, exp.out_dir, launch_command(exp, TARGET)
            else:
                exp = export_speculators(trained, out, TARGET, [type(target.model).__name__],
                                         target.info.hidden_size, 512, target_config=target.config)
                done[fmt, arch] = target, trained, exp.out_dir, vllm_command(exp, TARGET)
        return done[fmt, arch]

    return get


def test_every_served_hybrid_class_has_its_capture_run():
    assert {cls for _, cls in SGLANG} == set(sglang_hybrid.INNER)
    assert {cls for _, cls in VLLM} == set(vllm_hybrid.INNER)
    assert {t for t, _ in SGLANG + VLLM} == set(ARCH)


@by_class(SGLANG, ids=[c.split(":")[1] for _, c in SGLANG])
def test_sglang_hybrid_class_captures_the_trained_layers(exported, model_type, model_class):
    arch = ARCH[model_type]
    target, ours, streams = _captured(arch)
    n, positions = target.info.num_layers, torch.arange(len(reference().tokens))
    _, _, out, _ = exported("sglang", arch)
    layer_ids = sglang_layout.capture_layer_ids(out, AutoConfig.from_pretrained(out), n, target.config.model_type)
    assert layer_ids == sorted(target.info.layer_ids) == list(HYBRID_LAYERS)
    capture = sglang_hybrid.target_capture(model_class, n, layer_ids)
    hook, plus = SGLANG_HOOK.get(model_type, DFLASH_HOOK)
    assert (capture.hook, capture.points) == (hook, [l + plus for l in layer_ids])
    assert torch.equal(capture(streams, positions), ours)  # (T, m*D), the trained order
    wrong = _edited(out, _one_lower)
    wrong_ids = sglang_layout.capture_layer_ids(wrong, AutoConfig.from_pretrained(wrong), n, target.config.model_type)
    assert wrong_ids == [l - 1 for l in layer_ids]
    assert not torch.equal(sglang_hybrid.target_capture(model_class, n, wrong_ids)(streams, positions), ours)


@by_class(VLLM, ids=[c.split(":")[1] for _, c in VLLM])
def test_vllm_hybrid_class_captures_the_trained_layers(exported, model_type, model_class):
    arch = ARCH[model_type]
    target, ours, streams = _captured(arch)
    n, positions = target.info.num_layers, torch.arange(len(reference().tokens))
    _, _, out, command = exported("speculators", arch)
    view = vllm_layout.read_export(out, command)
    assert view.hf_config.target_layer_ids == sorted(target.info.layer_ids) == list(HYBRID_LAYERS)
    capture = vllm_hybrid.target_capture(model_class, n, view.hf_config)
    assert capture.hook.endswith(":" + VLLM_HOOK.get(model_type, "SupportsEagle3"))
    assert capture.points == view.aux_layers == tuple(l + 1 for l in HYBRID_LAYERS)  # "after layer k-1" points
    got = capture(streams, positions)  # a list of (T, D), ascending
    assert len(got) == len(HYBRID_LAYERS) and torch.equal(torch.cat(got, dim=-1), ours)
    wrong = vllm_layout.read_export(_edited(out, _without_plus_one), command)
    assert wrong.aux_layers == HYBRID_LAYERS
    assert not torch.equal(torch.cat(vllm_hybrid.target_capture(model_class, n, wrong.hf_config)(streams, positions),
                                     dim=-1), ours)


@by_class(SGLANG, ids=[c.split(":")[1] for _, c in SGLANG])
def test_sglang_rounds_accept_every_block_unless_a_layer_is_off(exported, model_type, model_class):
    target, trained, out, command = exported("sglang", ARCH[model_type])

    def engine(edit=None):
        edited = _edited(out, edit)
        return sglang_layout.SglangEngine(edited, command, DraftCompute(served_draft(edited, trained, target)), target,
                                          capture=functools.partial(sglang_hybrid.target_capture, model_class))

    assert check_served_layout(engine()) == [GAMMA] * ROUNDS
    with pytest.raises(AssertionError, match=r"served tau \d\.\d\d, not gamma\+1 = 5") as err:
        check_served_layout(engine(_one_lower))
    print(model_class, err.value)


@by_class(VLLM, ids=[c.split(":")[1] for _, c in VLLM])
def test_vllm_rounds_accept_every_block_unless_a_layer_is_off(exported, model_type, model_class):
    target, trained, out, command = exported("speculators", ARCH[model_type])
    capture = lambda num_layers, view: vllm_hybrid.target_capture(model_class, num_layers, view.hf_config)  # noqa: E731

    def engine(edit=None):
        edited = _edited(out, edit)
        return vllm_layout.VllmEngine(edited, command, DraftCompute(served_draft(edited, trained, target)), target,
                                      capture=capture)

    assert check_served_layout(engine()) == [GAMMA] * ROUNDS
    with pytest.raises(AssertionError, match=r"served tau \d\.\d\d, not gamma\+1 = 5") as err:
        check_served_layout(engine(_without_plus_one))
    print(model_class, err.value)
