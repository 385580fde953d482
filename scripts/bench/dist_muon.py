"""Benchmark distributed Muon: 2 gloo ranks against 1 process, per exchange mode and sharded
(the rows are dist.parallelism's ddp_all_reduce, ddp_all_gather, ddp_owners and fsdp_gather,
and the first two with optim.muon.exchange_overlap=async).

Two ranks (1 thread each) hold the GPT-2-small Muon matrices. In every round, in the same two
processes: rank 0 alone times a single-process Muon step with 1 thread (the same compute per
rank as each of the 2 ranks) and with 2 threads (the whole machine) while rank 1 waits; then
both ranks time one step of each exchange mode, and the all-reduce of fp32 gradients that DDP
does before the all_reduce/all_gather modes (reduce_scatter does that reduction itself).
Rounds alternate the order of the modes; the report is medians. Bytes per rank per step are
read from the loopback interface's counters (/proc/net/dev, all traffic of the two ranks,
halved) and compared with the ring formulas:

    all_reduce      2·(W-1)/W·P·b      (b: Newton–Schulz dtype, bf16 = 2 bytes)
    all_gather        (W-1)/W·P·b
    reduce_scatter  2·(W-1)/W·P·4      (fp32 gradients scattered, fp32 parameters gathered)
    DDP gradients   2·(W-1)/W·P·4      (before all_reduce / all_gather only)
    sharded         2·(W-1)/W²·P·b     (fsdp_gather: shards to owners and back)
    FSDP gradients    (W-1)/W·P·4 + (W-1)/W·P·4   (reduce-scatter the gradients, all-gather
                                        the parameters for the next forward: fp32 on CPU)

The "async" rows start each run's exchange (gloo's own async collective) as soon as its
Newton–Schulz is done, against the blocking ring after all of it in the rows above.

The sharded row is Muon's sharded strategy on dim-0 DTensor shards of the same matrices: every rank
keeps 1/W of the momentum, and "vs replicated" is its ratio to the all_gather mode's step,
timed in the same rounds.

    python scripts/bench/dist_muon.py                  # 124M shapes, 5 rounds
    python scripts/bench/dist_muon.py --shapes tiny --rounds 20
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from optim.muon.exchange import EXCHANGES, PARALLELISM_OF
from optim.muon.ns_dtype import resolve_ns_dtype
from optim.muon.optimizer import Muon
from scripts.bench.muon_step import SHAPE_SETS
from trainer.launch.dist import free_port

WORLD = 2
OVERLAPPED = ("all_gather", "all_reduce")  # optim.muon.exchange_overlap=async applies to these
KW = {"lr": 0.02, "momentum": 0.95, "nesterov": True, "ns_steps": 5}


def loopback_bytes() -> int:
    """Bytes sent over the loopback interface so far (every process on this machine)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[8])  # transmit bytes
    raise RuntimeError("no loopback interface in /proc/net/dev")


def make(shapes: list, group: dist.ProcessGroup | None, exchange: str, ns_dtype,
         **settings: object) -> Muon:  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    parallelism = PARALLELISM_OF[exchange]
    return Muon(params, ns_dtype=ns_dtype, process_group=group, parallelism=parallelism, **KW,
                **settings)  # fmt: skip


def make_sharded(shapes: list, ns_dtype) -> Muon:
    """The same matrices and gradients as `make`, as dim-0 shards over the world."""
    mesh = init_device_mesh("cpu", (WORLD,))
    gen = torch.Generator().manual_seed(0)
    params = []
    for s in shapes:
        p, g = torch.randn(s, generator=gen), torch.randn(s, generator=gen)
        shard = torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)], src_data_rank=None))
        shard.grad = distribute_tensor(g, mesh, [Shard(0)], src_data_rank=None)
        params.append(shard)
    return Muon(params, ns_dtype=ns_dtype, parallelism="fsdp_gather", **KW)


def timed(fn) -> tuple[float, int]:
    """(seconds, loopback bytes) of fn(), both ranks lined up at a barrier first."""
    dist.barrier()
    sent, t0 = loopback_bytes(), time.perf_counter()
    fn()
    dist.barrier()  # the step ends when the slower rank is done
    return time.perf_counter() - t0, loopback_bytes() - sent


def rank_main(rank: int, port: int, shapes: list, rounds: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    ns_dtype = resolve_ns_dtype("auto", torch.device("cpu"))
    group = dist.group.WORLD
    single = make(shapes, None, "all_reduce", ns_dtype) if rank == 0 else None
    modes = {m: make(shapes, group, m, ns_dtype) for m in EXCHANGES}
    for m in OVERLAPPED:  # the same exchange, started run by run as Newton–Schulz finishes
        modes[f"{m} async"] = make(shapes, group, m, ns_dtype, exchange_overlap="async")
    sharded = make_sharded(shapes, ns_dtype)
    grads = torch.zeros(sum(torch.Size(s).numel() for s in shapes))  # DDP's fp32 gradients
    shard_grads = torch.zeros(grads.numel() // WORLD)  # FSDP's: reduce-scattered, then the
    shard_params = torch.zeros(grads.numel() // WORLD)  # parameters all-gathered

    def fsdp_sync() -> None:
        dist.reduce_scatter_tensor(shard_grads, grads)
        dist.all_gather_single(grads, shard_params)

    def alone(threads: int):
        def run() -> None:
            if rank == 0:
                torch.set_num_threads(threads)
                single.step()
                torch.set_num_threads(1)

        return run

    jobs = {
        "1 rank, 1 thread": alone(1),
        "1 rank, 2 threads": alone(2),
        "DDP grad all-reduce": lambda: dist.all_reduce(grads),
        "FSDP grad/param sync": fsdp_sync,
        **{m: opt.step for m, opt in modes.items()},
        "sharded": sharded.step,
    }
    for fn in jobs.values():  # warm-up: allocations, first-touch, oneDNN kernels
        timed(fn)
    times: dict[str, list[float]] = {name: [] for name in jobs}
    sent: dict[str, list[int]] = {name: [] for name in jobs}
    for r in range(rounds):
        order = list(jobs.items())
        for name, fn in order if r % 2 == 0 else order[::-1]:
            seconds, nbytes = timed(fn)
            times[name].append(seconds)
            sent[name].append(nbytes // WORLD)
    if rank == 0:
        out.update(
            times={k: statistics.median(v) for k, v in times.items()},
            sent={k: statistics.median(v) for k, v in sent.items()},
            ns_dtype=str(ns_dtype).removeprefix("torch."),
            bytes_per_value=torch.tensor([], dtype=ns_dtype).element_size(),
        )
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank: int, port: int, shapes: list, rounds: int, queue) -> None:
    out: dict = {}
    rank_main(rank, port, shapes, rounds, out)
    if rank == 0:
        queue.put(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", choices=list(SHAPE_SETS), default="124m")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (medians reported)")
    args = parser.parse_args()
    shapes = SHAPE_SETS[args.shapes]

    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.SimpleQueue()
    torch.multiprocessing.start_processes(
        _spawned,
        args=(free_port(), shapes, args.rounds, queue),
        nprocs=WORLD,
        join=True,
        start_method="spawn",
    )
    r = queue.get()
    t, sent = r["times"], r["sent"]
    n = sum(torch.Size(s).numel() for s in shapes)
    w, b = WORLD, r["bytes_per_value"]
    ring = (w - 1) / w * n
    formula = {"all_reduce": 2 * ring * b, "all_gather": ring * b, "reduce_scatter": 2 * ring * 4}
    formula["sharded"] = 2 * ring / w * b
    formula.update({f"{m} async": formula[m] for m in OVERLAPPED})
    ddp_s, ddp_bytes = t["DDP grad all-reduce"], sent["DDP grad all-reduce"]
    base1, base2 = t["1 rank, 1 thread"], t["1 rank, 2 threads"]

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {WORLD} gloo ranks x 1 thread")
    print(
        f"{args.shapes}: {len(shapes)} Muon matrices, {n / 1e6:.1f}M values; Newton-Schulz in "
        f"{r['ns_dtype']}; medians of {args.rounds} rounds"
    )
    print(f"1 rank, 1 thread:  {base1 * 1000:8.0f} ms   1 rank, 2 threads: {base2 * 1000:8.0f} ms")
    print(
        f"DDP fp32 gradient all-reduce: {ddp_s * 1000:.0f} ms, {ddp_bytes / 1e6:.0f} MB/rank "
        f"(formula {2 * ring * 4 / 1e6:.0f} MB)"
    )
    fsdp_s = t["FSDP grad/param sync"]
    print(
        f"FSDP fp32 gradient reduce-scatter + parameter all-gather: {fsdp_s * 1000:.0f} ms, "
        f"{sent['FSDP grad/param sync'] / 1e6:.0f} MB/rank (formula {2 * ring * 4 / 1e6:.0f} MB)"
    )
    print()
    print(
        f"{'exchange':<17} {'step ms':>8} {'vs 1r1t':>8} {'vs 1r2t':>8} {'MB/rank':>8} "
        f"{'formula':>8} {'+grad sync ms':>14} {'vs 1r1t':>8} {'vs 1r2t':>8}"
    )
    for m in (*EXCHANGES, *(f"{m} async" for m in OVERLAPPED), "sharded"):
        # The cost of getting from local gradients to updated parameters, in every mode.
        sync = {"reduce_scatter": 0.0, "sharded": fsdp_s}.get(m, ddp_s)
        total = t[m] + sync
        print(
            f"{m:<17} {t[m] * 1000:>8.0f} {t[m] / base1:>7.2f}x {t[m] / base2:>7.2f}x "
            f"{sent[m] / 1e6:>8.0f} {formula[m] / 1e6:>8.0f} {total * 1000:>14.0f} "
            f"{total / base1:>7.2f}x {total / base2:>7.2f}x"
        )
    for m in OVERLAPPED:
        print(
            f"{m} exchange_overlap=async vs sync (the ring), same rounds: "
            f"{t[f'{m} async'] / t[m]:.2f}x the step"
        )
    ratio = t["sharded"] / t["all_gather"]
    print(
        f"\nsharded step vs replicated (all_gather) step, same rounds: {ratio:.2f}x the time; "
        f"momentum per rank 1/{WORLD} of replicated"
    )


if __name__ == "__main__":
    main()
