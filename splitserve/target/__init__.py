"""Target backends behind one loader: `target.backend` picks transformers (default) or sglang."""

from __future__ import annotations

BACKENDS = ("transformers", "sglang")
DECODING_BACKENDS = ("transformers",)  # whose targets are also a `DecodingTarget`


def load_target(cfg, device=None):
    """cfg: TargetConfig -> a `CaptureTarget` (splitserve/target/backend.py).

    transformers runs anywhere and is also a `DecodingTarget` (eval, serve); sglang runs the
    target in-process with SGLang's model runner on a CUDA GPU and only captures (train, dump).
    """
    if cfg.backend == "transformers":
        from splitserve.target.hf import load_hf_target

        return load_hf_target(cfg, device)
    if cfg.backend == "sglang":
        from splitserve.target.sglang_backend import load_sglang_target

        return load_sglang_target(cfg, device)
    raise ValueError(f"target.backend must be one of {BACKENDS}, got {cfg.backend!r}")
