"""target.backend=sglang: clear refusal where it cannot run (CPU tests), and parity with the
transformers backend where it can (skipped unless sglang and a CUDA GPU are present)."""

import importlib.util

import pytest
import torch

import splitserve.target.sglang_backend as sb
from splitserve.config import RunConfig, TargetConfig
from splitserve.target import load_target

HAVE_SGLANG_GPU = importlib.util.find_spec("sglang") is not None and torch.cuda.is_available()


def _no_heavy_work(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the target was loaded before the requirement check")

    monkeypatch.setattr(sb, "start_runner", refuse)
    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", refuse)


def test_missing_sglang_fails_at_start(monkeypatch):
    _no_heavy_work(monkeypatch)
    monkeypatch.setattr(sb, "_sglang_installed", lambda: False)
    with pytest.raises(sb.SGLangUnavailable, match=r"sglang package is not installed \(pip install -e '\.\[sglang\]'"):
        load_target(TargetConfig(backend="sglang"))


def test_no_cuda_fails_at_start(monkeypatch):
    _no_heavy_work(monkeypatch)
    monkeypatch.setattr(sb, "_sglang_installed", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(sb.SGLangUnavailable, match="no CUDA GPU is visible") as err:
        load_target(TargetConfig(backend="sglang"))
    assert "not installed" not in str(err.value)


def test_cpu_device_is_refused(monkeypatch):
    monkeypatch.setattr(sb, "_sglang_installed", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert sb.missing_requirements("cpu") == ["target.device=cpu is not a CUDA device"]
    assert sb.missing_requirements("cuda:1") == [] and sb.missing_requirements("auto") == []


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match=r"transformers.*sglang.*'vllm'"):
        load_target(TargetConfig(backend="vllm"))


@pytest.mark.parametrize("command", ["train", "dump"])
def test_train_and_dump_go_through_the_backend_choice(monkeypatch, tmp_path, command):
    """Both entry points load their target through load_target, so the refusal comes first."""
    _no_heavy_work(monkeypatch)
    monkeypatch.setattr(sb, "_sglang_installed", lambda: False)
    cfg = RunConfig()
    cfg.target.backend = "sglang"
    cfg.run_dir = str(tmp_path / "run")
    cfg.dump.out_dir = str(tmp_path / "dump")
    if command == "train":
        from splitserve.train.loop import train as run
    else:
        from splitserve.offline.capture import run_dump as run
    with pytest.raises(sb.SGLangUnavailable, match="target.backend=sglang cannot start"):
        run(cfg)


def test_decoding_is_refused_with_a_pointer():
    t = sb.SGLangTarget.__new__(sb.SGLangTarget)
    with pytest.raises(NotImplementedError, match="target.backend=transformers"):
        t.new_cache()


# ---- parity on a GPU with sglang installed -------------------------------------------------


@pytest.mark.skipif(not HAVE_SGLANG_GPU, reason="needs sglang and a CUDA GPU")
def test_sglang_captures_match_transformers_within_bf16():
    from splitserve.target.hf import load_hf_target

    cfg = TargetConfig(dtype="bfloat16", device="cuda", sglang_mem_fraction=0.3)  # embedded SmolLM2-135M
    hf = load_hf_target(cfg)
    sg = load_target(TargetConfig(**{**cfg.__dict__, "backend": "sglang"}))
    assert sg.info == hf.info
    v = hf.info.vocab_size
    # bit-equal: both loaders copy the same checkpoint tensors (no arithmetic)
    torch.testing.assert_close(sg.embed_weight().float(), hf.embed_weight()[:v].float(), rtol=0, atol=0)
    torch.testing.assert_close(sg.lm_head_weight().float(), hf.lm_head_weight()[:v].float(), rtol=0, atol=0)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, v, (2, 96), generator=gen).cuda()
    mask = torch.ones_like(ids)
    mask[1, 70:] = 0  # a right-padded row
    got, want = sg.capture(ids, mask), hf.capture(ids, mask)
    d = hf.info.hidden_size
    for name, a, b in (("aux", got.aux, want.aux), ("final", got.final, want.final)):
        for row, n in ((0, 96), (1, 70)):
            for j in range(a.shape[-1] // d):  # per captured layer: relative error of the whole (T, D) slab
                x, y = a[row, :n, j * d : (j + 1) * d].float(), b[row, :n, j * d : (j + 1) * d].float()
                rel = ((x - y).norm() / y.norm()).item()
                assert rel < 2e-2, f"{name} row {row} layer slot {j}: relative error {rel:.4f}"
        assert not a[1, 70:].any()  # padding stays zero
