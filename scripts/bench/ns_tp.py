"""Tensor-parallel Newton–Schulz against gathering each matrix to one rank, on 2 gloo ranks.

The matrices are a GPT's hidden weights split the way tensor parallelism splits them: q, k, v
and fc by rows (their output dimension), o and proj by columns (their input dimension), so
the MLP's are split along their long side. Per case, in the same two processes with the
rounds interleaved (1 thread per rank):
- tp: `tp_zeropower` on each rank's blocks (a Gram all_reduce per iteration, or per restart
  segment for form gram);
- gather: the matrices dealt to owner ranks in turn; each owner gathers its matrices' blocks,
  runs `zeropower` on the whole stack and scatters the result's blocks back.
Bytes are what each rank sends (`ns_traffic`); max |Δ| is between the two results.

    python scripts/bench/ns.py --tp [--quick]
"""

import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from optim.muon.newton_schulz import ns_coefficients, zeropower
from optim.muon.tp_newton_schulz import ns_traffic, tp_zeropower
from trainer.launch.dist import free_port

WORLD = 2
EPS = 1e-7


def tp_cases(n_layer: int, d: int) -> list[tuple[str, int, tuple[int, int], str]]:
    """(name, count, shape, split) for a block stack under tensor parallelism."""
    return [
        ("q,k,v", 3 * n_layer, (d, d), "row"),
        ("o", n_layer, (d, d), "col"),
        ("fc", n_layer, (4 * d, d), "row"),
        ("proj", n_layer, (d, 4 * d), "col"),
    ]


def block(X: torch.Tensor, split: str, rank: int) -> torch.Tensor:
    dim = -2 if split == "row" else -1
    return torch.chunk(X, WORLD, dim=dim)[rank].contiguous()


def gathered(local: torch.Tensor, split: str, rank: int, run) -> torch.Tensor:
    """Owner r orthogonalises matrices r, r+W, ...: gather their blocks, NS, scatter back."""
    dim = -2 if split == "row" else -1
    out = torch.empty_like(local)
    for owner in range(WORLD):
        mine = local[owner::WORLD].contiguous()
        parts = [torch.empty_like(mine) for _ in range(WORLD)] if rank == owner else None
        dist.gather(mine, parts, dst=owner)
        pieces = None
        if rank == owner:
            assert parts is not None
            result = run(torch.cat(parts, dim=dim))
            pieces = [p.contiguous() for p in torch.chunk(result, WORLD, dim=dim)]
        back = torch.empty_like(mine)
        dist.scatter(back, pieces, src=owner)
        out[owner::WORLD] = back
    return out


def timed_pair(runs: dict, rounds: int) -> tuple[dict[str, float], dict]:
    """Median ms of each run (all ranks in step, alternating order) and its warm-up result."""
    results = {k: run() for k, run in runs.items()}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(rounds):
        for key, run in list(runs.items())[:: 1 if r % 2 == 0 else -1]:
            dist.barrier()
            t0 = time.perf_counter()
            run()
            dist.barrier()
            times[key].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(t) for k, t in times.items()}, results


def rank_main(rank: int, port: int, quick: bool, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    group = dist.group.WORLD
    n_layer, d = (4, 128) if quick else (12, 768)
    rounds = 3 if quick else 5
    dtype = torch.bfloat16
    coeffs = ns_coefficients("classic", 5)
    rows = []
    for name, count, shape, split in tp_cases(n_layer, d):
        X = torch.randn(count, *shape, generator=torch.Generator().manual_seed(count))
        local = block(X, split, rank)
        for form in ("factored", "gram"):
            tp = partial(tp_zeropower, local, split, group, coeffs, EPS, 1.0, dtype, form)
            whole = partial(zeropower, coefficients=coeffs, eps=EPS, dtype=dtype, form=form)
            gather = partial(gathered, local.to(dtype), split, rank, whole)
            times, results = timed_pair({"tp": tp, "gather": gather}, rounds)
            diff = (results["tp"].float() - results["gather"].float()).abs().max()
            dist.all_reduce(diff, op=dist.ReduceOp.MAX)
            traffic = ns_traffic((count, *shape), split, WORLD, 5, form)
            rows.append(
                {
                    "case": name,
                    "count": count,
                    "shape": shape,
                    "split": split,
                    "form": form,
                    "tp_ms": times["tp"],
                    "gather_ms": times["gather"],
                    "tp_mb": traffic.tp / 1e6,
                    "gather_mb": traffic.gather / 1e6,
                    "max_diff": diff.item(),
                }
            )
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main(quick: bool = False) -> list[dict]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = mp.start_processes(
        rank_main,
        args=(free_port(), quick, queue),
        nprocs=WORLD,
        join=False,
        start_method="spawn",
    )
    rows = queue.get()
    while not procs.join():
        pass
    print(
        f"tensor-parallel Newton–Schulz vs gathering, {WORLD} gloo ranks × 1 thread, bf16, "
        "classic 5 steps, Gram matrices reduced in fp32; medians in ms"
    )
    print(
        f"{'case':<7} {'shape':>12} {'split':>5} {'form':>9} {'tp ms':>8} {'gather ms':>10} "
        f"{'gather/tp':>9} {'tp MB':>7} {'gather MB':>9} {'max |Δ|':>8}"
    )
    for r in rows:
        shape = f"{r['count']}×{r['shape'][0]}×{r['shape'][1]}"
        print(
            f"{r['case']:<7} {shape:>12} {r['split']:>5} {r['form']:>9} {r['tp_ms']:>8.1f} "
            f"{r['gather_ms']:>10.1f} {r['gather_ms'] / r['tp_ms']:>8.2f}x "
            f"{r['tp_mb']:>7.2f} {r['gather_mb']:>9.2f} {r['max_diff']:>8.4f}"
        )
    return rows


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
