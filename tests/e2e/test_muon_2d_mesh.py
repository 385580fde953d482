"""The sharded Muon (dist.parallelism=fsdp_gather) over a 2-D mesh: FSDP beside tensor
parallelism, 4 gloo ranks as ("dp", "tp") = 2 × 2, against one process.

Every placement torch makes there is covered: a row-parallel weight `(Shard(0), Shard(1))`
(blocks of rows and columns), a column-parallel one `(_StridedShard(0), Shard(0))` (rows cut
by TP, then by FSDP), a matrix FSDP alone cuts `(Shard(0), Replicate())` (exchanged within
each TP replica), HSDP's `(Replicate(), Shard(0))`, and expert stacks cut across their matrices
or by whole experts. Given the same averaged gradients, every rank's parameters equal one
process's bit for bit (fp32), and no step gathers a whole parameter. The layouts torch's own
`parallelize_module` and `fully_shard` give an MLP are checked the same way.
"""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.distributed.tensor.placement_types import _StridedShard

from optim.muon.optimizer import Muon
from tests.dist_utils import run_ranks
from tests.e2e.test_sharded_muon import counted_gathers

MESH = (2, 2)
STEPS = 3
KW = {"lr": 0.05, "ns_dtype": torch.float32, "weight_decay": 0.1, "ns_form": "factored"}
# (shape, placements on ("dp", "tp"), what a stack holds)
LAYOUTS = [
    ((16, 24), (Shard(0), Shard(1)), ""),  # row-parallel: rows by dp, columns by tp
    ((24, 16), (_StridedShard(0, split_factor=2), Shard(0)), ""),  # column-parallel
    ((17, 10), (Shard(0), Shard(1)), ""),  # uneven both ways
    ((12, 20), (Shard(0), Replicate()), ""),  # FSDP alone: exchanged within each tp replica
    ((20, 12), (Replicate(), Shard(0)), ""),  # HSDP's layout on the same mesh
    ((10, 17), (Shard(1), Shard(0)), ""),  # cut the other way round
    ((4, 8, 12), (Shard(0), Shard(2)), "experts"),  # a stack cut across its matrices
    ((4, 12, 8), (Shard(0), Replicate()), "experts"),  # whole experts: stepped where they are
]


def _problem() -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(shape, generator=gen) for shape, _, _ in LAYOUTS]
    grads = [[torch.randn(shape, generator=gen) for shape, _, _ in LAYOUTS] for _ in range(STEPS)]
    return params, grads


def _marked(params: list[torch.Tensor]) -> list[torch.Tensor]:
    for p, (_, _, what) in zip(params, LAYOUTS, strict=True):
        if what:
            p.stack_of = what
    return params


def _one_process() -> list[torch.Tensor]:
    params, grads = _problem()
    params = _marked([torch.nn.Parameter(p) for p in params])
    opt = Muon(params, **KW)
    for step in grads:
        for p, g in zip(params, step, strict=True):
            p.grad = g
        opt.step()
    return [p.detach() for p in params]


def _layouts_main(rank: int, world: int, out: str) -> None:
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("dp", "tp"))
    whole, grads = _problem()
    params = _marked([
        torch.nn.Parameter(distribute_tensor(p, mesh, place, src_data_rank=None))
        for p, (_, place, _) in zip(whole, LAYOUTS, strict=True)
    ])  # fmt: skip
    opt = Muon(params, parallelism="fsdp_gather", **KW)
    with counted_gathers() as gathers:
        for step in grads:
            for p, g in zip(params, step, strict=True):
                p.grad = distribute_tensor(g, mesh, p.placements, src_data_rank=None)
            opt.step()
    pieces = [tuple(p.to_local().shape) for p in params]
    got = [p.detach().full_tensor() for p in params]
    torch.save((got, gathers[0], pieces), Path(out) / f"rank{rank}.pt")
    dist.barrier()


@pytest.mark.timeout(240)
def test_every_2d_layout_is_one_process_bit_for_bit(tmp_path: Path) -> None:
    run_ranks(_layouts_main, 4, str(tmp_path))
    want = _one_process()
    for rank in range(4):
        got, gathers, pieces = torch.load(tmp_path / f"rank{rank}.pt")
        assert gathers == 0, f"rank {rank}: the step gathered {gathers} whole parameters"
        for a, b, (shape, place, _), piece in zip(got, want, LAYOUTS, pieces, strict=True):
            where = f"rank {rank} {shape} {place} (holds {piece})"
            assert torch.equal(a, b), f"{where}: {(a - b).abs().max().item()}"
    # Each rank held a quarter of the row-parallel weight: both mesh dims cut it.
    assert torch.load(tmp_path / "rank0.pt")[2][0] == (8, 12)


def _mlp(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 48, bias=False), torch.nn.ReLU(), torch.nn.Linear(48, 16, bias=False)
    )


def _grads() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(48, 16, generator=gen), torch.randn(16, 48, generator=gen)]


def _torch_layout_main(rank: int, world: int, out: str) -> None:
    """An MLP as torch lays it out: tensor parallel over "tp", then FSDP2 over "dp"."""
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("dp", "tp"))
    model = _mlp()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    params = list(model.parameters())
    opt = Muon(params, parallelism="fsdp_gather", **KW)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(4))
    model(x).square().mean().backward()  # a real backward through both parallelisms
    backward = [p.grad.full_tensor() for p in params]
    for _ in range(STEPS):
        for p, g in zip(params, _grads(), strict=True):
            p.grad = distribute_tensor(g, p.device_mesh, p.placements, src_data_rank=None)
        opt.step()
    placements = [tuple(p.placements) for p in params]
    got = [p.detach().full_tensor() for p in params]
    torch.save((got, backward, placements), Path(out) / f"rank{rank}.pt")
    dist.barrier()


@pytest.mark.timeout(240)
def test_torch_fsdp_tp_layout_is_one_process(tmp_path: Path) -> None:
    """parallelize_module (column- then row-parallel) and fully_shard place the MLP's weights
    as `(_StridedShard(0), Shard(0))` and `(Shard(0), Shard(1))`: Muon steps them to one
    process's bits, and the model's own backward through both gives one process's gradients
    (to rounding: the row-parallel product sums over ranks)."""
    run_ranks(_torch_layout_main, 4, str(tmp_path))
    model = _mlp()
    params = list(model.parameters())
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(4))
    model(x).square().mean().backward()
    backward = [p.grad.clone() for p in params]
    opt = Muon(params, **KW)
    for _ in range(STEPS):
        for p, g in zip(params, _grads(), strict=True):
            p.grad = g
        opt.step()
    for rank in range(4):
        got, grads, placements = torch.load(tmp_path / f"rank{rank}.pt")
        assert isinstance(placements[0][0], _StridedShard), placements
        assert placements[1] == (Shard(0), Shard(1)), placements
        for a, b in zip(got, params, strict=True):
            assert torch.equal(a, b.detach()), f"rank {rank}: {(a - b).abs().max().item()}"
        for a, b in zip(grads, backward, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _refusals_main(rank: int, world: int, out: str) -> None:
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("dp", "tp"))
    messages = []
    pending = torch.nn.Parameter(DTensor.from_local(torch.zeros(4, 4), mesh, (Shard(0), Partial())))
    cut_twice = torch.nn.Parameter(
        distribute_tensor(torch.zeros(8, 8), mesh, (Shard(0), Shard(1)), src_data_rank=None)
    )
    for params, parallelism in (([pending], "fsdp_gather"), ([cut_twice], "fsdp_tp")):
        try:
            Muon(params, parallelism=parallelism)
        except ValueError as e:
            messages.append(str(e))
    (Path(out) / f"rank{rank}.txt").write_text("\n".join(messages))
    dist.barrier()


@pytest.mark.timeout(120)
def test_layouts_it_cannot_step_are_refused(tmp_path: Path) -> None:
    run_ranks(_refusals_main, 4, str(tmp_path))
    for rank in range(4):
        partial, tp = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert "must be cut (Shard) or replicated on every mesh dim" in partial
        assert "fsdp_tp orthogonalises dim-0 row shards" in tp and "fsdp_gather" in tp
