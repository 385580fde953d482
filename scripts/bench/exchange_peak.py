"""The peak bytes of sharded Muon's exchange buffers (dist.parallelism=fsdp_gather), by
optim.muon.exchange_in_flight and exchange_chunk, at a preset's real Muon shapes on W gloo
ranks.

Each rank holds dim-0 shards of the preset's Muon matrices (taken from its model, built on the
meta device) and takes one step for each bound; `ShardedOwners.peak_bytes` is the most bytes
of send and receive buffers live at once (optim/muon/fsdp_strategies.py). The buffers' sizes do not
depend on the values or on the iteration count, so Newton–Schulz runs one iteration here (the
step is otherwise what a run computes). "all at once, kept" is the exchange as it was before
the bound existed, from the same plan: every bucket's buffers, both ways, live until the last
bucket is unpacked. The second table adds the local gradients still held at that peak:
all of them with optim.muon.free_grads=false (as before it existed), none with the default,
which drops each once its momentum has read it.

    python -m scripts.bench.exchange_peak                        # record #89, 8 ranks
    python -m scripts.bench.exchange_peak --world 4 --experiment record_medium_2025_12_31
"""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.launch.dist import free_port

# (optim.muon.exchange_in_flight, optim.muon.exchange_chunk)
BOUNDS = ((0, 0), (1, 0), (0, -1), (1, -1), (2, -1), (1, 1))


def muon_shapes(experiment: str) -> list[tuple[torch.Size, str]]:
    """The shapes of the preset's Muon matrices, from its model on the meta device, each with
    what its leading dim stacks ("" for a matrix; optim/muon/stacks.py)."""
    from omegaconf import open_dict

    from model import GPT
    from optim.groups import partition_params
    from optim.muon.stacks import mark_stacks, stack_of
    from trainer.cli.overrides import compose_run
    from trainer.config import to_config

    cfg = compose_run([f"experiment={experiment}"], Path(__file__).parents[2] / "conf")
    with open_dict(cfg):
        cfg.pop("hydra")
    cfg.run_dir = "."
    conf = to_config(cfg)
    with torch.device("meta"):
        model = GPT(conf.model, conf.train.stages)
    named = partition_params(model, conf.optim.name, conf.optim.roles)
    mark_stacks(named["muon"], conf.optim.muon.expert_keys)
    return [(p.shape, stack_of(p)) for _, p in named["muon"]]


def rank_main(rank: int, world: int, port: int, shapes: list, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from optim.muon.optimizer import Muon

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(0)
    params, grads = [], []
    for s, what in shapes:  # every rank draws the same whole tensor and keeps its rows
        p = torch.nn.Parameter(distribute_tensor(torch.randn(s, generator=gen) * 0.02, mesh,
                                                 [Shard(0)], src_data_rank=None))  # fmt: skip
        if what:
            p.stack_of = what
        grads.append(distribute_tensor(torch.randn(s, generator=gen), mesh, [Shard(0)],
                                       src_data_rank=None))  # fmt: skip
        params.append(p)
    peaks, held = {}, {}
    for in_flight, chunk in BOUNDS:
        for free in (True, False):
            bound = {"exchange_in_flight": in_flight, "exchange_chunk": chunk}
            opt = Muon(params, ns_dtype=torch.bfloat16, parallelism="fsdp_gather", ns_steps=1,
                       free_grads=free, **bound)  # fmt: skip
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            opt.step()
            peaks[(in_flight, chunk)] = opt.strategy.peak_bytes
            held[(in_flight, chunk, free)] = opt.strategy.peak_held_bytes
    if rank == 0:
        torch.save((peaks, held), Path(out) / "peaks.pt")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", default="record_2026_07_17")
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--out", default="/tmp/exchange_peak")
    args = parser.parse_args()
    from optim.muon.exchange_plan import ExchangePlan

    matrices = muon_shapes(args.experiment)
    # expert stacks are stepped where they live: only the others are exchanged
    shapes = [s for s, what in matrices if what != "experts"]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    torch.multiprocessing.start_processes(
        rank_main, args=(args.world, free_port(), matrices, args.out), nprocs=args.world,
        join=True, start_method="spawn",
    )  # fmt: skip
    peaks, held = torch.load(Path(args.out) / "peaks.pt")
    plan = ExchangePlan(shapes, args.world, 0)
    pairs = [(sum(b.send) + sum(b.recv)) * 2 for b in plan.buckets]  # bf16: 2 bytes a value
    kept = 2 * sum(pairs)
    values = sum(s.numel() for s in shapes)
    print(f"{args.experiment}: {len(shapes)} Muon matrices, {values / 1e6:.1f}M values, "
          f"{len(plan.buckets)} shape buckets; rank 0 of {args.world}, bf16 exchange")  # fmt: skip
    base = peaks[(0, 0)]
    print(f"{'in_flight, chunk':<26} {'peak MB':>8} {'vs all at once':>15}")
    print(f"{'all at once, kept (before)':<26} {kept / 1e6:>8.1f} {kept / base:>14.2f}x")
    for (in_flight, chunk), peak in peaks.items():
        label = f"{in_flight}, {chunk}" + (" (all at once)" if (in_flight, chunk) == (0, 0) else "")
        print(f"{label:<26} {peak / 1e6:>8.1f} {peak / base:>14.2f}x")
    print("\nwith the Muon gradients still held at that peak (optim.muon.free_grads):")
    print(f"{'in_flight, chunk':<26} {'kept MB':>8} {'freed MB':>9} {'freed / kept':>13}")
    for in_flight, chunk in BOUNDS:
        kept_mb, freed_mb = held[(in_flight, chunk, False)], held[(in_flight, chunk, True)]
        print(f"{f'{in_flight}, {chunk}':<26} {kept_mb / 1e6:>8.1f} {freed_mb / 1e6:>9.1f} "
              f"{freed_mb / kept_mb:>12.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
