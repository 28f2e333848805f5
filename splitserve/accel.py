"""Whether this machine can run the Triton kernels: every kernel's dispatcher asks here, and
falls back to its PyTorch reference otherwise (CPU tensors, or a torch build without Triton).
Also how a kernel's launcher is registered, so that torch.compile can trace into it."""

from __future__ import annotations

import functools
import os

import torch
from torch._subclasses.fake_tensor import is_fake

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # CPU-only installs
    HAS_TRITON = False

try:  # Triton >= 3.3: grid dependency control, the device side of programmatic dependent launch
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _HAS_GDC = True
except ImportError:
    _HAS_GDC = False


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


def pdl_usable(t: torch.Tensor) -> bool:
    """Whether kernels on `t`'s device may use programmatic dependent launch (PDL): a launch that
    lets the next kernel start its prologue while this one drains, on Hopper (sm_90) and later.
    The kernels call `griddepcontrol.wait` before touching what earlier kernels wrote, so a kernel
    launched this way is correct after any other kernel. SPLITSERVE_PDL=0 turns it off."""
    if not (triton_usable(t) and _HAS_GDC) or os.environ.get("SPLITSERVE_PDL", "1") == "0":
        return False
    return compute_major(t) >= 9


def compute_major(t: torch.Tensor) -> int:
    """The compute capability's major version of CUDA tensor `t`'s device; 0 off CUDA."""
    if not t.is_cuda:
        return 0
    return _major(t.device.index if t.device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _major(index: int) -> int:
    """The compute capability's major version of CUDA device `index` (asked once: every launch asks)."""
    return torch.cuda.get_device_capability(index)[0]


def traced(t: torch.Tensor) -> bool:
    """Whether `t` is a tensor torch.compile is tracing (a fake or functional tensor), not data:
    a launcher that sees one is being decomposed into the compiled graph, not run."""
    return torch.compiler.is_compiling() or is_fake(t)


def pdl_args(t: torch.Tensor, on: bool | None = None) -> dict:
    """A kernel's launch arguments for PDL on `t`'s device: the kernel's USE_PDL switch, and the
    launch attribute where it is on. on: force it (benchmarks); None: `pdl_usable`, and never for
    a launch torch.compile traces. The device side of PDL is inline assembly that torch's analysis
    of a traced kernel cannot read, so it takes such a kernel to write every tensor it is passed
    and the compiled graph marks them all for copying around the launch: weights, caches and
    inputs (the likely cause of an FP8 draft's slowness; tests/test_traced_kernels.py). The
    kernels of an eager or graph-captured forward keep PDL."""
    on = (not traced(t) and pdl_usable(t)) if on is None else on
    return dict(USE_PDL=True, launch_pdl=True) if on else dict(USE_PDL=False)


if HAS_TRITON:

    @triton.jit
    def pdl_prologue_done(USE_PDL: tl.constexpr):
        """In a kernel launched with PDL: let the next kernel launch now (its own prologue overlaps
        this kernel), then wait until every earlier kernel has finished and its writes are
        visible. Before this call a kernel may read only what no kernel writes (weights); after
        it, anything. Every PDL kernel calls it, so "finished" reaches back through the chain."""
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
