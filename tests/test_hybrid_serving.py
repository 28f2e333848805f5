"""Exports for hybrid targets (recurrent layers among attention ones), MLA and attention-sink targets:
the server flags each engine gets and the one-line note where an engine cannot serve the target
(splitserve/export/hybrid_serving.py), through the export functions and the export CLI.

The table's facts come from SGLang 0.5.23's and vLLM 0.33.0's released source. The last tests read
that source again (SGLang's wheel as tests/sglang_release.py fetches it, integration tier; vLLM's as
tests/vllm_release.py fetches it) and check every flag
and every capture-hook claim in the table against it.
"""

import ast
import json
from types import SimpleNamespace

import pytest
import torch
from tiny import tiny_draft, tiny_target

import splitserve.cli as cli
from splitserve.export.hybrid_serving import (
    ENGINES,
    SGLANG_HOOKS,
    SGLANG_STATE_FLAG,
    TABLE,
    VLLM_HOOK,
    VLLM_STATE_FLAG,
    serving_notes,
)
from splitserve.export.sglang import export_sglang, launch_command
from splitserve.export.speculators import export_speculators, vllm_command


def _common(vocab: int = 96, **kw) -> dict:
    return dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, **kw)


def qwen3_next_config(**kw):
    """tests/arch_matrix.py's tiny Qwen3-Next: gated DeltaNet layers among full-attention ones."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(**_common(**kw), head_dim=8, architectures=["Qwen3NextForCausalLM"],
                           layer_types=["linear_attention", "full_attention"] * 2, num_experts=4,
                           num_experts_per_tok=2, moe_intermediate_size=32, linear_num_value_heads=2,
                           linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)


def nemotron_h_config():
    """A tiny Nemotron-H: Mamba-2, attention and MLP blocks."""
    from transformers import NemotronHConfig

    return NemotronHConfig(vocab_size=96, hidden_size=32, layers_block_type=["mamba", "attention", "mlp", "mamba"],
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
                           ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=8, n_groups=1,
                           max_position_embeddings=512)


def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(**_common())


def falcon_h1_config():
    from transformers import FalconH1Config

    return FalconH1Config(**_common(), head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8,
                          mamba_n_groups=1, mamba_chunk_size=16)


# ---- serving_notes --------------------------------------------------------------------------


@pytest.mark.parametrize("make", [qwen3_next_config, nemotron_h_config], ids=["qwen3_next", "nemotron_h"])
def test_hybrid_targets_get_each_engines_state_flag(make):
    cfg = make()
    assert serving_notes(cfg, "sglang") == (["--mamba-ssm-dtype float32"], None)
    assert serving_notes(cfg, "speculators") == (["--mamba-ssm-cache-dtype float32"], None)
    assert serving_notes(cfg, "hf") == ([], None)  # no server command


@pytest.mark.parametrize("make", [llama_config, lambda: tiny_target().model.config], ids=["llama", "tiny_target"])
def test_dense_targets_get_nothing(make):
    for fmt in ("hf", "sglang", "speculators"):
        assert serving_notes(make(), fmt) == ([], None)


def test_mla_and_sink_targets_are_served_like_dense_ones():
    from transformers import DeepseekV3Config, GptOssConfig

    for cfg in (DeepseekV3Config(), GptOssConfig()):
        assert serving_notes(cfg, "sglang") == ([], None) and serving_notes(cfg, "speculators") == ([], None)


def test_multimodal_and_text_only_qwen3_5_are_both_found():
    from transformers import Qwen3_5MoeConfig, Qwen3_5TextConfig

    for cfg in (Qwen3_5MoeConfig(), Qwen3_5TextConfig()):
        assert serving_notes(cfg, "sglang") == ([SGLANG_STATE_FLAG], None)
        assert serving_notes(cfg, "speculators") == ([VLLM_STATE_FLAG], None)


def test_unservable_target_is_one_line_naming_the_refusing_source():
    flags, line = serving_notes(falcon_h1_config(), "sglang")
    assert flags == [] and "\n" not in line
    assert line.startswith("SGLang 0.5.23 cannot serve a DSpark draft for this falcon_h1 target")
    assert "FalconH1ForCausalLM" in line and "configure_aux_hidden_state_capture" in line
    assert line.endswith("vLLM 0.33.0 cannot serve it either")
    flags, line = serving_notes(falcon_h1_config(), "speculators")
    assert flags == [] and "SupportsEagle3" in line and "set_eagle3_aux_hidden_state_layers" in line


def test_ling_hybrids_are_told_apart_by_their_attention():
    # trust_remote_code configs: a plain namespace stands in for Ling's own config class
    kda = SimpleNamespace(model_type="bailing_hybrid", architectures=["BailingMoeV3ForCausalLM"])
    lightning = SimpleNamespace(model_type="bailing_hybrid", architectures=["BailingMoeV2_5ForCausalLM"])
    by_conv = SimpleNamespace(model_type="bailing_hybrid", short_conv_kernel_size=4)  # SGLang's use_kda rule
    for cfg in (kda, by_conv):
        assert serving_notes(cfg, "sglang") == ([SGLANG_STATE_FLAG], None)
        flags, line = serving_notes(cfg, "speculators")
        assert flags == [] and "BailingMoeV3ForCausalLM" in line and line.endswith("(--format sglang)")
    for fmt in ENGINES:
        flags, line = serving_notes(lightning, fmt)
        assert flags == [] and "lightning" in line and line.endswith("cannot serve it either")


def test_table_is_consistent():
    for row in TABLE.values():
        for fmt in ENGINES:
            support = row.engine(fmt)
            assert support.serves or not support.flags, row.model_type
            assert ":" in support.model_class and "\n" not in support.reason
            root = "sglang/srt/" if fmt == "sglang" else "vllm/"
            assert support.model_class.startswith(root), (row.model_type, fmt)


# ---- the export functions ------------------------------------------------------------------


def _draft():
    target = tiny_target(seed=1, layers=4, layer_ids=(0, 1, 2))
    return tiny_draft(target, block_size=4, markov_rank=8)


def test_sglang_export_for_a_hybrid_target(tmp_path):
    draft = _draft()
    exp = export_sglang(draft, tmp_path / "sg", 4, target_config=qwen3_next_config())
    cmd = launch_command(exp, "/models/qwen3-next")
    assert cmd.endswith(" \\\n    --mamba-ssm-dtype float32")
    assert "--speculative-algorithm DSPARK" in cmd
    meta = json.loads((exp.out_dir / "config.json").read_text())["splitserve"]
    assert meta["serve_flags"] == ["--mamba-ssm-dtype float32"] and "serving_refused" not in meta


def test_vllm_export_for_a_hybrid_target(tmp_path):
    draft = _draft()
    exp = export_speculators(draft, tmp_path / "spec", "/models/nemotron-h", ["NemotronHForCausalLM"], 32,
                             target_config=nemotron_h_config())
    cmd = vllm_command(exp, "/models/nemotron-h")
    lines = cmd.split(" \\\n    ")
    assert lines[0] == "vllm serve /models/nemotron-h" and lines[-1] == "--mamba-ssm-cache-dtype float32"
    spec = json.loads(lines[1].removeprefix("--speculative-config ").strip("'"))
    assert spec == {"method": "dspark", "model": str(exp.out_dir), "num_speculative_tokens": 4}
    meta = json.loads((exp.out_dir / "config.json").read_text())["splitserve"]
    assert meta["serve_flags"] == ["--mamba-ssm-cache-dtype float32"]


def test_unservable_target_still_gets_its_files_and_the_reason_recorded(tmp_path):
    draft = _draft()
    for fmt, exp, command in (
        ("sglang", export_sglang(draft, tmp_path / "sg", 4, target_config=falcon_h1_config()), launch_command),
        ("speculators", export_speculators(draft, tmp_path / "spec", "/t", ["FalconH1ForCausalLM"], 32,
                                           target_config=falcon_h1_config()), vllm_command),
    ):
        assert (exp.out_dir / "config.json").exists() and (exp.out_dir / "model.safetensors").exists()
        line = serving_notes(falcon_h1_config(), fmt)[1]
        assert json.loads((exp.out_dir / "config.json").read_text())["splitserve"]["serving_refused"] == line
        with pytest.raises(ValueError) as e:
            command(exp, "/t")
        assert str(e.value) == line


def test_dense_target_config_changes_nothing(tmp_path):
    draft = _draft()
    cfg = llama_config()

    def same(plain, given, command):
        assert (plain.out_dir / "config.json").read_text() == (given.out_dir / "config.json").read_text()
        assert command(plain, "/t") == command(given, "/t").replace(str(given.out_dir), str(plain.out_dir))

    same(export_sglang(draft, tmp_path / "a", 4), export_sglang(draft, tmp_path / "b", 4, target_config=cfg),
         launch_command)
    same(export_speculators(draft, tmp_path / "c", "/t", ["LlamaForCausalLM"], 32),
         export_speculators(draft, tmp_path / "d", "/t", ["LlamaForCausalLM"], 32, target_config=cfg), vllm_command)


# ---- the export CLI ------------------------------------------------------------------------


def _save_target(config, out):
    """A tiny random target of `config` with SmolLM2's tokenizer, saved as an HF directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from splitserve.assets import smollm2_dir

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_dir()).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def smol_vocab():
    from transformers import AutoTokenizer

    from splitserve.assets import smollm2_dir

    return len(AutoTokenizer.from_pretrained(smollm2_dir()))


@pytest.fixture(scope="module")
def hf_draft(tiny_smol_dir, tmp_path_factory):
    """A draft for a 4-layer, D=32, SmolLM2-vocabulary target. An export reads of its target only
    the config, tokenizer, embedding and lm_head, so the hybrid targets below (same V, D and layer
    count) take it as theirs."""
    from tiny import export_tiny_draft

    return export_tiny_draft(tiny_smol_dir, tmp_path_factory.mktemp("draft") / "hf")


def test_cli_prints_the_hybrid_flags(hf_draft, smol_vocab, tmp_path, capsys):
    target = _save_target(qwen3_next_config(vocab=smol_vocab), tmp_path / "qwen3_next")
    cli.export_main([str(hf_draft), str(tmp_path / "sg"), "--target", str(target), "--format", "sglang"])
    out = capsys.readouterr().out
    assert f"--model-path {target.resolve()}" in out and "--mamba-ssm-dtype float32" in out
    cli.export_main([str(hf_draft), str(tmp_path / "spec"), "--target", str(target), "--format", "speculators"])
    out = capsys.readouterr().out
    assert f"vllm serve {target.resolve()}" in out and "--mamba-ssm-cache-dtype float32" in out


def test_cli_says_in_one_line_when_the_engine_cannot_serve_the_target(hf_draft, smol_vocab, tmp_path, capsys):
    from transformers import FalconH1Config

    cfg = FalconH1Config(**_common(vocab=smol_vocab), head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8,
                         mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=16)
    target = _save_target(cfg, tmp_path / "falcon_h1")
    for fmt in ("sglang", "speculators"):
        cli.export_main([str(hf_draft), str(tmp_path / fmt), "--target", str(target), "--format", fmt])
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 2 and lines[0].startswith("exported ")  # no command: the reason, in one line
        assert lines[1] == f"note: {serving_notes(cfg, fmt)[1]}"
        assert (tmp_path / fmt / "model.safetensors").exists()


# ---- the table against the released source -------------------------------------------------


def _classes(read, path: str) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.parse(read(path)).body if isinstance(n, ast.ClassDef)}


def _imports(read, path: str) -> dict[str, str]:
    """name -> the wheel path of the module it is imported from (absolute or relative imports)."""
    out = {}
    for node in ast.parse(read(path)).body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.rsplit("/", node.level)[0]
                module = base + ("/" + node.module.replace(".", "/") if node.module else "")
            else:
                module = (node.module or "").replace(".", "/")
            for alias in node.names:
                out[alias.asname or alias.name] = module + ".py"
    return out


def _lineage(read, path: str, cls: str):
    """(class node, its path) for `cls` and every base class reachable in the same wheel."""
    seen, todo = [], [(path, cls)]
    while todo:
        path, cls = todo.pop()
        node = _classes(read, path).get(cls)
        assert node is not None or seen, f"{cls} not found in {path}"
        if node is None:
            continue
        seen.append((node, path))
        imports = _imports(read, path)
        for base in node.bases:
            name = ast.unparse(base)
            if name in _classes(read, path):
                todo.append((path, name))
            elif name in imports:
                try:
                    read(imports[name])
                except KeyError:
                    continue
                todo.append((imports[name], name))
    return seen


def _has_sglang_hook(read, model_class: str) -> bool:
    path, cls = model_class.split(":")
    return any(isinstance(f, ast.FunctionDef) and f.name in SGLANG_HOOKS
               for node, _ in _lineage(read, path, cls) for f in node.body)


def _has_vllm_hook(read, model_class: str) -> bool:
    path, cls = model_class.split(":")
    return any(ast.unparse(b) == VLLM_HOOK for node, _ in _lineage(read, path, cls) for b in node.bases)


def _flag_choices(tree: ast.Module, field: str) -> list | None:
    """The `choices=[...]` of an annotated field `field` in any class body of a fields module, or
    None when no class declares the field."""
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == field:
                for kw in (k for k in ast.walk(stmt.annotation) if isinstance(k, ast.keyword)):
                    if kw.arg == "choices":
                        return ast.literal_eval(kw.value)
                return []
    return None


@pytest.mark.integration  # downloads the sglang 0.5.23 wheel (cached), as tests/sglang_release.py does
def test_table_matches_sglang_release():
    from sglang_release import wheel

    w = wheel()
    read = lambda path: w.read(path).decode()  # noqa: E731
    fields = [n for n in w.namelist() if n.startswith("sglang/srt/arg_groups/fields/") and n.endswith(".py")]
    flags = {f for row in TABLE.values() for f in row.sglang.flags}
    assert flags == {SGLANG_STATE_FLAG}
    for flag in flags:
        name, value = flag.split()
        # arg_groups/arg_utils.py turns field `a_b` into option `--a-b`
        found = [c for c in (_flag_choices(ast.parse(read(f)), name[2:].replace("-", "_")) for f in fields)
                 if c is not None]
        assert found and value in found[0], (flag, found)
    for row in TABLE.values():
        assert _has_sglang_hook(read, row.sglang.model_class) == row.sglang.serves, row.model_type


def test_table_matches_vllm_release():
    import vllm_release  # the release's wheel, downloaded once (integration tier: tests/conftest.py)

    w = vllm_release.wheel()
    read = lambda path: w.read(path).decode()  # noqa: E731
    args = read("vllm/engine/arg_utils.py")
    cache = read("vllm/config/cache.py")
    for flag in {f for row in TABLE.values() for f in row.vllm.flags}:
        name, value = flag.split()
        assert f'"{name}"' in args, flag  # EngineArgs.add_cli_args
        field = name[2:].replace("-", "_")
        assert f"{field}: MambaDType" in cache and f'"{value}"' in cache.split("MambaDType = Literal[", 1)[1][:80]
    for row in TABLE.values():
        assert _has_vllm_hook(read, row.vllm.model_class) == row.vllm.serves, row.model_type
