"""Our `--format sglang` export read by SGLang 0.5.23's own code, on a CPU, without importing sglang.

tests/sglang_release.py compiles the release's DSPARK config parsing (dspark_config.py over
dflash_utils.py) and its draft model classes (models/dspark.py over models/dflash.py) from the
wheel's source, with CPU stand-ins for the fused/parallel linears, norms and attention kernels.
The test then does what SGLang's draft worker does with a checkpoint: AutoConfig (as
hf_transformers get_config), parse and resolve the runtime config with the flags our launch
command passes, build Qwen3DSparkModel, and run its load_weights over model.safetensors. It asserts
every parameter is written with our tensor and every tensor in the file reaches a weight loader.
"""

import json

import pytest
import torch
from safetensors.torch import load_file
from sglang_release import RECORDER, dspark_release
from tiny import tiny_draft, tiny_target

from splitserve.export.names import served_weights
from splitserve.export.sglang import STS_VERIFY_MODE, export_sglang, launch_command

GAMMA = 4
CALIBRATION = {"source": "20 prompts", "fits": [{"temperatures": [1.0, 1.2, 1.5, 2.0], "rounds": 37}]}


@pytest.fixture(scope="module")
def release():
    return dspark_release()


def _export(tmp_path, layer_ids=(1, 2, 4), **kw):
    target = tiny_target(seed=1, layer_ids=layer_ids)
    draft = tiny_draft(target, block_size=GAMMA, **kw)
    torch.manual_seed(3)
    for p in draft.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, mean=0.1 if p.dim() == 1 else 0.0, std=0.3)
    exp = export_sglang(draft, tmp_path / "sg", target.info.num_layers, CALIBRATION)
    return target, draft, exp


def _flag(cmd: str, name: str) -> str:
    return cmd.split(f"--{name} ", 1)[1].split()[0]


def _expected(name: str, w: dict) -> torch.Tensor:
    """What SGLang's parameter `name` must hold after loading: fused ones are our shards stacked."""
    if ".qkv_proj." in name:
        return torch.cat([w[name.replace("qkv_proj", p)] for p in ("q_proj", "k_proj", "v_proj")])
    if ".gate_up_proj." in name:
        return torch.cat([w[name.replace("gate_up_proj", p)] for p in ("gate_proj", "up_proj")])
    return w[name]


CASES = [dict(markov_rank=8, markov_head_type="vanilla"), dict(markov_rank=8, markov_head_type="gated"),
         dict(markov_rank=8, markov_head_type="rnn"), dict(markov_rank=0),
         dict(markov_rank=8, layer_ids=(4, 1, 2)), dict(markov_rank=8, enable_confidence_head=False)]


@pytest.mark.parametrize("kw", CASES)
def test_sglang_parses_the_config_our_command_launches(tmp_path, release, kw):
    from transformers import AutoConfig

    target, draft, exp = _export(tmp_path, **kw)
    hf = AutoConfig.from_pretrained(exp.out_dir)
    parsed = release.parse_dspark_draft_config(draft_hf_config=hf)
    assert parsed.gamma == GAMMA and parsed.mask_token_id == draft.arch.mask_token_id
    assert parsed.markov_rank == max(draft.arch.markov_rank, 1)
    assert parsed.markov_head_type == (draft.arch.markov_head_type if draft.arch.markov_rank else "vanilla")
    assert parsed.target_layer_ids == sorted(draft.arch.target_layer_ids)
    assert parsed.num_target_layers == target.info.num_layers
    # --speculative-dspark-block-size γ sets --speculative-num-draft-tokens γ+1 (arg_groups/fields/spec.py)
    cmd = launch_command(exp, "/models/target")
    num_draft_tokens = int(_flag(cmd, "speculative-dspark-block-size")) + 1
    runtime = release.resolve_runtime_config(draft_hf_config=hf, speculative_num_draft_tokens=num_draft_tokens,
                                             target_vocab_size=target.info.vocab_size)
    assert (runtime.gamma, runtime.verify_num_draft_tokens) == (GAMMA, GAMMA + 1)
    assert release.get_dspark_sample_from_anchor(hf) is True  # γ query rows, slot k -> anchor+k+1


@pytest.mark.parametrize("kw", CASES)
def test_sglang_load_weights_fills_every_parameter_from_our_tensors(tmp_path, release, kw, monkeypatch):
    from transformers import AutoConfig

    _, draft, exp = _export(tmp_path, **kw)
    cmd = launch_command(exp, "/models/target")
    mode = cmd.split("SGLANG_RAGGED_VERIFY_MODE=", 1)[1].split()[0] if cmd.startswith("SGLANG_") else "static"
    assert mode == (STS_VERIFY_MODE if draft.confidence is not None else "static")
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", mode)  # the environment our command sets
    model = release.Qwen3DSparkModel(AutoConfig.from_pretrained(exp.out_dir))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))
    w = load_file(str(exp.out_dir / "model.safetensors"))
    RECORDER.loaded.clear()
    model.load_weights(iter(w.items()))
    skipped = sorted(k for k, t in w.items() if id(t) not in RECORDER.loaded)
    assert not skipped, f"SGLang's load_weights dropped {skipped}"
    for name, p in params.items():
        assert not p.isnan().any(), f"{name} was never loaded"
        assert torch.equal(p.float(), _expected(name, w).float()), name
    assert (model.confidence_head is not None) == (draft.confidence is not None)
    # the values are ours: the file holds our trained tensors (bfloat16) by SGLang's names
    ours = served_weights(draft)
    assert set(ours) == set(w)
    for k, t in w.items():
        assert torch.equal(t, ours[k].to(t.dtype)), k


def test_static_mode_ignores_the_confidence_head_and_its_sts_file(tmp_path, release, monkeypatch):
    """Why the STS command sets cap-accept: under the default static mode the release builds no
    confidence head, skips its weights and (dspark_planner.py) ignores the STS path."""
    from transformers import AutoConfig

    _, _, exp = _export(tmp_path, markov_rank=8)
    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)
    assert release.read_ragged_verify_mode() is release.RaggedVerifyMode.STATIC  # environ.py's default
    model = release.Qwen3DSparkModel(AutoConfig.from_pretrained(exp.out_dir))
    assert model.confidence_head is None
    w = load_file(str(exp.out_dir / "model.safetensors"))
    RECORDER.loaded.clear()
    model.load_weights(iter(w.items()))
    assert sorted(k for k, t in w.items() if id(t) not in RECORDER.loaded) == [
        "confidence_head.proj.bias", "confidence_head.proj.weight"]


def test_sts_file_decodes_as_sglang_reads_it(tmp_path, release):
    _, _, exp = _export(tmp_path, markov_rank=8)
    cal = release.DSparkStsCalibration(**json.loads(exp.sts_file.read_text()))  # __post_init__ validates
    assert cal.temperatures == [1.0, 1.2, 1.5, 2.0] and len(cal.temperatures) == GAMMA  # planner: numel == gamma
    with pytest.raises(ValueError, match="> 0"):
        release.DSparkStsCalibration(temperatures=[1.0, 0.0])
