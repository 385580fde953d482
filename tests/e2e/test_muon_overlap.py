"""optim.muon.exchange_overlap=async: the round-robin exchange started run by run, as each
run's Newton–Schulz finishes, gives the single process's bits on 2 gloo ranks, and does
overlap (every run's collective is started before the first is waited for)."""

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from optim.muon.batches import ns_runs
from optim.muon.exchange import Pending, RoundRobin
from optim.muon.optimizer import Muon
from tests.dist_utils import run_ranks
from tests.e2e.test_dist_muon import SHAPES, WORLD, assert_ranks_are, train, train_record_2026_07_17


def _record(events: list[str]) -> tuple:
    """Patch the round-robin exchange's start and wait to note each call in `events`."""
    start, wait = RoundRobin.start, Pending.wait

    def started(self: RoundRobin, *args: object) -> Pending:
        events.append(f"start{len(self.shapes)}")
        return start(self, *args)

    def waited(self: Pending) -> list[torch.Tensor]:
        events.append("wait")
        return wait(self)

    RoundRobin.start, Pending.wait = started, waited  # type: ignore[method-assign]
    return start, wait


def _overlap_main(rank: int, world: int, parallelism: str, dtype: str, out: str) -> None:
    events: list[str] = []
    start, wait = _record(events)
    try:
        params, opt = train(SHAPES["mixed"], getattr(torch, dtype), dist.group.WORLD, parallelism,
                            exchange_overlap="async")  # fmt: skip
    finally:
        RoundRobin.start, Pending.wait = start, wait  # type: ignore[method-assign]
    torch.save({"params": params, "opt": opt.state_dict(), "events": events},
               Path(out) / f"rank{rank}.pt")  # fmt: skip


@pytest.mark.timeout(180)
@pytest.mark.parametrize("parallelism", ["ddp_all_gather", "ddp_all_reduce"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_overlapped_exchange_is_bitwise_single_process(
    parallelism: str, dtype: str, tmp_path: Path
) -> None:
    run_ranks(_overlap_main, WORLD, parallelism, dtype, str(tmp_path))
    reference, ref_opt = train(SHAPES["mixed"], getattr(torch, dtype))
    assert_ranks_are(tmp_path, reference, ref_opt, ("momentum_buffer",))
    # "mixed" is three runs: the two 128×32 | 32×128 (8,192 values), the two 48×80 | 80×48
    # (7,680) and the three 32×32 (3,072), started largest first, every start before any wait.
    per_step = ["start2", "start2", "start3", "wait", "wait", "wait"]
    for rank in range(WORLD):
        assert torch.load(tmp_path / f"rank{rank}.pt")["events"] == per_step * 3, rank


def _record_2026_07_17_main(rank: int, world: int, out: str) -> None:
    params, opt = train_record_2026_07_17(dist.group.WORLD, exchange_overlap="async")
    torch.save({"params": params, "opt": opt.state_dict()}, Path(out) / f"rank{rank}.pt")


@pytest.mark.timeout(180)
def test_overlapped_record_2026_07_17_is_bitwise_single_process(tmp_path: Path) -> None:
    """Split stacks (head-pair blocks beside whole W_v, W_o), NorMuon and the fp32 master,
    the exchange run by run: weights and every state buffer equal one process's."""
    run_ranks(_record_2026_07_17_main, WORLD, str(tmp_path))
    reference, ref_opt = train_record_2026_07_17()
    assert_ranks_are(tmp_path, reference, ref_opt, None)


def test_runs_never_split_a_batch() -> None:
    """`ns_runs`, by hand: matrices of one shape class (a tall one with its transpose)
    are one run; a split (4, d, d) stack's head-pair blocks (16 × 32, as a 16 × 32 matrix)
    and its whole W_v, W_o (32 × 32) tie their classes into one run."""
    shapes = [(32, 32), (128, 32), (16, 32), (32, 128), (4, 32, 32), (48, 80), (32, 16)]
    params = [torch.zeros(s, requires_grad=True) for s in shapes]
    params[4].stack_of = "q, k, v, o"  # type: ignore[attr-defined]
    params[4].muon_head_rows = 16  # type: ignore[attr-defined]
    group = dict(enumerate(params))
    assert ns_runs(group, "factored") == [[0, 2, 4, 6], [1, 3], [5]]
    params[4].muon_head_rows = 0  # unsplit: the stack is four 32 × 32 matrices
    assert ns_runs(group, "factored") == [[0, 4], [1, 3], [2, 6], [5]]
    # A record form batches a tall matrix on its own, apart from its transpose.
    assert ns_runs(group, "expanded") == [[0, 4], [1], [2], [3], [5], [6]]


def test_overlap_is_refused_where_there_is_no_round_robin_exchange() -> None:
    p = torch.zeros(4, 4, requires_grad=True)
    for parallelism in ("ddp_owners", "fsdp_gather"):
        with pytest.raises(ValueError, match="exchange_overlap=async times the round-robin"):
            Muon([p], parallelism=parallelism, exchange_overlap="async")
    Muon([p], exchange_overlap="async")  # one process of ddp_all_gather: nothing to overlap
    message = re.escape("optim.muon.exchange_overlap must be one of auto | async | sync")
    with pytest.raises(ValueError, match=message):
        Muon([p], exchange_overlap="sometimes")
