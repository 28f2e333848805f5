"""Failure propagation for split jobs: no rank may hang when another one dies.

Every rank heartbeats into a shared key-value store (torchrun's rendezvous store, or a
FileStore in tests) and a daemon thread watches the others. A rank that raises publishes
"rank R (role): error" before exiting; a rank that dies silently (SIGKILL, OOM) stops
heartbeating. Either way every other rank prints which rank and role failed and exits non-zero
within `stale_after_s + interval_s`, even while blocked inside a collective.

Two faster paths cover the common cases on one node: a heartbeat names its host and pid, so a
peer process that is gone is noticed at the next check; and when the launcher (torchrun) tears
the job down with SIGTERM after a worker died, the watchdog thread (not the main thread, which
may be stuck in a collective) names the failed peer before this rank exits.

The heartbeat also carries a small status dict (a rank's live counters), so the rank that logs
can read every other rank's telemetry without an extra collective.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

FAILED_KEY = "splitserve/failed"


def _hb_key(rank: int) -> str:
    return f"splitserve/heartbeat/{rank}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (dead, not yet reaped by the launcher) is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


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
        self.status: dict = {}  # published with every heartbeat; replace it, do not mutate it
        self._host = socket.gethostname()
        self._sigterm_r: int | None = None
        self._exiting: str | None = None  # set when leaving because of another rank's failure

    def who(self, rank: int) -> str:
        return f"rank {rank} ({self.roles.get(rank, 'unknown role')})"

    def start(self) -> Watchdog:
        self._beat()
        if threading.current_thread() is threading.main_thread():
            self._catch_sigterm()
        self._thread.start()
        return self

    def _catch_sigterm(self) -> None:
        """SIGTERM wakes the watchdog thread through a pipe (signal.set_wakeup_fd), because the
        main thread may be blocked in C++ and would never run a Python handler."""
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        signal.signal(signal.SIGTERM, lambda *_: self._terminated())
        self._sigterm_r = r

    def _terminated(self) -> None:
        try:
            cause = self._failed_peer(now_only=True) or "no failed peer found"
        except Exception as exc:  # noqa: BLE001 - any store error: report it, still exit
            cause = f"the rendezvous store is gone ({type(exc).__name__})"
        self._exit_because(cause, prefix="stopped by the launcher; cause: ")

    def _sigterm_seen(self) -> bool:
        if self._sigterm_r is None:
            return False
        try:
            return signal.SIGTERM in os.read(self._sigterm_r, 64)
        except BlockingIOError:
            return False

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

    def fail(self, exc: BaseException) -> None:
        """This rank is going down because of `exc`. If a peer failed first (an error in a
        collective is often just the echo of a dead peer), name that peer as the cause;
        otherwise publish this rank as the failure."""
        try:
            cause = self._failed_peer(now_only=True)
        except Exception:  # noqa: BLE001 - the store may be gone too
            cause = None
        if cause is None:
            self.report_failure(exc)
            return
        self._exiting = cause
        try:
            self._beat()
        except Exception:  # noqa: BLE001, S110 - the store may be gone; the caller exits anyway
            pass
        print(f"[splitserve] {self.who(self.rank)} exiting: {cause} (seen here as {type(exc).__name__}: "
              f"{str(exc)[:200]})", file=sys.stderr, flush=True)

    def _beat(self) -> None:
        beat = {"t": time.time(), "host": self._host, "pid": os.getpid(), "status": self.status}
        if self._exiting:
            beat["exiting"] = self._exiting  # peers report this root cause, not this rank
        self.store.set(_hb_key(self.rank), json.dumps(beat))

    def publish(self, status: dict) -> None:
        """Set this rank's status and write it now (not only at the next beat)."""
        self.status = status
        self._beat()

    def peer_status(self, rank: int) -> dict | None:
        """The status `rank` last published, or None if it has none (or has finished)."""
        if not self.store.check([_hb_key(rank)]):
            return None
        value = self.store.get(_hb_key(rank)).decode()
        if value == "done":
            return None
        return json.loads(value)["status"]

    def _failed_peer(self, now_only: bool = False) -> str | None:
        """A description of the failure that should stop this rank, or None.

        In order: a rank that raised (FAILED_KEY); a peer that is exiting because of another
        failure (its heartbeat carries that root cause, so it propagates instead of the
        secondary exit being blamed); a peer process on this host that is gone (the one silent
        longest, i.e. the first to die); a heartbeat stale for `stale_after_s`. `now_only`:
        also name the peer whose heartbeat is oldest without waiting for it to go stale (we
        are being stopped)."""
        if self.store.check([FAILED_KEY]):
            return self.store.get(FAILED_KEY).decode()
        now = time.monotonic()
        oldest: tuple[float, int] | None = None
        dead: list[tuple[float, str]] = []  # (age of last heartbeat, description)
        stale: str | None = None
        for peer in range(self.world_size):
            if peer == self.rank or not self.store.check([_hb_key(peer)]):
                continue
            value = self.store.get(_hb_key(peer)).decode()
            if value == "done":
                continue
            beat = json.loads(value)
            if beat.get("exiting"):
                return beat["exiting"]
            age = time.time() - beat["t"]
            if beat["host"] == self._host and not _pid_alive(beat["pid"]):
                dead.append((age, f"{self.who(peer)} died (process {beat['pid']} is gone)"))
            if oldest is None or age > oldest[0]:
                oldest = (age, peer)
            # Compare a peer's heartbeat with its previous value on *our* clock, so ranks on
            # hosts with skewed clocks never look dead.
            prev = self._last_seen.get(peer)
            if prev is None or prev[0] != value:
                self._last_seen[peer] = (value, now)
            elif now - prev[1] > self.stale_after_s and stale is None:
                stale = f"{self.who(peer)} stopped responding (no heartbeat for {now - prev[1]:.0f} s)"
        if dead:
            return max(dead)[1]
        if stale:
            return stale
        if now_only and oldest is not None and oldest[0] > 2 * self.interval_s:
            return f"{self.who(oldest[1])} stopped responding (last heartbeat {oldest[0]:.1f} s ago)"
        return None

    def _exit_because(self, cause: str, prefix: str = "") -> None:
        """Tell peers why this rank leaves (they report `cause`, not this rank), then exit."""
        self._exiting = cause
        try:
            self._beat()
        except Exception:  # noqa: BLE001, S110 - the store may be gone; exiting matters more
            pass
        print(f"[splitserve] {self.who(self.rank)} exiting: {prefix}{cause}", file=sys.stderr, flush=True)
        self.exit_fn(1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self._sigterm_seen():
                self._terminated()
                return
            try:
                self._beat()
                failure = self._failed_peer()
            except Exception as exc:  # the store host (rank 0) died
                failure = f"lost the rendezvous store ({type(exc).__name__}: {exc}); rank 0 is probably dead"
            if failure and not self._stop.is_set():
                self._exit_because(failure)
                return
