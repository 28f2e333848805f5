"""`--format speculators`: the export loaded by speculators' own DSpark model gives our draft logits.

speculators 0.9.0 (the `speculators` extra; CI installs it) is run as the reference, not read:
its config class parses config.json, `DSparkDraftModel.from_pretrained` loads model.safetensors and
the verifier's embedding / lm_head from the target directory, and its training forward runs one
anchored block. Its Markov-corrected draft logits and confidence logits are compared with ours on
the same captured target hidden states and block.

What vLLM 0.33 reads from the config is checked against keys read from its source
(vllm/transformers_utils/configs/speculators/algos.py update_dspark, base.py
build_vllm_speculative_config); vLLM itself is CUDA-only and not run here.
"""

import ast
import json

import pytest
import torch
from floats import assert_float32_close
from safetensors.torch import load_file
from tiny import tiny_draft, tiny_target

import splitserve.cli as cli
from splitserve.export.speculators import check_head_type, export_speculators, vllm_command

speculators = pytest.importorskip("speculators", reason="the speculators extra is not installed")
from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig  # noqa: E402
from speculators.models.dspark import core as dspark_core  # noqa: E402

CTX, GAMMA, SEQ = 12, 4, 17  # one block at positions 12..15; select_anchors never anchors in the last γ


def _export(tmp_path, layer_ids=(1, 2, 4), **kw):
    target = tiny_target(seed=1, layer_ids=layer_ids)
    target_dir = tmp_path / "target"
    target.model.save_pretrained(target_dir)  # the verifier speculators reloads embed / lm_head / norm from
    draft = tiny_draft(target, block_size=GAMMA, **kw)
    torch.manual_seed(3)
    for p in draft.parameters():  # every trained weight non-trivial, W2 and the norms included
        if p.requires_grad:
            torch.nn.init.normal_(p, mean=0.1 if p.dim() == 1 else 0.0, std=0.3)
    exp = export_speculators(draft, tmp_path / "spec", str(target_dir), ["LlamaForCausalLM"],
                             target.info.hidden_size, 512, torch.float32)
    return target, draft, exp


def _speculators_block(model, aux, ids, hidden: int):
    """speculators' DSparkDraftModel.forward on one anchored block -> (draft logits (γ, V),
    confidence logits (γ,)), taken where it hands them to its loss."""
    seen = {}

    def capture(logits, targets, confidence_logits, *args, **kwargs):
        seen["logits"], seen["conf"] = logits, confidence_logits
        return torch.zeros(()), {}

    loss_mask = torch.zeros(1, SEQ)
    loss_mask[0, CTX] = 1  # the only valid anchor: the block is positions CTX..CTX+γ-1
    mp = pytest.MonkeyPatch()
    mp.setattr(dspark_core, "compute_metrics", capture)
    try:
        with torch.no_grad():
            model(hidden_states=aux, input_ids=ids, loss_mask=loss_mask,
                  verifier_last_hidden_states=torch.zeros(1, SEQ, hidden),  # feeds its loss targets only
                  document_ids=torch.zeros(1, SEQ, dtype=torch.long), max_anchors=1)
    finally:
        mp.undo()
    return seen["logits"][0], None if seen["conf"] is None else seen["conf"][0]


@pytest.mark.parametrize("kw", [
    dict(markov_rank=8, markov_head_type="vanilla"),
    dict(markov_rank=8, markov_head_type="gated"),
    dict(markov_rank=8, markov_head_type="rnn"),
    dict(markov_rank=0),  # the DFlash-style baseline: a rank-1 vanilla head with W2 = 0
    dict(markov_rank=8, layer_ids=(4, 1, 2)),  # unsorted captures: fc columns follow capture order
])
def test_speculators_model_gives_our_logits(tmp_path, kw):
    target, draft, exp = _export(tmp_path, **kw)
    config = DSparkSpeculatorConfig.from_pretrained(exp.out_dir)
    # eager: the float-mask attention path (flex attention is speculators' GPU default)
    config.transformer_layer_config._attn_implementation = "eager"
    model = DSparkDraftModel.from_pretrained(exp.out_dir, config=config).eval()
    ids = torch.randint(0, 90, (1, SEQ), generator=torch.Generator().manual_seed(0))
    aux = target.capture(ids).aux  # (1, T, m*D) in our layer-id order
    order = sorted(range(3), key=draft.arch.target_layer_ids.__getitem__)
    d = draft.arch.hidden_size
    aux_served = torch.cat([aux[..., i * d : (i + 1) * d] for i in order], dim=-1)  # as a server captures
    got, got_conf = _speculators_block(model, aux_served, ids, d)
    block = ids[:, CTX : CTX + GAMMA]
    with torch.no_grad():
        ctx = draft.context_kv(aux[:, :CTX], torch.arange(CTX)[None])
        h = draft.backbone(draft.block_inputs(block[:, 0]), torch.arange(CTX, CTX + GAMMA)[None], ctx, None)
        want = draft.logits(h, block)[0]  # teacher-forced prev tokens [anchor, x1, x2, x3]
        want_conf = draft.confidence_logit(h, block)[0]
    # Same maths, another module stack (HF Qwen3 layers, eager attention): float32 kernel drift
    # only, tests/floats.py's bound. A block one slot off or a swapped weight is far outside it.
    assert_float32_close(got, want)
    assert_float32_close(got_conf, want_conf)


def test_config_parses_and_carries_what_vllm_reads(tmp_path):
    target, draft, exp = _export(tmp_path, markov_rank=8)
    cfg = json.loads((exp.out_dir / "config.json").read_text())
    parsed = DSparkSpeculatorConfig.from_pretrained(exp.out_dir)
    assert isinstance(parsed, DSparkSpeculatorConfig) and parsed.sample_from_anchor is True
    tl = parsed.transformer_layer_config
    assert (tl.model_type, tl.hidden_size, tl.num_hidden_layers, tl.head_dim) == ("qwen3", 32, 1, 8)
    assert tl.layer_types == ["full_attention"] and tl.rope_parameters["rope_theta"] == draft.arch.rope_theta
    # update_dspark: required keys; capture points "before layer i" = our layer l + 1
    assert cfg["speculators_model_type"] == "dspark"
    assert cfg["aux_hidden_state_layer_ids"] == [2, 3, 5] and cfg["mask_token_id"] == draft.arch.mask_token_id
    assert cfg["sample_from_anchor"] is True  # update_dspark's default is False (anchor as bonus token)
    for key in ("markov_rank", "markov_head_type", "block_size", "enable_confidence_head",
                "confidence_head_with_markov", "draft_vocab_size", "target_hidden_size"):
        assert key in cfg, key
    # vLLM builds the draft's HF config from transformer_layer_config alone: nothing left to defaults
    for key in ("hidden_act", "rms_norm_eps", "max_position_embeddings", "intermediate_size",
                "num_key_value_heads", "head_dim", "rope_parameters", "vocab_size"):
        assert key in cfg["transformer_layer_config"], key
    # build_vllm_speculative_config: the first proposal method's speculative_tokens; verifier path set
    spec = cfg["speculators_config"]
    assert spec["proposal_methods"][0]["speculative_tokens"] == GAMMA
    assert spec["verifier"]["name_or_path"] == str(tmp_path / "target")
    w = load_file(str(exp.out_dir / "model.safetensors"))
    assert not any(k.startswith(("embed_tokens", "lm_head", "verifier_")) for k in w)  # reloaded from the target
    assert w["confidence_head.proj.weight"].dtype == torch.float32


def test_vllm_command_names_the_target_and_gamma(tmp_path):
    _, _, exp = _export(tmp_path, markov_rank=8)
    cmd = vllm_command(exp, "/models/target")
    assert cmd.startswith("vllm serve /models/target")
    spec = json.loads(cmd.split("--speculative-config ", 1)[1].strip("'"))
    assert spec == {"method": "dspark", "model": str(exp.out_dir), "num_speculative_tokens": GAMMA}


def test_head_types_vllm_or_speculators_lack_are_refused(tmp_path):
    _, _, exp = _export(tmp_path, markov_rank=8, markov_head_type="gated")
    with pytest.raises(ValueError, match="vLLM 0.33 cannot serve markov_head_type='gated'"):
        vllm_command(exp, "/models/target")
    with pytest.raises(ValueError, match="no speculators 0.9.0 DSpark head"):
        check_head_type(8, "mixture")
    assert check_head_type(0, "rnn") == "vanilla"  # rank 0 serves a vanilla zero head


def test_cli_export_speculators(tmp_path, tiny_smol_dir, capsys):
    from tiny import export_tiny_draft

    hf = export_tiny_draft(tiny_smol_dir, tmp_path / "hf")
    cli.export_main([str(hf), str(tmp_path / "spec"), "--target", str(tiny_smol_dir), "--format", "speculators"])
    out = capsys.readouterr().out
    assert f"vllm serve {tiny_smol_dir.resolve()}" in out
    assert '"method": "dspark"' in out and '"num_speculative_tokens": 4' in out
    cfg = DSparkSpeculatorConfig.from_pretrained(tmp_path / "spec")
    assert cfg.speculators_config.verifier.name_or_path == str(tiny_smol_dir.resolve())
    assert cfg.transformer_layer_config.max_position_embeddings == 2048  # the target's
    assert load_file(str(tmp_path / "spec" / "model.safetensors"))["fc.weight"].dtype == torch.bfloat16


def test_vllm_own_config_code_reads_our_export(tmp_path):
    """vLLM's speculators config code (transformers_utils/configs/speculators/algos.py update_dspark,
    base.py SpeculatorsConfig's dict-level methods), compiled from its wheel, over our config.json."""
    import vllm_release  # the release's wheel, downloaded once (integration tier: tests/conftest.py)

    wheel = vllm_release.wheel()
    algos: dict = {}
    exec(compile(wheel.read("vllm/transformers_utils/configs/speculators/algos.py").decode(), "algos.py", "exec"),
         algos)
    tree = ast.parse(wheel.read("vllm/transformers_utils/configs/speculators/base.py").decode())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculatorsConfig")
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in (
        "extract_transformers_pre_trained_config", "validate_speculators_config", "build_vllm_speculative_config",
        "extract_vllm_speculative_config")]
    shell = ast.fix_missing_locations(ast.ClassDef(name="S", bases=[], keywords=[], body=methods,
                                                   decorator_list=[], type_params=[]))
    ns = {"SUPPORTED_SPECULATORS_TYPES": algos["SUPPORTED_SPECULATORS_TYPES"], "Any": object}
    exec(compile(ast.Module(body=[shell], type_ignores=[]), "base.py", "exec"), ns)
    _, draft, exp = _export(tmp_path, markov_rank=8)
    cfg = json.loads((exp.out_dir / "config.json").read_text())
    hf = ns["S"].extract_transformers_pre_trained_config(json.loads(json.dumps(cfg)))
    assert hf["architectures"] == ["Qwen3DSparkModel"] and hf["target_layer_ids"] == list(draft.arch.target_layer_ids)
    assert hf["sample_from_anchor"] is True and hf["dspark_bonus_anchor"] is False
    assert ns["S"].extract_vllm_speculative_config(cfg) == {"method": "dspark", "num_speculative_tokens": GAMMA}


def test_a_reduced_vocabulary_draft_is_exported_expanded_and_gives_its_logits(tmp_path):
    """draft.draft_vocab_size: speculators' DSpark has no id map, so the export writes the head over
    the whole vocabulary; speculators' model then gives the reduced draft's logits at its N ids."""
    from splitserve.models.vocab_map import VocabMap

    target, draft, _ = _export(tmp_path, markov_rank=8, draft_vocab_size=40)
    draft.set_vocab(VocabMap.from_ids(torch.randperm(96, generator=torch.Generator().manual_seed(1))[:40], 96))
    exp = export_speculators(draft, tmp_path / "reduced", str(tmp_path / "target"), ["LlamaForCausalLM"],
                             target.info.hidden_size, 512, torch.float32)
    config = DSparkSpeculatorConfig.from_pretrained(exp.out_dir)
    assert config.draft_vocab_size == 96
    config.transformer_layer_config._attn_implementation = "eager"
    model = DSparkDraftModel.from_pretrained(exp.out_dir, config=config).eval()
    ids = torch.randint(0, 90, (1, SEQ), generator=torch.Generator().manual_seed(0))
    aux = target.capture(ids).aux
    got, _ = _speculators_block(model, aux, ids, draft.arch.hidden_size)  # layer ids (1, 2, 4): in order
    block = ids[:, CTX: CTX + GAMMA]
    with torch.no_grad():
        ctx = draft.context_kv(aux[:, :CTX], torch.arange(CTX)[None])
        h = draft.backbone(draft.block_inputs(block[:, 0]), torch.arange(CTX, CTX + GAMMA)[None], ctx, None)
        want = draft.logits(h, block)[0]  # (γ, N)
    assert got.shape[-1] == 96
    assert_float32_close(got[:, draft.vocab.used], want)
