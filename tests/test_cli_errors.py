"""User errors through the console script: one line on stderr naming the file, row or flag, a
non-zero exit, no traceback (unless --debug), and checked before any weights load (the target
path given is missing, so reaching the loader would fail differently)."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import export_tiny_draft

from splitserve import cli

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "splitserve.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**__import__("os").environ, "WANDB_MODE": "offline"})


def assert_one_line(proc, *needles):
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def main_error(*args) -> str:
    """cli.main in-process -> the one-line message it exits with."""
    with pytest.raises(SystemExit) as exc:
        cli.main(list(args))
    msg = exc.value.code
    assert isinstance(msg, str) and "\n" not in msg, msg
    return msg


@pytest.fixture(scope="module")
def draft_dir(tiny_smol_dir, tmp_path_factory):
    return export_tiny_draft(tiny_smol_dir, tmp_path_factory.mktemp("cli_errors") / "draft")


def _train(data: Path, tmp_path: Path, *extra):
    return run("train", f"target.path={tmp_path / 'no-target'}", "target.name=x", f"data.train_path={data}",
               "eval.enabled=false", f"run_dir={tmp_path / 'run'}", *extra)


def test_train_with_an_empty_file(tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    assert_one_line(_train(data, tmp_path), "splitserve train:", "empty.jsonl", "empty")


def test_train_with_non_utf8_bytes_names_the_row(tmp_path):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(b'{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": "caf\xe9"}\n')
    assert_one_line(_train(data, tmp_path), "latin1.jsonl:2", "UTF-8")


def test_debug_shows_the_traceback(tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    proc = _train(data, tmp_path, "--debug")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "DataError" in proc.stderr


def test_serve_on_a_port_in_use_fails_before_loading(draft_dir, tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = str(busy.getsockname()[1])
        proc = run("serve", "--draft", str(draft_dir), "--target", str(tmp_path / "no-target"), "--port", port)
    finally:
        busy.close()
    assert_one_line(proc, "splitserve serve:", f"--port {port}")


def test_eval_of_a_directory_that_is_not_a_draft(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    msg = main_error("eval", "--draft", str(tmp_path), "--target", str(tmp_path / "no-target"))
    assert msg.startswith("splitserve eval: --draft") and "neither a splitserve run" in msg
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert "not a DSpark draft" in main_error("eval", "--draft", str(tmp_path))


def test_eval_with_an_empty_prompts_file(draft_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n\n")
    msg = main_error("eval", "--draft", str(draft_dir), "--prompts", str(prompts), "--target", str(tmp_path / "x"))
    assert "--prompts" in msg and "prompts.jsonl" in msg and "empty" in msg


def test_serve_with_a_bad_chat_template(draft_dir, tmp_path):
    bad = tmp_path / "t.jinja"
    bad.write_bytes(b"{% for m in messages %}\xff")
    msg = main_error("serve", "--draft", str(draft_dir), "--chat-template", str(bad), "--port", "0")
    assert "--chat-template" in msg and "UTF-8" in msg
    bad.write_text("{% for m in messages %}")
    assert "line 1" in main_error("serve", "--draft", str(draft_dir), "--chat-template", str(bad), "--port", "0")
    missing = main_error("serve", "--draft", str(draft_dir), "--chat-template", str(tmp_path / "none"))
    assert "no such file" in missing


def test_export_refuses_a_non_empty_directory_unless_forced(tiny_smol_dir, draft_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "calibration.json").write_text("{}")  # stale: serving would load it with new weights
    msg = main_error("export", str(draft_dir), str(out), "--target", str(tmp_path / "no-target"))
    assert "OUT_DIR" in msg and "--force" in msg and (out / "calibration.json").exists()
    cli.main(["export", str(draft_dir), str(out), "--target", str(tiny_smol_dir), "--force"])
    assert (out / "model.safetensors").exists() and not (out / "calibration.json").exists()


@pytest.mark.parametrize("override, needle", [
    ("draft.block_size=0", "draft.block_size=0: must be at least 1"),
    ("draft.markov_head_type=foo", "draft.markov_head_type='foo'"),
    ("loss.kind=bogus", "loss.kind='bogus'"),
    ("train.backend=bogus", "train.backend='bogus'"),
    ("train.batch_size=0", "train.batch_size=0"),
    ("target.dtype=fp8", "target.dtype='fp8'"),
])
def test_train_settings_are_checked_before_anything_loads(tmp_path, override, needle):
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    assert_one_line(_train(data, tmp_path, override), "splitserve train:", needle)


@pytest.mark.parametrize("config, needle", [
    (None, "its config cannot be read"),  # no config.json at all
    ("{not json", "its config cannot be read"),
    ('{"model_type": "frobnicator"}', "its config cannot be read"),
    ('{"model_type": "bert", "architectures": ["BertLMHeadModel"], "is_decoder": true}', "bidirectional encoder"),
])
def test_a_target_directory_that_cannot_be_a_target_is_one_line(tmp_path, config, needle):
    target = tmp_path / "target"
    target.mkdir()
    if config is not None:
        (target / "config.json").write_text(config)
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    proc = run("train", f"target.path={target}", "target.name=x", f"data.train_path={data}", "eval.enabled=false",
               f"run_dir={tmp_path / 'run'}")
    assert_one_line(proc, "splitserve train:", needle)


def test_export_never_replaces_the_draft_it_reads(tiny_smol_dir, draft_dir, tmp_path):
    import shutil

    src = tmp_path / "parent" / "draft"
    shutil.copytree(draft_dir, src)
    for out in (src, src.parent):  # the draft itself, and a folder holding it
        msg = main_error("export", str(src), str(out), "--target", str(tiny_smol_dir), "--force")
        assert "holds the draft being exported" in msg
    assert (src / "model.safetensors").exists() and (src / "config.json").exists()


def test_an_export_config_missing_an_architecture_key_is_refused(tiny_smol_dir, draft_dir, tmp_path):
    import json
    import shutil

    src = tmp_path / "draft"
    shutil.copytree(draft_dir, src)
    config = json.loads((src / "config.json").read_text())
    del config["block_size"]  # the config class would quietly fill in 8
    (src / "config.json").write_text(json.dumps(config))
    msg = main_error("export", str(src), str(tmp_path / "out"), "--target", str(tiny_smol_dir))
    assert "lacks block_size" in msg


def _no_weights(*a, **k):
    raise AssertionError("target weights were loaded before the layer check")


@pytest.mark.parametrize("command", ["train", "dump"])
@pytest.mark.parametrize("layers, needles", [
    # the default rule (num_capture_layers=5) on the 4-layer tiny target gives [1, 1, 1, 1, 1]
    ([], ("target.num_capture_layers=5", "4-layer target", "[1, 1, 1, 1, 1]", "target.num_capture_layers=K with K <= 1",
          "target.layer_ids=[...]")),
    (["target.layer_ids=[0,2,2]"], ("target.layer_ids [0, 2, 2] repeat layer(s) [2] of a 4-layer target",)),
])
def test_repeated_captured_layers_are_one_line_before_any_weight_loads(tiny_smol_dir, tmp_path, monkeypatch, command,
                                                                       layers, needles):
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", _no_weights)
    msg = main_error(command, f"target.path={tiny_smol_dir}", "target.name=tiny-smol", *layers,
                     f"data.train_path={ROOT / 'data' / 'sample_chat.jsonl'}", "eval.enabled=false",
                     f"run_dir={tmp_path / 'run'}", f"dump.out_dir={tmp_path / 'dump'}", "train.device=cpu")
    assert msg.startswith(f"splitserve {command}: ")
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert not (tmp_path / "dump").exists()


def test_export_of_a_draft_with_repeated_layers_is_one_line(tiny_smol_dir, draft_dir, tmp_path, monkeypatch):
    import json
    import shutil

    src = tmp_path / "draft"
    shutil.copytree(draft_dir, src)
    config = json.loads((src / "config.json").read_text())
    config["target_layer_ids"] = [1, 1, 1]  # what a default rule gave a small target before it was refused
    (src / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr("splitserve.target.shared_weights.read_shared_weights", _no_weights)
    for fmt in ("sglang", "speculators", "hf"):
        msg = main_error("export", str(src), str(tmp_path / fmt), "--format", fmt, "--target", str(tiny_smol_dir))
        assert msg.startswith("splitserve export: draft ") and "[1, 1, 1]" in msg and "repeating layer(s) [1]" in msg
        assert "target.num_capture_layers=K with K <= 1 on its 4-layer target" in msg and not (tmp_path / fmt).exists()
