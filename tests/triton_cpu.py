"""Running the Triton kernels in tests: compiled on CUDA, under Triton's interpreter on a CPU.

tests/conftest.py sets TRITON_INTERPRET=1 on machines without CUDA before anything imports
triton: kernels (and triton.language's own jit helpers such as tl.argmax) are decorated at
import, so the switch cannot be thrown later. Under the interpreter each @triton.jit function's
own Python source runs with NumPy: the numerics of the kernel as written, not of the GPU's
compiled code. A kernel test module starts with

    kern, DEV = kernel_module("splitserve.target.native.pointwise_kernel", "_silu_mul_kernel")
    pytestmark = pytest.mark.usefixtures("triton_numpy_fix")

(the fixture lives in tests/conftest.py).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch

from splitserve.accel import HAS_TRITON


def kernel_module(name: str, jit_attr: str) -> tuple[ModuleType, torch.device]:
    """The kernel module `name` and the device its kernels run on; skips the calling test module
    where triton is not installed, or on a CPU whose triton was imported without the interpreter
    (`jit_attr` names one of the module's kernels, to tell)."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed (pip install triton: its interpreter runs these kernels on a CPU)",
                    allow_module_level=True)
    module = importlib.import_module(name)
    if torch.cuda.is_available():
        return module, torch.device("cuda")
    from triton.runtime import interpreter

    if not isinstance(getattr(module, jit_attr), interpreter.InterpretedFunction):
        pytest.skip("no CUDA and triton was imported without TRITON_INTERPRET=1", allow_module_level=True)
    return module, torch.device("cpu")
