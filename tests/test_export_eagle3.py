"""EAGLE-3 exports (export/eagle3.py): the speculators layout loaded by speculators' own
Eagle3DraftModel gives our logits at every training-time-test step; the vocabulary maps
round-trip; each layout writes its engine's layer-id convention for the same trained layers;
the serve commands, the releases recorded, and the CLI's one-line refusals.

speculators 0.9.0 is run as the reference, not read: Eagle3SpeculatorConfig parses config.json,
Eagle3DraftModel.from_pretrained loads model.safetensors and the verifier's weights from the
target directory, and its forward unrolls k steps over a sequence (teacher-forced, as ours).
The engines' own code runs over these exports in tests/test_export_eagle3_engines.py.
"""

import json
import shutil

import pytest
import torch
from eagle3_tiny import N, STEPS, ascending, eagle3_draft
from eagle3_tiny import inputs as _inputs
from floats import assert_float32_close
from safetensors.torch import load_file, save_file
from tiny import VOCAB, tiny_target

import splitserve.cli as cli
from splitserve.config import DraftConfig, TargetConfig
from splitserve.export import engine_versions as ev
from splitserve.export.eagle3 import export_eagle3, read_vocab_map, refuse_options, serve_command
from splitserve.models.build import build_draft, resolve_arch
from splitserve.models.vocab_map import VocabMap

speculators = pytest.importorskip("speculators", reason="the speculators extra is not installed")
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: thread hand-offs cost more than the work


def _speculators_export(tmp_path, target, draft, name="spec"):
    target_dir = tmp_path / "target"
    if not target_dir.exists():
        target.model.save_pretrained(target_dir)  # the verifier speculators reads its weights from
    return export_eagle3(draft, tmp_path / name, "speculators", str(target_dir), ["LlamaForCausalLM"], 512,
                         torch.float32)


def speculators_logits(export_dir, aux: torch.Tensor, ids: torch.Tensor) -> list[torch.Tensor]:
    """speculators' Eagle3DraftModel over one sequence: its k steps' draft logits, (1, T-1, N)
    each, as its lm_head hands them on. aux (1, T, m*D) in ascending layer order, ids (1, T);
    inputs shifted as its data pipeline does (speculators/models/eagle3/data.py shift_batch)."""
    config = Eagle3SpeculatorConfig.from_pretrained(export_dir)
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention is its GPU default
    model = Eagle3DraftModel.from_pretrained(export_dir, config=config).eval()
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        with torch.no_grad():
            model(hidden_states=aux[:, :-1], input_ids=ids[:, 1:], document_ids=torch.zeros_like(ids[:, 1:]),
                  ttt_steps=STEPS)
    finally:
        hook.remove()
    return seen


def ours(draft, aux, ids) -> list[torch.Tensor]:
    with torch.no_grad():
        return [draft.draft_logits(h) for h in draft.unroll(aux, ids, STEPS)]


@pytest.mark.parametrize("kw", [dict(), dict(layers=2, layer_ids=(4, 1, 2)), dict(vocab=VOCAB)],
                         ids=["one-layer", "two-layers-unsorted-capture", "full-vocab"])
def test_speculators_model_gives_our_logits_at_every_step(tmp_path, kw):
    target, draft = eagle3_draft(**kw)
    exp = _speculators_export(tmp_path, target, draft)
    ids, aux = _inputs(target)
    got, want = speculators_logits(exp.out_dir, ascending(draft, aux), ids), ours(draft, aux, ids)
    assert len(got) == len(want) == STEPS
    for j in range(STEPS):  # step j > 0 reads step j-1's states: the chain the engines draft
        assert_float32_close(got[j], want[j])


def test_the_comparison_catches_a_layer_one_off_and_a_transposed_weight(tmp_path):
    """The tolerance above is no formality: features captured one layer later, or one square
    weight stored transposed, move the logits far outside it."""
    target, draft = eagle3_draft(layer_ids=(0, 1, 3))
    exp = _speculators_export(tmp_path, target, draft)
    ids, aux = _inputs(target)
    want = ours(draft, aux, ids)[0]
    late = tiny_target(seed=1, layer_ids=(1, 2, 4)).capture(ids).aux  # the same target, each layer one later
    with pytest.raises(AssertionError):
        assert_float32_close(speculators_logits(exp.out_dir, late, ids)[0], want)
    bad = tmp_path / "transposed"
    shutil.copytree(exp.out_dir, bad)
    w = load_file(str(bad / "model.safetensors"))
    w["layers.0.self_attn.o_proj.weight"] = w["layers.0.self_attn.o_proj.weight"].T.contiguous()  # (D, H*hd), square
    save_file(w, str(bad / "model.safetensors"))
    with pytest.raises(AssertionError):
        assert_float32_close(speculators_logits(bad, ascending(draft, aux), ids)[0], want)


@pytest.mark.parametrize("fmt", ["speculators", "sglang"])
def test_vocabulary_maps_round_trip(tmp_path, fmt):
    target, draft = eagle3_draft()
    exp = (_speculators_export(tmp_path, target, draft) if fmt == "speculators"
           else export_eagle3(draft, tmp_path / "sg", "sglang"))
    back = read_vocab_map(exp.out_dir)
    assert torch.equal(back.d2t, draft.d2t) and torch.equal(back.t2d, draft.t2d)
    w = load_file(str(exp.out_dir / "model.safetensors"))
    assert w["d2t"].dtype == torch.int64
    assert ("t2d" in w) == (fmt == "speculators")  # SGLang reads d2t alone (its hot-token map)
    if fmt == "speculators":  # and speculators' own model holds the same maps
        model = Eagle3DraftModel.from_pretrained(exp.out_dir)
        assert torch.equal(model.d2t, draft.d2t) and torch.equal(model.t2d, draft.t2d)
    _, full = eagle3_draft(vocab=VOCAB)
    assert read_vocab_map(export_eagle3(full, tmp_path / "full", "sglang").out_dir) is None  # no map: V ids


def test_each_layout_writes_its_engines_layer_convention(tmp_path):
    target, draft = eagle3_draft(layer_ids=(4, 1, 2))
    spec = json.loads((_speculators_export(tmp_path, target, draft).out_dir / "config.json").read_text())
    sg = json.loads((export_eagle3(draft, tmp_path / "sg", "sglang").out_dir / "config.json").read_text())
    trained = sorted(draft.arch.target_layer_ids)  # ascending: the order both engines capture in
    assert spec["eagle_aux_hidden_state_layer_ids"] == [l + 1 for l in trained] == [2, 3, 5]  # before layer l+1
    assert sg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == trained  # SGLang adds the 1 itself
    assert spec["splitserve"]["trained_layer_ids"] == sg["splitserve"]["trained_layer_ids"] == [4, 1, 2]


def test_configs_carry_what_the_engines_read(tmp_path):
    target, draft = eagle3_draft()
    spec = json.loads((_speculators_export(tmp_path, target, draft).out_dir / "config.json").read_text())
    assert spec["speculators_model_type"] == "eagle3" and spec["architectures"] == ["Eagle3Speculator"]
    assert spec["draft_vocab_size"] == N and spec["transformer_layer_config"]["vocab_size"] == VOCAB
    assert spec["norm_before_residual"] is False  # vLLM's update_eagle3 would default it to True
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == STEPS
    assert spec["speculators_config"]["verifier"]["name_or_path"] == str(tmp_path / "target")
    parsed = Eagle3SpeculatorConfig.from_pretrained(tmp_path / "spec")
    assert parsed.transformer_layer_config.model_type == "llama" and parsed.draft_vocab_size == N
    sg = json.loads((export_eagle3(draft, tmp_path / "sg", "sglang").out_dir / "config.json").read_text())
    assert sg["architectures"] == ["LlamaForCausalLMEagle3"] and sg["draft_vocab_size"] == N
    assert sg["vocab_size"] == VOCAB and sg["tie_word_embeddings"] is False and sg["torch_dtype"] == "bfloat16"
    w = load_file(str(tmp_path / "sg" / "model.safetensors"))
    assert not any(k.startswith("embed_tokens") for k in w) and w["lm_head.weight"].shape == (N, 32)
    assert all(t.dtype == torch.bfloat16 for k, t in w.items() if k != "d2t")
    s = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert torch.equal(s["embed_tokens.weight"], target.embed_weight())  # speculators saves it: module docstring


def test_serve_commands_and_the_releases_recorded(tmp_path):
    target, draft = eagle3_draft()
    spec = _speculators_export(tmp_path, target, draft)
    cmd = serve_command(spec, "/models/target")
    assert cmd.startswith("vllm serve /models/target")
    assert json.loads(cmd.split("--speculative-config ", 1)[1].strip("'")) == {
        "method": "eagle3", "model": str(spec.out_dir), "num_speculative_tokens": STEPS}
    sg = export_eagle3(draft, tmp_path / "sg", "sglang")
    words = serve_command(sg, "/models/target").replace("\\\n", " ").split()
    flags = {w[2:]: words[i + 1] for i, w in enumerate(words) if w.startswith("--")}
    assert flags == {"model-path": "/models/target", "speculative-algorithm": "EAGLE3",
                     "speculative-draft-model-path": str(sg.out_dir), "speculative-num-steps": str(STEPS),
                     "speculative-eagle-topk": "1", "speculative-num-draft-tokens": str(STEPS + 1)}
    for exp, engine, version in ((spec, "vllm", "0.33.0"), (sg, "sglang", "0.5.23")):
        cfg = json.loads((exp.out_dir / "config.json").read_text())
        assert cfg["splitserve"]["layout_checked"] == {"engine": engine, "version": version}
        assert f"{engine}=={version}" in ev.checked_line(engine, "eagle3")
        assert ev.layout_warning(engine, version, family="eagle3") is None
        note = ev.layout_warning(engine, "9.9.9", family="eagle3")
        assert note.startswith(f"note: the installed {engine} 9.9.9") and "\n" not in note
    # a vLLM build that hard-codes DSpark's 1+N block says nothing about an EAGLE-3 draft
    assert ev.layout_warning("vllm", "0.33.0", 'pre_trained_config["dspark_bonus_anchor"] = True',
                             family="eagle3") is None


# ---- the CLI ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eagle3_run(tiny_smol_dir, tmp_path_factory):
    """A run directory of an EAGLE-3 draft (draft_arch.json + one checkpoint) for the tiny
    SmolLM2-tokenizer target, its vocabulary not the first N ids."""
    from splitserve.models.run_files import save_arch
    from splitserve.target.hf import load_hf_target

    run = tmp_path_factory.mktemp("eagle3_run")
    target = load_hf_target(TargetConfig(name="tiny-smol", path=str(tiny_smol_dir), layer_ids=[0, 1, 2], device="cpu"))
    v = target.info.vocab_size
    torch.manual_seed(0)
    cfg = DraftConfig(family="eagle3", num_layers=1, intermediate_size=48, draft_vocab_size=N)
    draft = build_draft(resolve_arch(cfg, target.info, target.model.config), target)
    draft.set_vocab(VocabMap.from_ids(torch.randperm(v)[:N], v))
    save_arch(run, draft.arch, str(tiny_smol_dir), "eagle3")
    ckpt = run / "checkpoints" / "step_0000001"
    ckpt.mkdir(parents=True)
    save_file({k: t.contiguous() for k, t in draft.trainable_state_dict().items()}, str(ckpt / "draft.safetensors"))
    (run / "checkpoints" / "latest").write_text(ckpt.name)
    return run, draft


@pytest.mark.parametrize("fmt", ["speculators", "sglang"])
def test_cli_exports_an_eagle3_run(eagle3_run, tiny_smol_dir, tmp_path, capsys, fmt):
    run, draft = eagle3_run
    cli.export_main([str(run), str(tmp_path / fmt), "--format", fmt])
    out = capsys.readouterr().out
    version = "0.33.0" if fmt == "speculators" else "0.5.23"
    assert "captured layers [0, 1, 2] written as " + ("[1, 2, 3]" if fmt == "speculators" else "[0, 1, 2]") in out
    assert f"checked against {'vllm' if fmt == 'speculators' else 'sglang'}=={version}" in out
    target = str(tiny_smol_dir.resolve())
    assert (f"vllm serve {target}" if fmt == "speculators" else f"--model-path {target}") in out
    assert ('"method": "eagle3"' if fmt == "speculators" else "--speculative-algorithm EAGLE3") in out
    back = read_vocab_map(tmp_path / fmt)  # export -> load back: the run's maps
    assert torch.equal(back.d2t, draft.d2t) and torch.equal(back.t2d, draft.t2d)
    w = load_file(str(tmp_path / fmt / "model.safetensors"))
    for k, t in draft.trainable_state_dict().items():
        if k in w and k not in ("d2t", "t2d"):
            assert torch.equal(w[k], t.to(w[k].dtype)), k


@pytest.mark.parametrize("flags, match", [
    (["--format", "hf"], "an EAGLE-3 draft cannot be exported with --format hf"),
    ([], "an EAGLE-3 draft cannot be exported with --format hf"),  # hf is the default
    (["--format", "sglang", "--algorithm", "dspark"], "--algorithm dspark picks SGLang's DSpark worker"),
    (["--format", "sglang", "--algorithm", "dflash"], "--algorithm dflash picks SGLang's DSpark worker"),
    (["--format", "sglang", "--keep-fp32"], "--keep-fp32 is refused for --format sglang"),
])
def test_cli_refuses_what_an_eagle3_export_cannot_hold_in_one_line(eagle3_run, tmp_path, monkeypatch, flags, match):
    def no_load(*a, **k):
        raise AssertionError("the draft was loaded before the option check")

    monkeypatch.setattr("splitserve.loading.load_models", no_load)
    run, _ = eagle3_run
    with pytest.raises(SystemExit) as exc:
        cli.main(["export", str(run), str(tmp_path / "out"), *flags])
    msg = exc.value.code
    assert isinstance(msg, str) and "\n" not in msg and msg.startswith("splitserve export: ") and match in msg
    assert not (tmp_path / "out").exists()


def test_refusals_name_the_layouts_that_hold_an_eagle3_draft():
    from splitserve.errors import UserError

    with pytest.raises(UserError, match=r"use --format speculators \(vLLM\) or --format sglang$"):
        refuse_options("hf", None, False)
    refuse_options("speculators", None, True)  # float32 is fine for speculators
    with pytest.raises(UserError, match="cannot be exported with --format hf"):
        export_eagle3(eagle3_draft()[1], "/nonexistent/never-written", "hf")


def test_a_target_the_eagle3_checks_never_covered_gets_a_note():
    from transformers import AutoConfig, LlamaConfig

    from splitserve.export.eagle3 import unchecked_target_note

    assert unchecked_target_note(LlamaConfig()) is None
    note = unchecked_target_note(AutoConfig.for_model("qwen3_next"))
    assert note.startswith("note: EAGLE-3 exports were checked with dense targets only") and "\n" not in note
    assert "qwen3_next" in note
