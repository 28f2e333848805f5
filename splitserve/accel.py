"""Whether this machine can run the Triton kernels: every kernel's dispatcher asks here, and
falls back to its PyTorch reference otherwise (CPU tensors, or a torch build without Triton).
Also how a kernel's launcher is registered, so that torch.compile can trace into it."""

from __future__ import annotations

import torch

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:  # CPU-only installs
    HAS_TRITON = False


def triton_usable(t: torch.Tensor) -> bool:
    return HAS_TRITON and t.is_cuda


def wrap_triton(kernel):
    """`kernel` for launching inside a `triton_op` (torch.library.wrap_triton: torch.compile then
    sees the launch); on a torch without it (< 2.6), the kernel itself."""
    wrap = getattr(torch.library, "wrap_triton", None)
    return wrap(kernel) if wrap is not None else kernel


def triton_op(name: str, mutates_args: tuple[str, ...] = ()):
    """Decorator: the launcher registered as the custom op `splitserve::name` through
    torch.library.triton_op, so torch.compile traces into its kernels; on a torch without it
    (< 2.6) the launcher itself, which eager code and CUDA graphs run the same way."""

    def register(fn):
        make = getattr(torch.library, "triton_op", None)
        return make(f"splitserve::{name}", fn, mutates_args=mutates_args) if make is not None else fn

    return register
