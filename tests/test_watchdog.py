"""A dead or failing rank makes every other rank exit non-zero, naming it, instead of hanging."""

import multiprocessing as mp
import os
import signal
import sys
import time

import pytest

ROLES = {0: "target", 1: "target", 2: "draft"}


def _rank_main(rank: int, world: int, store_path: str, log_dir: str, mode: str) -> None:
    sys.stderr = open(os.path.join(log_dir, f"rank{rank}.log"), "w", buffering=1)
    from torch.distributed import FileStore

    from splitserve.split.watchdog import Watchdog

    store = FileStore(store_path, world)
    wd = Watchdog(store, rank, world, ROLES, interval_s=0.2, stale_after_s=2.0).start()
    time.sleep(1.0)
    if rank == 1 and mode == "raise":
        try:
            raise RuntimeError("target model crashed")
        except RuntimeError as exc:
            wd.report_failure(exc)
            os._exit(1)
    if rank == 1 and mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)  # "blocked in a collective": only the watchdog can end this rank


@pytest.mark.parametrize("mode, expect", [("raise", "target model crashed"), ("kill", "died (process")])
def test_every_rank_exits_naming_the_failed_rank(tmp_path, mode, expect):
    ctx = mp.get_context("spawn")
    world = 3
    procs = [ctx.Process(target=_rank_main, args=(r, world, str(tmp_path / "store"), str(tmp_path), mode))
             for r in range(world)]
    t0 = time.time()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank hung after its peer failed"
    assert time.time() - t0 < 60
    assert all(p.exitcode != 0 for p in procs), [p.exitcode for p in procs]
    for r in (0, 2):
        log = (tmp_path / f"rank{r}.log").read_text()
        assert "rank 1 (target)" in log and expect in log, log
