"""Run a function on N local CPU ranks (gloo, loopback, a free port) with a hard timeout."""

import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),  # a stuck collective fails the test instead of hanging
    )
    try:
        fn(rank, world, *args)
        # Leave together: rank 0 hosts the rendezvous store, and a rank still tearing down
        # gloo after rank 0 has exited aborts. (On error, skip it: the peer may never come.)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., None], world: int, *args: Any) -> None:
    """Call fn(rank, world, *args) in `world` spawned processes; re-raise any rank's error.

    `fn` must be a module-level function (spawn pickles it by name).
    """
    mp.start_processes(
        _entry, args=(world, free_port(), fn, args), nprocs=world, join=True, start_method="spawn"
    )
