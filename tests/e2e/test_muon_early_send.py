"""The sharded Muon's pipeline (dist.parallelism=fsdp_gather) on 2 gloo ranks: the first
bucket's shards leave as soon as its momentum is done, while the other matrices' momentum is
computed, and each gradient is dropped once taken (optim.muon.free_grads), and neither changes
a bit of one process's parameters."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import optim.muon.optimizer as optimizer_module
from optim.fsdp_rows import local
from optim.muon.exchange_plan import ExchangePlan
from optim.muon.optimizer import Muon
from tests.dist_utils import run_ranks
from tests.e2e.test_sharded_muon import SETTINGS, SHAPES, WORLD, _named_stacks, _problem, _reference


def _spied(events: list[str]) -> tuple:
    """Note each momentum ("m") and each all-to-all ("send") in `events`, in call order."""
    momentum, all_to_all = optimizer_module.momentum, dist.all_to_all_single

    def noted_momentum(*args: object, **kwargs: object) -> object:
        events.append("m")
        return momentum(*args, **kwargs)

    def noted_all_to_all(*args: object, **kwargs: object) -> object:
        events.append("send")
        return all_to_all(*args, **kwargs)

    optimizer_module.momentum, dist.all_to_all_single = noted_momentum, noted_all_to_all
    return momentum, all_to_all


def _pipeline_main(rank: int, world: int, out: str) -> None:
    mesh = init_device_mesh("cpu", (world,))
    results = {}
    for free in (True, False):
        params, grads = _problem()
        shards = _named_stacks([
            torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)], src_data_rank=None))
            for p in params
        ])  # fmt: skip
        opt = Muon(shards, lr=0.05, ns_dtype=torch.float32, parallelism="fsdp_gather",
                   free_grads=free, **SETTINGS[0])  # fmt: skip
        events: list[str] = []
        for step in grads:
            for p, g in zip(shards, step, strict=True):
                p.grad = distribute_tensor(g, mesh, [Shard(0)], src_data_rank=None)
            held = sum(local(p.grad).nbytes for p in shards)
            spied = _spied(events)
            try:
                opt.step()
            finally:
                optimizer_module.momentum, dist.all_to_all_single = spied
        after = [p.grad is None for p in shards]
        got = [p.detach().full_tensor() for p in shards]
        strategy = opt.strategy
        results[free] = (got, events, after, strategy.peak_bytes, strategy.peak_held_bytes, held)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    dist.barrier()


@pytest.mark.timeout(180)
def test_first_bucket_leaves_before_the_momentum_ends(tmp_path: Path) -> None:
    run_ranks(_pipeline_main, WORLD, str(tmp_path))
    want = _reference(SETTINGS[0], torch.float32)
    # Momentum bucket by bucket, each bucket's send as soon as its last matrix is done, then
    # the rows back, one all-to-all per bucket.
    buckets = ExchangePlan([torch.Size(s) for s in SHAPES], WORLD, 0).buckets
    assert len(buckets) > 2
    sends = [e for b in buckets for e in ["m"] * len(b.indices) + ["send"]]
    per_step = sends + ["send"] * len(buckets)
    for rank in range(WORLD):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for free, (got, events, after, peak, peak_held, held) in results.items():
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), free
            assert events == per_step * len(_problem()[1]), (rank, free)
            assert after == [free] * len(SHAPES), (rank, free, after)
            # Freed once taken, no gradient is held at the exchange's peak; kept, all are.
            assert peak_held == peak + (0 if free else held), (rank, free)


def test_keeping_gradients_is_refused_where_none_are_freed() -> None:
    p = torch.zeros(4, 4, requires_grad=True)
    for parallelism in ("ddp_all_gather", "ddp_owners"):
        with pytest.raises(ValueError, match=r"optim\.muon\.free_grads=false keeps the gradients"):
            Muon([p], parallelism=parallelism, free_grads=False)
