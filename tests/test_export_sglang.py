"""`--format sglang`: config keys, weight names, shapes and dtypes checked against a spec written
from SGLang 0.5.23's loaders, and a reference forward that reads the checkpoint the way they do
(tests/test_sglang_contract.py runs that release's own parsing and load_weights over the export).

Spec sources (sglang 0.5.23, python/sglang/srt/):
  models/dflash.py                       DFlashDraftModel / DFlashAttention / DFlashMLP
  models/dspark.py                       VanillaMarkov, GatedMarkovHead, RNNHead, DSparkConfidenceHead
  speculative/dflash_utils.py            parse_dflash_draft_config
  speculative/dspark_components/dspark_config.py   parse_dspark_draft_config
  speculative/dspark_components/dspark_draft.py    sample_from_anchor: a block of γ rows, all emitted
"""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tiny import tiny_draft, tiny_target

import splitserve.cli as cli
from splitserve.export.names import checkpoint_name, served_weights
from splitserve.export.sglang import export_sglang, launch_command, refuse_options, sglang_config


def sglang_spec(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor SGLang's loader consumes for this config.json, with the shape of
    the module slot it is copied into (fused qkv / gate_up are given per shard, as loaded)."""
    dc = cfg.get("dflash_config") or {}
    d, n_layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim", d // heads)
    ffn = cfg["intermediate_size"]
    m = len(dc.get("target_layer_ids", cfg.get("target_layer_ids")))
    spec = {"fc.weight": (d, m * d), "hidden_norm.weight": (d,), "norm.weight": (d,)}
    for i in range(n_layers):
        p = f"layers.{i}."
        spec.update({
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (heads * hd, d), p + "self_attn.k_proj.weight": (kv * hd, d),
            p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.o_proj.weight": (d, heads * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (ffn, d), p + "mlp.up_proj.weight": (ffn, d),
            p + "mlp.down_proj.weight": (d, ffn),
        })
    if cfg["architectures"] == ["Qwen3DSparkModel"]:
        r, v = cfg["markov_rank"], cfg["vocab_size"]  # build_markov_head reads the top level
        spec["markov_head.markov_w1.weight"] = (v, r)
        spec["markov_head.markov_w2.weight"] = (v, r)
        if cfg["markov_head_type"] == "gated":
            spec["markov_head.gate_proj.weight"] = (r, d + r)
            spec["markov_head.gate_proj.bias"] = (r,)
        if cfg["markov_head_type"] == "rnn":
            spec["markov_head.joint_proj.weight"] = (3 * r, 2 * r + d)
            spec["markov_head.joint_proj.bias"] = (3 * r,)
        if cfg.get("enable_confidence_head", True):
            with_markov = cfg.get("confidence_head_with_markov", r > 0)
            spec["confidence_head.proj.weight"] = (1, d + (r if with_markov else 0))
            spec["confidence_head.proj.bias"] = (1,)
    return spec


def _export(tmp_path, markov_rank=8, layer_ids=(1, 2, 4), **kw):
    target = tiny_target(seed=1, layer_ids=layer_ids)
    draft = tiny_draft(target, block_size=4, markov_rank=markov_rank, **kw)
    torch.manual_seed(3)
    for p in draft.parameters():  # every trained weight non-trivial, W2 and the norms included
        if p.requires_grad:
            torch.nn.init.normal_(p, mean=0.1 if p.dim() == 1 else 0.0, std=0.3)
    exp = export_sglang(draft, tmp_path / "sg", target.info.num_layers)
    cfg = json.loads((exp.out_dir / "config.json").read_text())
    return target, draft, exp, cfg, load_file(str(exp.out_dir / "model.safetensors"))


@pytest.mark.parametrize("markov_rank, head", [(8, "vanilla"), (8, "gated"), (8, "rnn"), (0, "vanilla"), (0, "rnn")])
def test_dspark_config_and_every_weight_match_the_loader(tmp_path, markov_rank, head):
    target, draft, exp, cfg, w = _export(tmp_path, markov_rank=markov_rank, markov_head_type=head)
    a = draft.arch
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 4  # DSpark gamma: γ rows drafted, verify window γ+1
    dc = cfg["dflash_config"]
    assert dc["mask_token_id"] == a.mask_token_id < cfg["vocab_size"]
    assert dc["target_layer_ids"] == [1, 2, 4] and dc["num_target_layers"] == 6
    assert all(0 <= i < dc["num_target_layers"] for i in dc["target_layer_ids"])
    # rank 0 is served through a rank-1 vanilla head (SGLang's DSpark refuses markov_rank=0)
    assert cfg["markov_rank"] == max(markov_rank, 1)
    assert cfg["markov_head_type"] == (head if markov_rank else "vanilla")
    assert cfg["sample_from_anchor"] is True and cfg["torch_dtype"] == "bfloat16"
    assert cfg["enable_confidence_head"] is True
    assert cfg["confidence_head_with_markov"] is (markov_rank > 0)
    assert cfg["hidden_act"] == "silu" and cfg["layer_types"] == ["full_attention"] * a.num_layers
    shape = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"])
    assert shape == (32, 4, 2, 8)
    spec = sglang_spec(cfg)
    assert set(w) == set(spec), f"missing {set(spec) - set(w)}, unexpected {set(w) - set(spec)}"
    for name, shape in spec.items():
        assert tuple(w[name].shape) == shape, name
        want = torch.float32 if name.startswith("confidence_head.") else torch.bfloat16
        assert w[name].dtype == want, name
    assert not any(k.startswith(("embed_tokens", "lm_head", "model.")) for k in w)
    if markov_rank == 0:
        assert not w["markov_head.markov_w2.weight"].any()  # B_k = 0: the draft's own distribution


def test_config_parses_through_autoconfig_as_sglang_reads_it(tmp_path):
    from transformers import AutoConfig

    _, draft, exp, _, _ = _export(tmp_path)
    c = AutoConfig.from_pretrained(exp.out_dir)  # hf_transformers_utils.get_config goes through AutoConfig
    # get_rope_config: rope_parameters (transformers 5) or rope_theta (4)
    theta = (c.rope_parameters or {}).get("rope_theta") if getattr(c, "rope_parameters", None) else c.rope_theta
    assert theta == draft.arch.rope_theta
    assert c.head_dim == draft.arch.head_dim and c.layer_types == ["full_attention"] * draft.arch.num_layers
    assert getattr(c, "sliding_window", None) is None
    assert c.dflash_config["target_layer_ids"] == [1, 2, 4] and c.markov_rank == 8 and c.block_size == 4


@pytest.mark.parametrize("algorithm, keep_fp32, match", [
    ("dflash", False, "DFLASH worker reads block slot j as the j-th token"),
    ("dspark", True, "float32 draft under its default --dtype auto as float16"),
])
def test_unservable_options_are_refused_with_the_reason(algorithm, keep_fp32, match):
    with pytest.raises(ValueError, match=match):
        refuse_options(algorithm, keep_fp32)
    refuse_options("dspark", False)  # the default passes


def test_cli_refuses_dflash_before_loading_anything(tmp_path, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("the draft was read before the option check")

    monkeypatch.setattr("splitserve.loading.read_draft_meta", no_load)
    with pytest.raises(ValueError, match="--algorithm dflash is refused"):
        cli.export_main([str(tmp_path / "run"), str(tmp_path / "sg"), "--format", "sglang", "--algorithm", "dflash"])
    assert not (tmp_path / "sg").exists()


def test_every_trained_parameter_has_an_sglang_slot(tmp_path):
    target = tiny_target(seed=1)
    for kw in (dict(markov_rank=8, markov_head_type="gated"), dict(markov_rank=8, markov_head_type="rnn"),
               dict(markov_rank=0)):
        draft = tiny_draft(target, **kw)
        for name in draft.trainable_state_dict():
            checkpoint_name(name)  # KeyError would mean a weight SGLang cannot load
        with pytest.raises(KeyError):
            checkpoint_name("embed_tokens.weight")


# ---- a forward written from SGLang's modules, reading the checkpoint as its loader does ----


def _rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _neox_rope(x, pos, theta):
    # x: (T, H, hd); neox style (rotate halves), get_rope(..., is_neox_style=True)
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    f = pos.float()[:, None] * inv  # (T, hd/2)
    cos, sin = f.cos()[:, None], f.sin()[:, None]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def sglang_reference_logits(cfg, w, aux, ctx_len, anchor, prev_ids, embed, lm_head):
    """DSpark/DFlash draft round as SGLang computes it, batch 1.

    aux: (C, m*D) target features in ascending layer order; block rows [anchor, M, ..., M] at
    positions C..C+γ-1 attend to all C context rows and all block rows (ENCODER_ONLY); the base
    logits of every row get the Markov bias of the previous token (run_markov_block)."""
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    heads, kvh, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    gamma = cfg["block_size"]
    ctx = _rms(aux @ w["fc.weight"].T, w["hidden_norm.weight"], eps)  # project_target_hidden
    ids = torch.full((gamma,), cfg["dflash_config"]["mask_token_id"])
    ids[0] = anchor
    x = embed[ids]
    pos_b, pos_c = torch.arange(ctx_len, ctx_len + gamma), torch.arange(ctx_len)
    for i in range(cfg["num_hidden_layers"]):
        p = lambda n: w[f"layers.{i}.{n}"]  # noqa: E731
        qkv = torch.cat([p("self_attn.q_proj.weight"), p("self_attn.k_proj.weight"), p("self_attn.v_proj.weight")])
        h = _rms(x, p("input_layernorm.weight"), eps)
        q, k, v = (h @ qkv.T).split([heads * hd, kvh * hd, kvh * hd], dim=-1)
        q = _neox_rope(_rms(q.view(-1, heads, hd), p("self_attn.q_norm.weight"), eps), pos_b, theta)
        k = _neox_rope(_rms(k.view(-1, kvh, hd), p("self_attn.k_norm.weight"), eps), pos_b, theta)
        kv_c = ctx @ qkv[heads * hd :].T  # kv_proj_only, then apply_k_norm / apply_k_rope
        kc, vc = kv_c.split([kvh * hd, kvh * hd], dim=-1)
        kc = _neox_rope(_rms(kc.view(-1, kvh, hd), p("self_attn.k_norm.weight"), eps), pos_c, theta)
        keys = torch.cat([kc, k]).repeat_interleave(heads // kvh, dim=1)  # (C+γ, H, hd)
        vals = torch.cat([vc.view(-1, kvh, hd), v.view(-1, kvh, hd)]).repeat_interleave(heads // kvh, dim=1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, keys) * hd**-0.5, dim=-1)
        x = x + torch.einsum("hqk,khd->qhd", att, vals).reshape(gamma, -1) @ p("self_attn.o_proj.weight").T
        h = _rms(x, p("post_attention_layernorm.weight"), eps)
        gate_up = h @ torch.cat([p("mlp.gate_proj.weight"), p("mlp.up_proj.weight")]).T  # SiluAndMul: gate first
        g, u = gate_up.chunk(2, dim=-1)
        x = x + (F.silu(g) * u) @ p("mlp.down_proj.weight").T
    hid = _rms(x, w["norm.weight"], eps)
    logits = hid @ lm_head.T  # compute_base_logits: the target's lm_head
    if "markov_head.markov_w1.weight" in w:
        z = w["markov_head.markov_w1.weight"][prev_ids]  # (γ, r)
        if "markov_head.gate_proj.weight" in w:
            gate = torch.cat([hid, z], -1) @ w["markov_head.gate_proj.weight"].T + w["markov_head.gate_proj.bias"]
            z = torch.sigmoid(gate) * z
        if "markov_head.joint_proj.weight" in w:  # RNNHead: a state carried along the block from zero
            r = z.shape[-1]
            state, outs = torch.zeros(r), []
            for k in range(gamma):
                joint = torch.cat([state, z[k], hid[k]]) @ w["markov_head.joint_proj.weight"].T
                g, cand, o = (joint + w["markov_head.joint_proj.bias"]).split(r)
                state = torch.sigmoid(g) * state + (1 - torch.sigmoid(g)) * torch.tanh(cand)
                outs.append(torch.tanh(o))
            z = torch.stack(outs)
        logits = logits + z @ w["markov_head.markov_w2.weight"].T
    return logits


@pytest.mark.parametrize(
    "kw",
    [dict(markov_rank=8), dict(markov_rank=8, markov_head_type="gated"), dict(markov_rank=8, markov_head_type="rnn"),
     dict(markov_rank=0),
     dict(markov_rank=8, layer_ids=(4, 1, 2))],  # unsorted captures: fc columns follow SGLang's order
)
def test_sglang_reference_forward_equals_ours(tmp_path, kw):
    # The layout in float32 (served_weights: the same names and permutation the file holds, before
    # the bfloat16 cast), so the comparison measures the mapping, not bfloat16 rounding.
    target, draft, _, _, _ = _export(tmp_path, **kw)
    cfg, w = sglang_config(draft, target.info.num_layers), served_weights(draft)
    ids = torch.randint(0, 90, (1, 16), generator=torch.Generator().manual_seed(0))
    aux = target.capture(ids).aux  # (1, T, m*D) in our layer-id order
    c, block = 12, ids[:, 12:16]
    with torch.no_grad():
        ctx = draft.context_kv(aux[:, :c], torch.arange(c)[None])
        h = draft.backbone(draft.block_inputs(block[:, 0]), torch.arange(c, c + 4)[None], ctx, None)
        ours = draft.logits(h, block)[0]  # teacher-forced prev tokens [anchor, x1, x2, x3]
        order = sorted(range(len(draft.arch.target_layer_ids)), key=draft.arch.target_layer_ids.__getitem__)
        d = draft.arch.hidden_size
        aux_sglang = torch.cat([aux[0, :c, i * d : (i + 1) * d] for i in order], dim=-1)
        ref = sglang_reference_logits(cfg, w, aux_sglang, c, block[0, 0], block[0],
                                      target.embed_weight(), target.lm_head_weight())
    torch.testing.assert_close(ref, ours, atol=1e-4, rtol=1e-4)


def test_cli_export_sglang(tmp_path, tiny_smol_dir, capsys):
    from tiny import export_tiny_draft

    hf = export_tiny_draft(tiny_smol_dir, tmp_path / "hf")
    cli.export_main([str(hf), str(tmp_path / "sg"), "--target", str(tiny_smol_dir), "--format", "sglang"])
    out = capsys.readouterr().out
    assert "--speculative-algorithm DSPARK" in out and "--speculative-dspark-block-size 4" in out
    assert f"--model-path {tiny_smol_dir.resolve()}" in out  # the directory SGLang opens, not an alias
    cfg = json.loads((tmp_path / "sg" / "config.json").read_text())
    w = load_file(str(tmp_path / "sg" / "model.safetensors"))
    assert set(w) == set(sglang_spec(cfg))
    assert cfg["max_position_embeddings"] == 2048  # the target's, for SGLang's rope cache


def test_sts_calibration_file(tmp_path):
    target = tiny_target(seed=1)
    draft = tiny_draft(target, block_size=4, markov_rank=8)
    calibration = {"source": "20 prompts", "fits": [{"sampling_temperature": 0.0, "temperatures": [1.0, 1.2, 1.5, 2.0],
                                                     "rounds": 37}]}
    exp = export_sglang(draft, tmp_path / "sg", target.info.num_layers, calibration)
    # dspark_components/dspark_sts.py DSparkStsCalibration: temperatures (one per drafted position, > 0)
    sts = json.loads(exp.sts_file.read_text())
    assert sts == {"temperatures": [1.0, 1.2, 1.5, 2.0], "dataset": "20 prompts", "num_samples": 37}
    assert len(sts["temperatures"]) == json.loads((exp.out_dir / "config.json").read_text())["block_size"]
    cmd = launch_command(exp, "/models/target")
    assert f"--speculative-dspark-confidence-sts-path {exp.sts_file}" in cmd
    # the STS file is read only where the confidence head is built: not in the default static mode
    assert cmd.startswith("SGLANG_RAGGED_VERIFY_MODE=cap-accept python -m sglang.launch_server")
    assert "SGLANG_RAGGED_VERIFY_MODE" not in launch_command(export_sglang(draft, tmp_path / "sg3", 6), "/t")
    no_conf = tiny_draft(target, block_size=4, markov_rank=8, enable_confidence_head=False)
    assert export_sglang(no_conf, tmp_path / "sg2", 6, calibration).sts_file is None


def test_repeated_captured_layers_are_a_one_line_user_error(tmp_path):
    from dataclasses import replace

    from splitserve.errors import UserError

    target = tiny_target(seed=1)
    draft = tiny_draft(target)
    draft.arch = replace(draft.arch, target_layer_ids=(1, 1, 4))  # as a small target's default rule gave
    with pytest.raises(UserError, match=r"target_layer_ids \[1, 1, 4\] repeat a layer") as err:
        export_sglang(draft, tmp_path / "out", target.info.num_layers)
    assert "\n" not in str(err.value)


def test_a_reduced_vocabulary_draft_is_written_over_the_whole_vocabulary(tmp_path):
    """SGLang's DSpark has no id map: a reduced draft's Markov head is written expanded, shaped as
    the loader's whole-vocabulary slots, its W2 rows at the draft's target ids."""
    target, draft, exp, cfg, w = _export(tmp_path, draft_vocab_size=40)
    assert draft.arch.reduced and cfg["vocab_size"] == 96
    spec = sglang_spec(cfg)
    assert set(w) == set(spec) and all(tuple(w[k].shape) == s for k, s in spec.items())
    w2 = w["markov_head.markov_w2.weight"].float()  # (V, r)
    torch.testing.assert_close(w2[draft.vocab.used], draft.markov.w2.weight.detach().bfloat16().float())
    assert not w2[~draft.vocab.t2d].any()
