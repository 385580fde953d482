"""Sharded Muon on 2 gloo ranks vs single-process `Muon` on the whole matrices.

Given the same averaged gradients, every step must leave the parameters *bitwise* equal to
one process's, whatever the shard layout: even shards, uneven ones (odd row counts), empty
ones (a 1-row matrix: rank 1 holds nothing), stacked 3×d×d weights and tall matrices, with
classic and Polar Express coefficients and both momentum forms, in the factored form. The
gram form agrees to rounding (GRAM_TOL). The step must never gather a whole parameter
(`full_tensor`), which the test counts.

Bitwise in bf16 needs a CPU whose bf16 Newton–Schulz gives a matrix the same bits whatever
else is in its batch (the ranks batch other matrices together than one process does). Some
CPUs' kernels do not (Intel AMX tiles: 3.4e-4 apart here); there bf16 must agree to rounding,
as the gram form does, and fp32 stays bitwise.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from optim.fsdp_rows import local, row_counts, row_range
from optim.muon.exchange_plan import ExchangePlan
from optim.muon.ns_dtype import cpu_flags
from optim.muon.optimizer import Muon
from tests.dist_utils import run_ranks

WORLD = 2
# even, uneven, empty-on-rank-1, stacked, tall, wide, a second tall of the same class
SHAPES = [(16, 32), (17, 16), (1, 16), (3, 16, 16), (48, 16), (16, 48), (32, 16)]
SETTINGS = [
    {"ns_coefficients": "classic", "momentum_form": "ema", "nesterov": True},
    {"ns_coefficients": "polar_express", "momentum_form": "accumulate", "nesterov": True},
    {"ns_coefficients": "classic", "momentum_form": "ema", "nesterov": False, "weight_decay": 0.1},
]
SETTINGS = [{**s, "ns_form": "factored"} for s in SETTINGS]
# The gram form agrees to rounding, not bitwise (its bf16 rounding is the most sensitive to
# how the work is laid out). Measured worst
# |Δ| over 3 steps: bf16 6.2e-4 (parameters ~1), fp32 0.
GRAM = {"ns_coefficients": "polar_express", "momentum_form": "ema", "nesterov": True}
GRAM_TOL = {"torch.bfloat16": 5e-3, "torch.float32": 1e-6}
STEPS = 3


def _problem() -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(STEPS)]
    return params, grads


def _named_stacks(params: list[torch.Tensor], what: str = "q, k, v") -> list[torch.Tensor]:
    """Mark the 3-D parameters as stacks, as a model's module or optim.muon.expert_keys does
    (optim/muon/stacks.py)."""
    for p in params:
        if p.ndim == 3:
            p.stack_of = what
    return params


def _reference(settings: dict, dtype: torch.dtype) -> list[torch.Tensor]:
    params, grads = _problem()
    params = _named_stacks([torch.nn.Parameter(p) for p in params])
    opt = Muon(params, lr=0.05, ns_dtype=dtype, **settings)
    for step in grads:
        for p, g in zip(params, step, strict=True):
            p.grad = g
        opt.step()
    return [p.detach() for p in params]


def _sharded(
    settings: dict, dtype: torch.dtype, mesh, parallelism: str = "fsdp_gather"
) -> tuple[list[torch.Tensor], int]:
    params, grads = _problem()
    shards = _named_stacks(
        [
            torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)], src_data_rank=None))
            for p in params
        ]
    )
    opt = Muon(shards, lr=0.05, ns_dtype=dtype, parallelism=parallelism, **settings)
    with counted_gathers() as gathers:
        for step in grads:
            for p, g in zip(shards, step, strict=True):
                p.grad = distribute_tensor(g, mesh, [Shard(0)], src_data_rank=None)
            opt.step()
    return [p.detach().full_tensor() for p in shards], gathers[0]


@contextmanager
def counted_gathers() -> Iterator[list[int]]:
    """[how many whole parameters `DTensor.full_tensor` gathered inside the block]: a sharded
    Muon step must gather none."""
    gathers, original = [0], DTensor.full_tensor

    def counting(self: DTensor, *args: object, **kwargs: object) -> torch.Tensor:
        gathers[0] += 1
        return original(self, *args, **kwargs)

    DTensor.full_tensor = counting  # type: ignore[method-assign]
    try:
        yield gathers
    finally:
        DTensor.full_tensor = original  # type: ignore[method-assign]


def bf16_batches_are_invariant() -> bool:
    """Whether this CPU's bf16 matmuls give each matrix of a batch the bits it gets alone. Not
    on Intel AMX: its tile kernels round a matrix by its batch and layout (here a bf16 run
    differed in one tall matrix, 3.4e-4, where single products probed alike)."""
    if "amx_bf16" in (cpu_flags() or ()):
        return False
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 16, 48, generator=gen).bfloat16()
    y = torch.randn(5, 48, 48, generator=gen).bfloat16()
    whole = [x @ x.mT, x @ y, torch.baddbmm(x, x @ x.mT, x, beta=0.5, alpha=2.0)]
    alone = [
        torch.stack([m @ m.T for m in x]),
        torch.stack([a @ b for a, b in zip(x, y, strict=True)]),
        torch.stack([torch.addmm(m, m @ m.T, m, beta=0.5, alpha=2.0) for m in x]),
    ]
    return all(torch.equal(a, b) for a, b in zip(whole, alone, strict=True))


def _rank_main(rank: int, world: int, out: str) -> None:
    mesh = init_device_mesh("cpu", (world,))
    one_row = local(distribute_tensor(torch.zeros(1, 16), mesh, [Shard(0)]))
    assert one_row.numel() == (16 if rank == 0 else 0), "rank 1 must hold an empty shard"
    results = []
    for settings in [*SETTINGS, {**GRAM, "ns_form": "gram"}]:
        for dtype in (torch.bfloat16, torch.float32):
            want = _reference(settings, dtype)
            got, gathers = _sharded(settings, dtype, mesh)
            equal = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
            worst = max((a - b).abs().max().item() for a, b in zip(got, want, strict=True))
            results.append((settings, str(dtype), equal, worst, gathers))
    torch.save((results, bf16_batches_are_invariant()), Path(out) / f"rank{rank}.pt")
    dist.barrier()


@pytest.mark.slow
def test_sharded_muon_is_bitwise_single_process(tmp_path: Path) -> None:
    run_ranks(_rank_main, WORLD, str(tmp_path))
    for rank in range(WORLD):
        results, invariant = torch.load(tmp_path / f"rank{rank}.pt")
        for settings, dtype, equal, worst, gathers in results:
            if settings["ns_form"] != "gram":
                assert gathers == 0, f"{settings}: the step gathered {gathers} whole parameters"
            if settings["ns_form"] == "gram" or (dtype == "torch.bfloat16" and not invariant):
                assert worst <= GRAM_TOL[dtype], f"rank {rank} {dtype}: off by {worst}"
                continue
            assert equal, f"rank {rank} {settings} {dtype}: differs from one process by {worst}"


def test_row_counts_follow_torch_chunk() -> None:
    for rows in range(0, 12):
        for world in range(1, 6):
            chunks = [len(c) for c in torch.arange(rows).chunk(world)] if rows else []
            assert row_counts(rows, world) == chunks + [0] * (world - len(chunks))


def test_plan_balances_owners_and_splits_by_shape_class() -> None:
    shapes = [torch.Size(s) for s in SHAPES]
    plans = [ExchangePlan(shapes, WORLD, rank) for rank in range(WORLD)]
    assert plans[0].owners == plans[1].owners  # every rank computes the same ownership
    # 48×16, 16×48 and 32×16 orthogonalise as 16×48 / 16×32 batches: 2 wide classes + others
    classes = [sorted(b.indices) for b in plans[0].buckets]
    assert [4, 5] in classes and [0, 6] in classes
    for b0, b1 in zip(plans[0].buckets, plans[1].buckets, strict=True):
        # what rank 0 sends to rank 1 is what rank 1 expects from rank 0, and back
        assert b0.send[1] == b1.recv[0] and b1.send[0] == b0.recv[1]


def test_plain_tensors_match_muon() -> None:
    """Without a mesh (one process) the sharded optimizer is Muon itself."""
    params, grads = _problem()
    mine = _named_stacks([torch.nn.Parameter(p.clone()) for p in params])
    opt = Muon(mine, lr=0.05, ns_dtype=torch.float32, parallelism="fsdp_gather")
    for step in grads:
        for p, g in zip(mine, step, strict=True):
            p.grad = g
        opt.step()
    want = _reference({}, torch.float32)
    assert all(torch.equal(a.detach(), b) for a, b in zip(mine, want, strict=True))
    assert row_range(mine[0]) == (0, SHAPES[0][0])


def test_parameters_without_gradients_are_named() -> None:
    p = torch.nn.Parameter(torch.randn(4, 4))
    opt = Muon([{"params": [p], "name": "muon"}], parallelism="fsdp_gather")
    with pytest.raises(RuntimeError, match="parameters \\[0\\] of group 'muon'"):
        opt.step()


def _bounded_main(rank: int, world: int, out: str) -> None:
    """fp32 (bitwise on every CPU), every bound: the parameters and the peak exchange bytes."""
    mesh = init_device_mesh("cpu", (world,))
    results = {}
    for in_flight, chunk in BOUNDS:
        params, grads = _problem()
        shards = _named_stacks(
            [
                torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)], src_data_rank=None))
                for p in params
            ]
        )
        opt = Muon(shards, lr=0.05, ns_dtype=torch.float32, parallelism="fsdp_gather",
                   exchange_in_flight=in_flight, exchange_chunk=chunk, **SETTINGS[0])  # fmt: skip
        for step in grads:
            for p, g in zip(shards, step, strict=True):
                p.grad = distribute_tensor(g, mesh, [Shard(0)], src_data_rank=None)
            opt.step()
        got = [p.detach().full_tensor() for p in shards]
        results[(in_flight, chunk)] = (got, opt.strategy.peak_bytes)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    dist.barrier()


# (optim.muon.exchange_in_flight, optim.muon.exchange_chunk): unbounded first
BOUNDS = [(0, 0), (1, 0), (2, 0), (0, -1), (1, 1)]


@pytest.mark.slow
def test_a_bounded_exchange_is_the_unbounded_one_bit_for_bit(tmp_path: Path) -> None:
    """optim.muon.exchange_in_flight and exchange_chunk: 1 or 2 buckets' exchanges live at
    once, buckets cut to as many matrices as ranks or to one, give every parameter's bits of
    the unbounded exchange (and of one process), with fewer buffer bytes live at the peak."""
    run_ranks(_bounded_main, WORLD, str(tmp_path))
    want = _reference(SETTINGS[0], torch.float32)
    for rank in range(WORLD):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for bound, (got, _) in results.items():
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), bound
        peak = {bound: peak for bound, (_, peak) in results.items()}

        # A bucket's exchange is a send and a receive buffer each way (fp32: 4 bytes a value).
        # Unbounded, every bucket's are live at once; with one in flight, one bucket's two.
        def pairs(chunk: int, rank: int = rank) -> list[int]:
            plan = ExchangePlan([torch.Size(s) for s in SHAPES], WORLD, rank, chunk)
            return [(sum(b.send) + sum(b.recv)) * 4 for b in plan.buckets]

        assert peak[(0, 0)] >= sum(pairs(0)) and len(pairs(0)) > 2
        assert peak[(1, 0)] == 2 * max(pairs(0)) < peak[(2, 0)] < peak[(0, 0)], peak
        assert peak[(1, 1)] == 2 * max(pairs(1)) < peak[(1, 0)], peak
        assert len(pairs(1)) == len(SHAPES)  # one matrix a bucket


# Expert stacks (E, out, in), E even and odd (rank 1 holds one expert fewer), beside a matrix
EXPERT_SHAPES = [(4, 12, 16), (4, 16, 12), (3, 16, 16), (24, 16)]


def _experts_problem(mesh=None) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(2)
    params = [torch.randn(s, generator=gen) for s in EXPERT_SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in EXPERT_SHAPES] for _ in range(STEPS)]
    if mesh is not None:
        params = [distribute_tensor(p, mesh, [Shard(0)], src_data_rank=None) for p in params]
        grads = [[distribute_tensor(g, mesh, [Shard(0)], src_data_rank=None) for g in step]
                 for step in grads]  # fmt: skip
    return _named_stacks([torch.nn.Parameter(p) for p in params], "experts"), grads


def _experts_run(mesh=None) -> tuple[list[torch.Tensor], int]:
    params, grads = _experts_problem(mesh)
    parallelism = "fsdp_gather" if mesh is not None else "ddp_all_gather"
    opt = Muon(params, lr=0.05, ns_dtype=torch.float32, parallelism=parallelism,
               weight_decay=0.1)  # fmt: skip
    for step in grads:
        for p, g in zip(params, step, strict=True):
            p.grad = g
        opt.step()
    whole = [p.detach().full_tensor() if mesh is not None else p.detach() for p in params]
    return whole, opt.strategy.peak_bytes if mesh is not None else 0


def _experts_main(rank: int, world: int, out: str) -> None:
    mesh = init_device_mesh("cpu", (world,))
    torch.save(_experts_run(mesh), Path(out) / f"rank{rank}.pt")
    dist.barrier()


@pytest.mark.slow
def test_expert_stacks_step_where_they_live(tmp_path: Path) -> None:
    """fsdp_gather on 2 ranks: expert stacks sharded on the expert dim are orthogonalised on
    the rank that holds each expert, with no exchange: the parameters equal one process's bit
    for bit (fp32), and the exchange buffers are the one matrix's alone."""
    run_ranks(_experts_main, WORLD, str(tmp_path))
    want, _ = _experts_run()
    for rank in range(WORLD):
        got, peak = torch.load(tmp_path / f"rank{rank}.pt")
        for a, b, shape in zip(got, want, EXPERT_SHAPES, strict=True):
            assert torch.equal(a, b), f"rank {rank} {shape}: {(a - b).abs().max().item()}"
        # the matrix's exchange each way, send and receive buffers, fp32; the stacks' none
        (bucket,) = ExchangePlan([torch.Size(EXPERT_SHAPES[-1])], WORLD, rank).buckets
        assert peak == 2 * (sum(bucket.send) + sum(bucket.recv)) * 4, peak


# HSDP: 4 ranks as 2 replica groups × 2 shards, each parameter (Replicate(), Shard(0))
HSDP_MESH = (2, 2)
TP_TOL = 5e-6  # fp32: the tensor-parallel Newton–Schulz's 2-D matrices agree to rounding


def _hsdp_main(rank: int, world: int, out: str) -> None:
    mesh = init_device_mesh("cpu", HSDP_MESH, mesh_dim_names=("replicate", "shard"))
    results = {}
    for parallelism in ("fsdp_gather", "fsdp_tp"):
        params, grads = _problem()
        place = [Replicate(), Shard(0)]
        shards = _named_stacks(
            [
                torch.nn.Parameter(distribute_tensor(p, mesh, place, src_data_rank=None))
                for p in params
            ]
        )
        opt = Muon(shards, lr=0.05, ns_dtype=torch.float32, parallelism=parallelism,
                   **SETTINGS[0])  # fmt: skip
        for step in grads:
            for p, g in zip(shards, step, strict=True):
                p.grad = distribute_tensor(g, mesh, place, src_data_rank=None)
            opt.step()
        shard = mesh.get_local_rank("shard")
        local_rows = [local(p).clone() for p in shards]
        results[parallelism] = ([p.detach().full_tensor() for p in shards], local_rows, shard)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    dist.barrier()


@pytest.mark.slow
def test_hsdp_on_a_2x2_mesh_is_one_process(tmp_path: Path) -> None:
    """4 gloo ranks as a (replicate, shard) = 2 × 2 mesh: the sharded Muon exchanges within
    each shard group, and every rank ends with one process's parameters: fsdp_gather bit for
    bit (fp32), fsdp_tp to rounding (its stacks bit for bit). Both replicas of a shard hold
    the same rows, those of its place in the shard group."""
    run_ranks(_hsdp_main, 4, str(tmp_path))
    want = _reference(SETTINGS[0], torch.float32)
    rows: dict = {}
    for rank in range(4):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for parallelism, (got, local_rows, shard) in results.items():
            for a, b, shape in zip(got, want, SHAPES, strict=True):
                where = f"rank {rank} {parallelism} {shape}"
                if parallelism == "fsdp_gather" or len(shape) == 3:
                    assert torch.equal(a, b), f"{where}: {(a - b).abs().max().item()}"
                else:
                    assert (a - b).abs().max().item() <= TP_TOL, where
            for got_rows, whole, shape in zip(local_rows, got, SHAPES, strict=True):
                start = sum(row_counts(shape[0], HSDP_MESH[1])[:shard])
                assert torch.equal(got_rows, whole[start : start + got_rows.shape[0]])
                key = (parallelism, shape, shard)
                assert torch.equal(rows.setdefault(key, got_rows), got_rows), f"{key} replicas"
