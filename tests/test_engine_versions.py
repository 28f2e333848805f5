"""splitserve/export/engine_versions.py: the engine releases our exports' block layout was checked
against, what the exports record and print about them, and the one-line warning for an
installed engine known to build another block."""

import json
from types import SimpleNamespace

import pytest
import sglang_release
import vllm_release
from tiny import tiny_draft, tiny_target

import splitserve.cli as cli
from splitserve.export import engine_versions as ev
from splitserve.export.sglang import SGLANG_VERSION, sglang_config
from splitserve.export.speculators import speculators_config

# update_dspark as a build that ignores the checkpoint writes it, and as one that reads it
HARD_CODED = """def update_dspark(config_dict, pre_trained_config):
    pre_trained_config["dspark_bonus_anchor"] = True
"""
FROM_CONFIG = """def update_dspark(config_dict, pre_trained_config):
    sample_from_anchor = config_dict.get("sample_from_anchor", False)
    pre_trained_config["dspark_bonus_anchor"] = not sample_from_anchor
"""


def test_checked_releases_are_the_ones_the_contract_tests_run():
    assert ev.CHECKED["vllm"].version == vllm_release.VERSION
    assert ev.CHECKED["sglang"].version == sglang_release.VERSION == SGLANG_VERSION
    assert not set(ev.OTHER_LAYOUT) & {(r.engine, r.version) for r in ev.CHECKED.values()}


def test_exports_record_the_checked_release():
    target = tiny_target(seed=1)
    draft = tiny_draft(target, block_size=4)
    spec = speculators_config(draft, "/t", ["LlamaForCausalLM"], 32, 512, dtype=__import__("torch").bfloat16)
    assert spec["splitserve"]["layout_checked"] == {"engine": "vllm", "version": "0.33.0"}
    assert sglang_config(draft, 6)["splitserve"]["layout_checked"] == {"engine": "sglang", "version": "0.5.23"}
    json.dumps(spec)  # config.json stays plain JSON


@pytest.mark.parametrize("engine, version, source, starts", [
    ("vllm", None, None, None),  # not installed: nothing to say
    ("vllm", "0.33.0", FROM_CONFIG, None),
    ("sglang", "0.5.23", None, None),
    ("vllm", "0.25.2", None, "warning: vllm 0.25.2 would serve this draft one slot late"),
    ("vllm", "0.33.0", HARD_CODED, "warning: vllm 0.33.0 would serve this draft one slot late"),  # a patched build
    ("vllm", "0.34.1", HARD_CODED, "warning: vllm 0.34.1 would serve"),
    ("vllm", "0.34.1", FROM_CONFIG, "note: the installed vllm 0.34.1 is not the release"),
    ("sglang", "0.5.24", None, "note: the installed sglang 0.5.24 is not the release"),
])
def test_layout_warning_is_one_line(engine, version, source, starts):
    line = ev.layout_warning(engine, version, source)
    if starts is None:
        assert line is None
        return
    assert line.startswith(starts) and "\n" not in line
    assert f"{engine}=={ev.CHECKED[engine].version}" in line


def test_hard_coded_bonus_anchor_is_told_from_a_config_read():
    assert ev.bonus_anchor_hard_coded(HARD_CODED)
    assert ev.bonus_anchor_hard_coded("pre_trained_config['dspark_bonus_anchor']=True  # 1+N")
    assert not ev.bonus_anchor_hard_coded(FROM_CONFIG)
    assert not ev.bonus_anchor_hard_coded('pre_trained_config["dspark_bonus_anchor"] = True_if_x')


def test_installed_engine_is_read_from_its_distribution_not_imported(monkeypatch, tmp_path):
    loader = tmp_path / ev.VLLM_CONFIG_LOADER
    loader.parent.mkdir(parents=True)
    loader.write_text(HARD_CODED)
    dists = {"vllm": SimpleNamespace(version="0.30.0", locate_file=lambda p: tmp_path / p)}

    def distribution(name):
        if name not in dists:
            raise ev.metadata.PackageNotFoundError(name)
        return dists[name]

    monkeypatch.setattr(ev.metadata, "distribution", distribution)
    assert ev.installed("vllm") == ("0.30.0", HARD_CODED)
    assert ev.installed_warning("vllm").startswith("warning: vllm 0.30.0 would serve this draft one slot late")
    assert ev.installed("sglang") == (None, None) and ev.installed_warning("sglang") is None


@pytest.mark.parametrize("fmt, engine, first", [("speculators", "vllm", "vllm serve"),
                                                ("sglang", "sglang", "python -m sglang.launch_server")])
def test_cli_names_the_checked_release_above_the_command(tmp_path, tiny_smol_dir, capsys, monkeypatch, fmt, engine,
                                                         first):
    from tiny import export_tiny_draft

    monkeypatch.setattr(ev, "installed", lambda name: ("0.25.2", None) if name == "vllm" else (None, None))
    hf = export_tiny_draft(tiny_smol_dir, tmp_path / "hf")
    cli.export_main([str(hf), str(tmp_path / "out"), "--target", str(tiny_smol_dir), "--format", fmt])
    lines = capsys.readouterr().out.splitlines()
    at = lines.index(ev.checked_line(engine))
    assert lines[at + 1].startswith(first)
    assert f"{engine}=={ev.CHECKED[engine].version}" in lines[at]
    warnings = [ln for ln in lines if ln.startswith("warning:")]
    assert warnings == ([ev.layout_warning("vllm", "0.25.2")] if engine == "vllm" else [])
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["splitserve"]["layout_checked"] == ev.layout_checked(engine)
