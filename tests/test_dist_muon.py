"""Round-robin Muon over 2 gloo ranks equals single-process Muon, bit for bit."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from optim.muon import Muon
from tests.dist_utils import run_ranks

STEPS = 3
KW = {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}
SHAPES = {
    # Mixed shapes, repeats, tall and wide: ownership splits every shape group across ranks.
    "mixed": [(32, 32), (32, 32), (32, 32), (128, 32), (32, 128), (48, 80), (80, 48)],
    "fewer_than_ranks": [(24, 40)],
}


def problem(shapes: list[tuple[int, int]]) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(STEPS)]
    return params, grads


def train(
    shapes: list[tuple[int, int]],
    ns_dtype: torch.dtype,
    group: dist.ProcessGroup | None,
    exchange: str = "all_reduce",
) -> list[torch.Tensor]:
    start, grads = problem(shapes)
    params = [p.clone().requires_grad_() for p in start]
    opt = Muon(params, ns_dtype=ns_dtype, process_group=group, exchange=exchange, **KW)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()  # DDP would have averaged these: every rank holds the same
        opt.step()
    return [p.detach() for p in params]


def _rank_main(
    rank: int, world: int, shapes: list, dtype_name: str, exchange: str, out: str
) -> None:
    params = train(shapes, getattr(torch, dtype_name), dist.group.WORLD, exchange)
    torch.save(params, Path(out) / f"rank{rank}.pt")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("exchange", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("shapes", list(SHAPES))
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
def test_exchange_is_bitwise_single_process(
    exchange: str, shapes: str, dtype_name: str, tmp_path: Path
) -> None:
    run_ranks(_rank_main, 2, SHAPES[shapes], dtype_name, exchange, str(tmp_path))
    reference = train(SHAPES[shapes], getattr(torch, dtype_name), None)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for a, b in zip(got, reference, strict=True):
            assert torch.equal(a, b), f"rank {rank} differs from single-process Muon"
    # The parameters moved, so equality is not trivially the starting point.
    assert not torch.equal(reference[0], problem(SHAPES[shapes])[0][0])


def test_unknown_exchange_is_rejected() -> None:
    with pytest.raises(ValueError, match="exchange"):
        Muon([torch.zeros(4, 4, requires_grad=True)], exchange="carrier_pigeon")
