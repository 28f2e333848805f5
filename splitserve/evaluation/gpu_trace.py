"""Reading a GPU profile (chrome-trace "X" events: name, ts, dur in µs): busy intervals and the
idle gaps between kernels, grouped by the activities around them. bench/round_profile.py uses it
to find where a speculative round leaves the GPU idle."""

from __future__ import annotations


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or touching (start, end) intervals merged, sorted by start."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def long_gap_neighbours(events: list[dict], boundary_starts: set, threshold_us: float, top: int = 12) -> list[dict]:
    """The GPU gaps longer than threshold_us inside a graph (not at a round boundary), grouped by
    the activity that ends before the gap and the one that starts after it: which graph nodes
    the long gaps follow. events: chrome-trace "X" events (ts, dur, name), any order."""
    evs = sorted(events, key=lambda ev: ev["ts"])
    groups: dict[tuple[str, str], list[float]] = {}
    end, before = None, None  # the latest end so far, and the activity that reached it
    for ev in evs:
        if end is not None and ev["ts"] - end > threshold_us and ev["ts"] not in boundary_starts:
            groups.setdefault((before, ev["name"]), []).append(ev["ts"] - end)
        if end is None or ev["ts"] + ev["dur"] > end:
            end, before = ev["ts"] + ev["dur"], ev["name"]
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [{"before": b[:120], "after": a[:120], "count": len(g), "total_us": sum(g)} for (b, a), g in rows]
