"""GPU trace reading (evaluation/gpu_trace.py, used by bench/round_profile.py): which activities the
long in-graph GPU gaps follow."""

from splitserve.evaluation import gpu_trace


def _ev(name, ts, dur):
    return {"name": name, "ts": ts, "dur": dur}


def test_long_gaps_grouped_by_neighbours_and_boundaries_left_out():
    events = [
        _ev("gemm", 0.0, 10.0),
        _ev("norm", 11.0, 2.0),  # 1 µs gap: short
        _ev("copy", 20.0, 1.0),  # 7 µs after norm: long
        _ev("gemm", 30.0, 10.0),  # 9 µs after copy: long
        _ev("norm", 41.0, 2.0),
        _ev("copy", 50.0, 1.0),  # 7 µs after norm again
        _ev("gemm", 100.0, 10.0),  # 49 µs after copy, but a round boundary
        _ev("inner", 102.0, 3.0),  # overlaps gemm: the gap after it is measured from gemm's end (110)
        _ev("argmax", 118.0, 1.0),  # 8 µs after gemm (not after inner)
    ]
    rows = gpu_trace.long_gap_neighbours(events[::-1], boundary_starts={100.0}, threshold_us=5.0)
    got = {(r["before"], r["after"]): (r["count"], r["total_us"]) for r in rows}  # whole µs: exact sums
    assert got == {("norm", "copy"): (2, 14.0), ("copy", "gemm"): (1, 9.0), ("gemm", "argmax"): (1, 8.0)}
    assert rows[0]["before"] == "norm"  # largest total first
