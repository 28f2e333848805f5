"""What torch.compile makes of each Triton launcher: run by tests/test_traced_kernels.py in a
subprocess (Triton compiled, not interpreted, so that torch can read each kernel's IR; no GPU
needed: the IR is generated for an sm_90 target named here, never compiled to machine code).

Each launcher is traced the way the compiler's front end traces it: fake CUDA tensors under
functionalization (`make_fx(dispatch_functionalize(fn))`), which decomposes every registered
`triton_op` into its kernel launches. For each launch torch analyses the kernel's IR to find
the tensors it writes; the functional graph copies those around the launch, and writes them
back into the graph's inputs. Prints one JSON object: case -> {"cloned_inputs": the graph inputs
(input0, input1, ... in argument order) some launch was taken to write, "launches": kernel
launches in the graph}.
"""

from __future__ import annotations

import json

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx
from triton.backends.compiler import GPUTarget
from triton.runtime import driver


class _Sm90:
    """A stand-in for the CUDA driver: torch asks it only which target to generate IR for."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)


driver.set_active(_Sm90())

from splitserve import accel  # noqa: E402  (after the driver is set)
from splitserve.models import markov_step_kernel as mk  # noqa: E402
from splitserve.target.native import attention_kernel as ak  # noqa: E402
from splitserve.target.native import linear_kernel as lk  # noqa: E402
from splitserve.target.native import pointwise_kernel as pk  # noqa: E402

accel._major = lambda index: 9  # an sm_90 device, where the launchers would turn PDL on
ak._sm_count = lambda index: 132  # the split count asks the device for its SMs
MODE = FakeTensorMode()
BF, F32 = torch.bfloat16, torch.float32


def fake(*shape: int, dtype: torch.dtype = BF) -> FakeTensor:
    return FakeTensor(MODE, torch.empty(shape, dtype=dtype, device="meta"), torch.device("cuda", 0))


def cases() -> dict:
    fp8 = torch.float8_e4m3fn
    d, f, hd, hq, hkv, length, v, r = 256, 512, 64, 4, 2, 1024, 2048, 32
    return {
        "fp8 product, 16 rows (an FP8 draft's layer)": (
            lambda x, w, s: lk.linear(x, w, s), (fake(16, d), fake(f, d, dtype=fp8), fake(f, dtype=F32))),
        "bf16 norm + gate|up + SiLU, 1 row": (
            lambda x, w, g: lk.product(x, w, norm_weight=g, eps=1e-6, silu=True),
            (fake(1, d), fake(2 * f, d), fake(d))),
        "fp8 norm + q|k|v, 17 rows (an FP8 target's verify)": (
            lambda x, w, s, g: lk.product(x, w, s, norm_weight=g, eps=1e-6),
            (fake(17, d), fake(f, d, dtype=fp8), fake(f, dtype=F32), fake(d))),
        "bf16 product + residual, 17 rows": (
            lambda x, w, res: lk.product(x, w, residual=res), (fake(17, f), fake(d, f), fake(17, d))),
        "split-KV attention, 16 queries": (
            lambda q, k, vv, pos: ak.decode_attention(q, k, vv, pos, length, hd**-0.5),
            (fake(16, hq, hd), fake(hkv, length, hd), fake(hkv, length, hd), fake(16, dtype=torch.int64))),
        "rms_norm and add_rms_norm": (
            lambda x, res, g: (pk.rms_norm(x, g, 1e-6), *pk.add_rms_norm(x, res, g, 1e-6)),
            (fake(16, d), fake(16, d), fake(d))),
        "rope_and_write (writes k_cache, v_cache)": (
            lambda qkv, cos, sin, k, vv, pos: pk.rope_and_write(qkv, cos, sin, None, None, 1e-6, k, vv, pos, hq),
            (fake(16, (hq + 2 * hkv) * hd), fake(length, hd, dtype=F32), fake(length, hd, dtype=F32),
             fake(hkv, length, hd), fake(hkv, length, hd), fake(16, dtype=torch.int64))),
        "silu_mul": (pk.silu_mul, (fake(16, 2 * f),)),
        "Markov greedy chain": (
            mk.markov_greedy_chain,
            (fake(16, v, dtype=F32), fake(v, r), fake(v, r), fake(dtype=torch.int64))),
    }


def probe(fn, args: tuple) -> dict:
    with MODE:
        gm = make_fx(dispatch_functionalize(fn))(*args)
    names = {n: f"input{i}" for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    launches = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.triton_kernel_wrapper_functional]
    cloned = set()
    for node in launches:
        kwargs = node.kwargs["kwargs"]
        cloned |= {names[kwargs[k]] for k in node.kwargs["tensors_to_clone"] if kwargs[k] in names}
    return {"cloned_inputs": sorted(cloned), "launches": len(launches)}


if __name__ == "__main__":
    print(json.dumps({name: probe(fn, args) for name, (fn, args) in cases().items()}))
