"""Run a function on N local CPU ranks (gloo, loopback, a free port) with a hard timeout."""

import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.dist import free_port

# A stuck collective fails the test after this long instead of hanging it.
COLLECTIVE_TIMEOUT = timedelta(seconds=60)


def _entry(rank: int, world: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    # One core per rank, as torchrun's OMP_NUM_THREADS=1: ranks with torch's default threads
    # each oversubscribe a small machine (2 ranks × 2 threads on 2 cores ran 2.7× slower).
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )
    try:
        fn(rank, world, *args)
        # Leave together: rank 0 hosts the rendezvous store, and a rank still tearing down
        # gloo after rank 0 has exited aborts. (On error, skip it: the peer may never come.)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _exit_now()


def _exit_now() -> None:
    """Leave a finished rank without interpreter teardown.

    Library threads (gloo's, the store client's) being destroyed during interpreter exit has
    been seen to abort a finished rank ("terminate called without an active exception"),
    rarely; the work and its checks are complete by then, so skip that phase.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn: Callable[..., None], world: int, *args: Any) -> None:
    """Call fn(rank, world, *args) in `world` spawned processes inside one gloo group.

    `fn` must be a module-level function (spawn pickles it by name). Any rank's error is
    re-raised here.
    """
    mp.start_processes(
        _entry, args=(world, free_port(), fn, args), nprocs=world, join=True, start_method="spawn"
    )


def _env_entry(rank: int, world: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    # What torchrun gives each rank; the code under test starts its own process group.
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)  # one core per rank, as torchrun's OMP_NUM_THREADS=1
    fn(rank, world, *args)
    _exit_now()


def run_torchrun_ranks(fn: Callable[..., None], world: int, *args: Any) -> None:
    """Call fn(rank, world, *args) in `world` processes with torchrun's environment variables
    set but no process group: for code (like `train`) that starts its own."""
    mp.start_processes(
        _env_entry,
        args=(world, free_port(), fn, args),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
