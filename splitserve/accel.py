"""Whether this machine can run the Triton kernels: every kernel's dispatcher asks here, and
falls back to its PyTorch reference otherwise (CPU tensors, or a torch build without Triton)."""

from __future__ import annotations

import torch

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:  # CPU-only installs
    HAS_TRITON = False


def triton_usable(t: torch.Tensor) -> bool:
    return HAS_TRITON and t.is_cuda
