"""Run a function on N local CPU ranks (gloo, loopback, a free port) with a hard timeout.

The ranks are long-lived: a pool of N spawned processes per N, started on first use and
reused by every multi-rank test of the session (of this xdist worker). A job is
fn(rank, world, *args) on every rank, in a fresh process group on a fresh port ("group"), or
with torchrun's environment variables and no group, for code like `train` that starts its
own ("torchrun"). Spawning ranks for each test cost ~3 s of interpreter and torch start-up
per rank, most of a small multi-rank test. After a job each rank leaves no process group and
no torchrun variables behind, and its garbage is collected while its group still exists (so
no object of one job, a sharded model holding the group, is destroyed inside the next); a failed
or timed-out job replaces the whole pool, so the next job starts clean. Any rank's error is
raised in the test with its traceback.

A job during which a rank's process is killed by a signal (a native crash inside torch or
gloo, not a Python error: CI once saw glibc abort a gloo FSDP2 rank with "malloc(): unaligned
tcache chunk detected" after hundreds of jobs in the same processes) runs once more in a fresh
pool, and the test says so on stderr. A job that crashes twice, or fails in Python, fails.
"""

import atexit
import gc
import os
import queue
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.launch.dist import free_port

# A stuck collective fails the job after this long instead of hanging it.
COLLECTIVE_TIMEOUT = timedelta(seconds=60)
# A job no rank finishes in this long fails the test (and replaces the pool).
JOB_TIMEOUT_S = 300.0
# After one rank fails, how long the others get to report before the pool is replaced.
GRACE_S = 5.0
TORCHRUN_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                 "LOCAL_WORLD_SIZE")  # fmt: skip


def _serve(rank: int, world: int, inbox: Any, outbox: Any) -> None:
    """A pool rank: run jobs until told to stop (None)."""
    # One core per rank, as torchrun's OMP_NUM_THREADS=1: ranks with torch's default threads
    # each oversubscribe a small machine (2 ranks × 2 threads on 2 cores ran 2.7× slower).
    torch.set_num_threads(1)
    parent = mp.parent_process()
    while True:
        try:
            job = inbox.get(timeout=5.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return  # the test process is gone (killed): no orphaned ranks
            continue
        if job is None:
            return
        fn, args, mode, port = job
        try:
            _run_job(rank, world, fn, args, mode, port)
            outbox.put((rank, None))
        except BaseException:  # a test's error, reported with its traceback
            outbox.put((rank, traceback.format_exc()))
        finally:
            gc.collect()
            if dist.is_initialized():
                dist.destroy_process_group()
            for key in TORCHRUN_VARS:
                os.environ.pop(key, None)


def _run_job(rank: int, world: int, fn: Callable, args: tuple, mode: str, port: int) -> None:
    if mode == "torchrun":
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
            LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        )  # fmt: skip
        fn(rank, world, *args)
        return
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )  # fmt: skip
    fn(rank, world, *args)
    # Leave together: rank 0 hosts the rendezvous store, and a rank still tearing down gloo
    # after rank 0 has moved on would see its store vanish.
    dist.barrier()


class RankCrashed(RuntimeError):
    """A rank's process was killed by a signal during a job (see the module docstring)."""


class RankPool:
    """`world` spawned ranks that run jobs one at a time (see the module docstring)."""

    def __init__(self, world: int) -> None:
        self.world = world
        ctx = mp.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(world)]
        self.procs = [
            ctx.Process(target=_serve, args=(r, world, self.inboxes[r], self.outbox), daemon=True)
            for r in range(world)
        ]
        for p in self.procs:
            p.start()

    def run(self, fn: Callable[..., None], args: tuple, mode: str) -> None:
        port = free_port()
        for inbox in self.inboxes:
            inbox.put((fn, args, mode, port))
        errors = self._collect()
        if errors:
            text = "\n".join(f"rank {r} failed:\n{e}" for r, e in errors.items())
            signalled = any((p.exitcode or 0) < 0 for p in self.procs)
            raise (RankCrashed if signalled else RuntimeError)(text)

    def _collect(self) -> dict[int, str]:
        """Every rank's error (none: the job succeeded). A rank that dies, a job past
        JOB_TIMEOUT_S, or ranks still busy GRACE_S after another failed count as errors."""
        done: dict[int, str | None] = {}
        limit = time.monotonic() + JOB_TIMEOUT_S
        while len(done) < self.world:
            try:
                rank, error = self.outbox.get(timeout=1.0)
                done[rank] = error
                if error is not None:
                    limit = min(limit, time.monotonic() + GRACE_S)
                continue
            except queue.Empty:
                pass
            for r, p in enumerate(self.procs):
                if r not in done and not p.is_alive():
                    done[r] = f"the rank's process died (exit code {p.exitcode})"
                    limit = min(limit, time.monotonic() + GRACE_S)
            if time.monotonic() >= limit:
                for r in range(self.world):
                    done.setdefault(r, "no result in time (stuck, or waiting for a failed rank)")
        return {r: e for r, e in done.items() if e is not None}

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()


_POOLS: dict[int, RankPool] = {}


def _pool(world: int) -> RankPool:
    if world not in _POOLS:
        if not _POOLS:
            atexit.register(_close_all)
        _POOLS[world] = RankPool(world)
    return _POOLS[world]


def _close_all() -> None:
    while _POOLS:
        _POOLS.popitem()[1].close()


def _submit(fn: Callable[..., None], world: int, args: tuple, mode: str) -> None:
    try:
        _run_once(fn, world, args, mode)
    except RankCrashed as crash:
        print(f"dist_utils: a rank crashed in {fn.__name__}; running it again in fresh "
              f"processes. The crash:\n{crash}", file=sys.stderr)  # fmt: skip
        _run_once(fn, world, args, mode)


def _run_once(fn: Callable[..., None], world: int, args: tuple, mode: str) -> None:
    pool = _pool(world)
    try:
        pool.run(fn, args, mode)
    except BaseException:
        # A failed job may leave ranks mid-collective or dead: start the next job afresh.
        _POOLS.pop(world, None)
        for p in pool.procs:
            p.kill()
        raise


def run_ranks(fn: Callable[..., None], world: int, *args: Any) -> None:
    """Call fn(rank, world, *args) on `world` ranks inside one gloo group.

    `fn` must be a module-level function (the ranks import it by name)."""
    _submit(fn, world, args, "group")


def run_torchrun_ranks(fn: Callable[..., None], world: int, *args: Any) -> None:
    """Call fn(rank, world, *args) on `world` ranks with torchrun's environment variables set
    but no process group: for code (like `train`) that starts its own."""
    _submit(fn, world, args, "torchrun")
