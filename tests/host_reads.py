"""Tests' check that a serving step never waits on the host: every way a tensor value can reach
Python is counted (HOST_READS), and every op that makes the host wait for the device or has a
value-dependent output shape is caught as it dispatches (SyncOps). A step that passes on the CPU
can be captured as a CUDA graph; one that fails would turn graphs off on a GPU (a slow fallback
that stays exact, so no exactness test sees it)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")

aten = torch.ops.aten
# Tensor -> Python number (every .item()/int()/bool(), including C++'s own, e.g. x[n] for a 0-d
# tensor n), and ops whose output shape depends on values.
SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
            aten.equal.default, aten.is_nonzero.default, aten._unique2.default, aten.unique_consecutive.default}
STEP_PARAMS = ((0.0, (0, 1.0)), (1.0, (0, 1.0)), (1.0, (5, 0.8)))  # (temperature, (top_k, top_p))


class SyncOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        bool_index = func is aten.index.Tensor and any(
            t is not None and t.dtype == torch.bool for t in (args[1] if len(args) > 1 else []))
        if func in SYNC_OPS or bool_index:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def round_steps(engine, ar: bool = True) -> list:
    """The engine's spec round (and, with ar, its AR step) at its widest window, as the
    (temperature, trunc) callables assert_steps_sync_free runs."""
    w = engine.windows[-1]
    steps = [lambda t, tr: engine._spec_round(t, w, tr)]
    return steps + [lambda t, tr: engine._ar_step(t, w, tr)] if ar else steps


def count_host_reads(monkeypatch) -> list[str]:
    """From now on (this test), every HOST_READS call appends its name to the returned list."""
    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=original, _name=name, **k):
            reads.append(_name)
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def assert_steps_sync_free(monkeypatch, steps) -> list[str]:
    """Run each of `steps` (callables taking temperature, trunc) at every STEP_PARAMS: none may
    read a value on the host or dispatch a sync op. -> the read counter, for later checks."""
    reads = count_host_reads(monkeypatch)
    for temperature, trunc in STEP_PARAMS:
        with SyncOps() as syncs:
            for step in steps:
                step(temperature, trunc)
        assert syncs.seen == [], (temperature, trunc, syncs.seen)
    assert reads == [], reads
    return reads
