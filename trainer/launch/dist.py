"""The process group: start it, check that all ranks run the same config, reduce, tear down.

Ranks come from torchrun's environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
`MASTER_PORT`), read by `trainer.runtime.init_runtime`; a world of one needs no group at all.
The backend follows the device: NCCL on CUDA, gloo on CPU.
"""

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP

from optim.parallelism import PARALLELISMS
from trainer.config import Config, DistConfig
from trainer.config_checks import flatten
from trainer.launch.report import PeerFailed
from trainer.runtime import Runtime, resolve_backend

T = TypeVar("T")


@contextmanager
def process_group(rt: Runtime, cfg: DistConfig) -> Iterator[dist.ProcessGroup | None]:
    """The world group for the duration of the block (None for a single process, except
    under an fsdp dist.parallelism, whose device mesh needs a group even of one rank).

    On success every rank waits for the others before tearing down, so no rank leaves while a
    peer still talks to it; on an error the group is torn down at once (the launcher stops the
    other ranks). Either way the group is destroyed here, never left to interpreter exit.
    """
    alone = rt.world_size == 1
    if alone and not PARALLELISMS[cfg.parallelism].fsdp:
        yield None
        return
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised; train() starts its own")
    backend = resolve_backend(cfg.backend, rt.device)
    timeout = timedelta(seconds=cfg.timeout_s)
    # One rank needs no rendezvous: an in-memory store (no torchrun variables required).
    store = dist.HashStore() if alone else _attempt_store(timeout)
    dist.init_process_group(
        backend,
        timeout=timeout,
        device_id=rt.device if backend == "nccl" else None,
        **({"store": store, "rank": rt.rank, "world_size": rt.world_size} if store else {}),
    )
    finished = False
    try:
        yield dist.group.WORLD
        finished = True
    finally:
        if finished:
            dist.barrier()
        dist.destroy_process_group()


@contextmanager
def local_main_first(rt: Runtime, what: str = "setting up") -> Iterator[None]:
    """Local rank 0 of each node runs the block first, then the node's other ranks.

    For work that fills a node-local cache (building the sample corpus): the others then
    find it done instead of all doing it at once. An error in the block stops every rank at
    once (the others raise PeerFailed about `what`) rather than leaving them waiting for a
    rank that has gone.
    """
    if not dist.is_initialized():
        yield
        return
    if rt.local_rank != 0:
        raise_together(None, rt, what)  # the local main ranks' turn
    error: Exception | None = None
    try:
        yield
    except Exception as e:  # raised below, on every rank
        error = e
    raise_together(error, rt, what)
    if rt.local_rank == 0:
        raise_together(None, rt, what)  # the other ranks' turn


def _attempt_store(timeout: timedelta) -> dist.Store | None:
    """Under torchrun's shared agent store, a key space of this restart attempt's own.

    torchrun (c10d rendezvous) keeps one TCP store for all restarts, and torch's env://
    rendezvous adds no per-attempt prefix, so a restarted rank would read the dead attempt's
    peer addresses and fail to connect (pytorch/pytorch#135712, #167288). Prefixing by the
    restart count keeps attempts apart. None: let env:// set up the store as usual.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"gpt-speedrun/attempt-{attempt}", store)


def agree_on_config(conf: Config, rt: Runtime) -> Config:
    """Check that every rank composed the same config; take rank 0's run directory.

    Rank 0 sends its resolved config to all; a rank whose values differ names the keys, and
    every rank raises (so none waits forever in a collective). `run_dir` may differ (ranks
    other than 0 create no directory), so rank 0's is adopted everywhere.
    """
    if rt.world_size == 1:
        return conf
    mine = flatten(asdict(conf))
    theirs = _broadcast_object(mine if rt.is_main else None)
    differ = sorted(
        k for k in mine.keys() | theirs.keys() if k != "run_dir" and mine.get(k) != theirs.get(k)
    )
    bad = torch.tensor([float(bool(differ))], device=rt.device)
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if differ:
        shown = ", ".join(f"{k}: {mine.get(k)!r} here, {theirs.get(k)!r} on rank 0" for k in differ)
        raise ValueError(f"rank {rt.rank} was given a different config than rank 0: {shown}")
    if bad.item():
        raise ValueError("ranks were given different configs; the differing rank names the keys")
    conf.run_dir = theirs["run_dir"]
    return conf


def wrap_ddp(model: nn.Module, skip: list[str]) -> DDP | None:
    """DDP around `model`, leaving alone the parameters named in `skip` and every buffer.

    `skip` is for gradients reduced elsewhere (Muon's, with dist.parallelism=ddp_owners;
    every one under ddp_row_shards); the buffers (rotary frequencies) derive from the
    config, so every rank has them already and broadcasting them each forward would be wasted
    traffic. Where `skip` holds every trainable parameter there is nothing for DDP to do:
    the parameters are broadcast from rank 0, as DDP's construction would, and None returned.
    """
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    if names <= set(skip):
        with torch.no_grad():
            for p in model.parameters():
                dist.broadcast(p.data, src=0)
        return None
    ignored = [*skip, *(name for name, _ in model.named_buffers())]
    DDP._set_params_and_buffers_to_ignore_for_model(model, ignored)
    return DDP(model, gradient_as_bucket_view=True)


def all_reduce_sum(t: Tensor) -> Tensor:
    """The sum of `t` over all ranks, in place (a no-op without a process group)."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def main_decides(fn: Callable[[], T], rt: Runtime) -> T:
    """Run `fn` on rank 0 and give every rank its result, or raise its error on every rank.

    For decisions that must agree across ranks (which checkpoint to resume): ranks on other
    nodes may not even see the same files.
    """
    if rt.world_size == 1:
        return fn()
    outcome: tuple[bool, Any] = (True, None)
    if rt.is_main:
        try:
            outcome = (True, fn())
        except Exception as e:  # sent to every rank, raised everywhere below
            outcome = (False, e)
    ok, value = _broadcast_object(outcome if rt.is_main else None)
    if not ok:
        raise value
    return value


def raise_together(error: BaseException | None, rt: Runtime, what: str) -> None:
    """Raise on every rank if `error` is set on any, so no rank waits in a collective for a
    peer that has failed. The failing rank raises its own error; the others raise PeerFailed,
    which says where to look.
    """
    if rt.world_size > 1:
        flag = torch.tensor([float(error is not None)], device=rt.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if error is None and flag.item():
            raise PeerFailed(f"{what} failed on another rank; its error says why")
    if error is not None:
        raise error


def gather(obj: Any, rt: Runtime) -> list[Any]:
    """`obj` from every rank, in rank order (on every rank)."""
    if rt.world_size == 1:
        return [obj]
    out: list[Any] = [None] * rt.world_size
    dist.all_gather_object(out, obj)
    return out


def _broadcast_object(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for one-machine process groups: tests and
    benchmarks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
