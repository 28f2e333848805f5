"""Failure propagation for split jobs: no rank may hang when another one dies.

Every rank heartbeats into a shared key-value store (torchrun's rendezvous store, or a
FileStore in tests) and a daemon thread watches the others. A rank that raises publishes
"rank R (role): error" before exiting; a rank that dies silently (SIGKILL, OOM) stops
heartbeating. Either way every other rank prints which rank and role failed and exits non-zero
within `stale_after_s + interval_s`, even while blocked inside a collective.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

FAILED_KEY = "splitserve/failed"


def _hb_key(rank: int) -> str:
    return f"splitserve/heartbeat/{rank}"


class Watchdog:
    def __init__(
        self,
        store,
        rank: int,
        world_size: int,
        roles: dict[int, str],
        interval_s: float = 1.0,
        stale_after_s: float = 30.0,
        exit_fn: Callable[[int], None] = os._exit,
    ):
        self.store, self.rank, self.world_size, self.roles = store, rank, world_size, roles
        self.interval_s, self.stale_after_s, self.exit_fn = interval_s, stale_after_s, exit_fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="splitserve-watchdog", daemon=True)
        self._last_seen: dict[int, tuple[str, float]] = {}

    def who(self, rank: int) -> str:
        return f"rank {rank} ({self.roles.get(rank, 'unknown role')})"

    def start(self) -> "Watchdog":
        self._beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        """A clean finish: stop watching (peers that finish later must not look dead)."""
        self._stop.set()
        self.store.set(_hb_key(self.rank), "done")

    def report_failure(self, exc: BaseException) -> None:
        """Publish this rank's failure so that every other rank stops at once."""
        msg = f"{self.who(self.rank)} failed: {type(exc).__name__}: {exc}"
        try:
            self.store.set(FAILED_KEY, msg)
        except Exception:  # the store itself may be gone; peers then see a stale heartbeat
            pass
        print(f"[splitserve] {msg}", file=sys.stderr, flush=True)

    def _beat(self) -> None:
        self.store.set(_hb_key(self.rank), str(time.time()))

    def _failed_peer(self) -> str | None:
        if self.store.check([FAILED_KEY]):
            return self.store.get(FAILED_KEY).decode()
        now = time.monotonic()
        for peer in range(self.world_size):
            if peer == self.rank or not self.store.check([_hb_key(peer)]):
                continue
            value = self.store.get(_hb_key(peer)).decode()
            if value == "done":
                continue
            # Compare a peer's heartbeat with its previous value on *our* clock, so ranks on
            # hosts with skewed clocks never look dead.
            prev = self._last_seen.get(peer)
            if prev is None or prev[0] != value:
                self._last_seen[peer] = (value, now)
            elif now - prev[1] > self.stale_after_s:
                return f"{self.who(peer)} stopped responding (no heartbeat for {now - prev[1]:.0f} s)"
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._beat()
                failure = self._failed_peer()
            except Exception as exc:  # the store host (rank 0) died
                failure = f"lost the rendezvous store ({type(exc).__name__}: {exc}); rank 0 is probably dead"
            if failure and not self._stop.is_set():
                print(f"[splitserve] {self.who(self.rank)} exiting: {failure}", file=sys.stderr, flush=True)
                self.exit_fn(1)
                return
