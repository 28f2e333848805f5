"""Under torch.compile no kernel launch is taken to write the tensors it only reads.

torch decides which tensors a traced Triton launch writes by reading the kernel's IR. Inline
assembly it cannot read (the device side of programmatic dependent launch) makes it assume the
launch writes every tensor it is passed, and the compiled graph then marks each of them to be
cloned around the launch: an FP8 draft's weights (the likely cause of its 2.7 ms a round), the draft's
context K/V cache, the Markov head's tables. A launcher traced by the compiler therefore launches without PDL
(`accel.pdl_args`). tests/traced_kernels_probe.py traces every launcher the compiled round runs,
on fake CUDA tensors (no GPU), and reports which graph inputs some launch was taken to write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from splitserve.accel import HAS_TRITON

PROBE = Path(__file__).with_name("traced_kernels_probe.py")
# the inputs a launcher declares it writes (triton_op mutates_args), by position
WRITES = {"rope_and_write (writes k_cache, v_cache)": ["input3", "input4"]}


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_traced_launches_copy_only_what_they_write():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # torch reads compiled kernels' IR
    env["PYTHONPATH"] = os.pathsep.join([str(PROBE.parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report) == 9, report
    for case, found in report.items():
        assert found["launches"] >= 1, (case, found)  # the launcher was traced into its kernels
        assert found["cloned_inputs"] == WRITES.get(case, []), (case, found)
