"""Round-robin Muon over 2 gloo ranks equals single-process Muon, bit for bit, in every mode."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from optim.muon.optimizer import Muon
from optim.parallelism import MUON_EXCHANGES
from tests.dist_utils import run_ranks

STEPS = 3
WORLD = 2
KW = {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}
SHAPES = {
    # Mixed shapes, repeats, tall and wide: ownership splits every shape group across ranks.
    "mixed": [(32, 32), (32, 32), (32, 32), (128, 32), (32, 128), (48, 80), (80, 48)],
    "fewer_than_ranks": [(24, 40)],
}


def problem(shapes: list) -> tuple[list[torch.Tensor], list[list[list[torch.Tensor]]]]:
    """Start parameters and, for each step, each rank's local gradients."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen) for s in shapes]
    grads = [
        [[torch.randn(s, generator=gen) for s in shapes] for _ in range(WORLD)]
        for _ in range(STEPS)
    ]
    return params, grads


def averaged(local: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """What DDP hands every rank: the mean over ranks of the local gradients."""
    return [(a + b) / 2 for a, b in zip(*local, strict=True)]


def train(
    shapes: list,
    ns_dtype: torch.dtype,
    group: dist.ProcessGroup | None = None,
    parallelism: str = "ddp_all_reduce",
    steps: range = range(STEPS),
    state: dict | None = None,
    **settings: object,
) -> tuple[list[torch.Tensor], Muon]:
    """Run `steps` of the fixed problem; single-process when `group` is None."""
    start, grads = problem(shapes)
    params = [p.clone().requires_grad_() for p in start]
    kw = {**KW, **settings}
    opt = Muon(params, ns_dtype=ns_dtype, process_group=group, parallelism=parallelism, **kw)
    if state is not None:
        params_then, opt_state = state["params"], state["opt"]
        with torch.no_grad():
            for p, v in zip(params, params_then, strict=True):
                p.copy_(v)
        opt.load_state_dict(opt_state)
    rank = dist.get_rank(group) if group is not None else 0
    for step in steps:
        # ddp_owners averages the local gradients itself; the other modes expect DDP's.
        local = parallelism == "ddp_owners" and group is not None
        step_grads = grads[step][rank] if local else averaged(grads[step])
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params], opt


def _rank_main(rank: int, world: int, shapes: list, dtype: str, parallelism: str, out: str) -> None:
    params, opt = train(shapes, getattr(torch, dtype), dist.group.WORLD, parallelism)
    torch.save({"params": params, "opt": opt.state_dict()}, Path(out) / f"rank{rank}.pt")


def momentum(state: dict) -> list[torch.Tensor]:
    return [state["state"][i]["momentum_buffer"] for i in sorted(state["state"])]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("parallelism", MUON_EXCHANGES)
@pytest.mark.parametrize("shapes", list(SHAPES))
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_exchange_is_bitwise_single_process(
    parallelism: str, shapes: str, dtype: str, tmp_path: Path
) -> None:
    run_ranks(_rank_main, WORLD, SHAPES[shapes], dtype, parallelism, str(tmp_path))
    reference, ref_opt = train(SHAPES[shapes], getattr(torch, dtype))
    ref_momentum = momentum(ref_opt.state_dict())
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for a, b in zip(got["params"], reference, strict=True):
            assert torch.equal(a, b), f"rank {rank} differs from single-process Muon"
        # Every mode's state_dict is the single-process one: it resumes on any world size.
        got_momentum = momentum(got["opt"])
        assert len(got_momentum) == len(ref_momentum)
        for a, b in zip(got_momentum, ref_momentum, strict=True):
            assert torch.equal(a, b), f"rank {rank}: momentum differs from single-process Muon"
    # The parameters moved, so equality is not trivially the starting point.
    assert not torch.equal(reference[0], problem(SHAPES[shapes])[0][0])


NORMUON = {
    "normuon_beta2": 0.95,
    "weight_decay_form": "cautious",
    "ns_coefficients": "polar_express",
}


def _normuon_main(rank: int, world: int, parallelism: str, out: str) -> None:
    params, opt = train(SHAPES["mixed"], torch.bfloat16, dist.group.WORLD, parallelism, **NORMUON)
    torch.save({"params": params, "opt": opt.state_dict()}, Path(out) / f"rank{rank}.pt")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("parallelism", ["ddp_all_gather", "ddp_all_reduce"])
def test_normuon_on_two_ranks_is_bitwise_single_process(parallelism: str, tmp_path: Path) -> None:
    """NorMuon's column statistics are taken on every rank from the exchanged whole updates:
    parameters and both buffers equal one process's."""
    run_ranks(_normuon_main, WORLD, parallelism, str(tmp_path))
    reference, ref_opt = train(SHAPES["mixed"], torch.bfloat16, **NORMUON)
    assert_ranks_are(tmp_path, reference, ref_opt, ("momentum_buffer", "second_moment"))


def _resume_main(rank: int, world: int, parallelism: str, state_file: str, out: str) -> None:
    state = torch.load(state_file)
    params, _ = train(
        SHAPES["mixed"], torch.float32, dist.group.WORLD, parallelism, range(1, STEPS), state
    )
    torch.save(params, Path(out) / f"rank{rank}.pt")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("parallelism", MUON_EXCHANGES)
def test_single_process_state_resumes_on_two_ranks(parallelism: str, tmp_path: Path) -> None:
    """1 step in one process, its state loaded on 2 ranks, 2 more steps = 3 steps in one."""
    params, opt = train(SHAPES["mixed"], torch.float32, steps=range(1))
    torch.save({"params": params, "opt": opt.state_dict()}, tmp_path / "state.pt")
    run_ranks(_resume_main, WORLD, parallelism, str(tmp_path / "state.pt"), str(tmp_path))
    reference, _ = train(SHAPES["mixed"], torch.float32)
    for rank in range(WORLD):
        for a, b in zip(torch.load(tmp_path / f"rank{rank}.pt"), reference, strict=True):
            assert torch.equal(a, b), f"rank {rank} did not continue the single-process run"


def _missing_grad_main(rank: int, world: int, out: str) -> None:
    params = [torch.zeros(4, 4, requires_grad=True), torch.zeros(4, 4, requires_grad=True)]
    opt = Muon(params, process_group=dist.group.WORLD, parallelism="ddp_owners")
    params[0].grad = torch.ones(4, 4)  # params[1] has no gradient
    try:
        opt.step()
    except RuntimeError as e:
        (Path(out) / f"rank{rank}.txt").write_text(str(e))


@pytest.mark.timeout(120)
def test_owners_name_parameters_without_gradients(tmp_path: Path) -> None:
    run_ranks(_missing_grad_main, WORLD, str(tmp_path))
    for rank in range(WORLD):  # every rank refused the step, before any collective
        message = (tmp_path / f"rank{rank}.txt").read_text()
        assert "needs a gradient for every parameter" in message and "[1]" in message


def _unsupported_main(rank: int, world: int, out: str) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("this backend has no point-to-point transfers")

    # A backend without send/recv (in this rank, for this job): the gloo rings can't run.
    original, dist.batch_isend_irecv = dist.batch_isend_irecv, refuse
    try:
        params = [torch.zeros(4, 4, requires_grad=True)]
        messages = []
        for parallelism in ("ddp_all_gather", "ddp_owners"):
            try:
                Muon(params, process_group=dist.group.WORLD, parallelism=parallelism)
            except ValueError as e:
                messages.append(str(e))
        Muon(params, process_group=dist.group.WORLD, parallelism="ddp_all_reduce")  # no send/recv
    finally:
        dist.batch_isend_irecv = original
    (Path(out) / f"rank{rank}.txt").write_text("\n".join(messages))


@pytest.mark.timeout(120)
def test_exchange_the_backend_lacks_fails_at_construction(tmp_path: Path) -> None:
    run_ranks(_unsupported_main, WORLD, str(tmp_path))
    for rank in range(WORLD):
        messages = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert len(messages) == 2
        for parallelism, message in zip(("ddp_all_gather", "ddp_owners"), messages, strict=True):
            assert f"dist.parallelism={parallelism} is not supported by the gloo" in message


def test_unknown_parallelism_is_rejected() -> None:
    with pytest.raises(ValueError, match="Muon parallelism must be one of ddp_all_gather"):
        Muon([torch.zeros(4, 4, requires_grad=True)], parallelism="carrier_pigeon")


RECORD_2026_07_17 = {**NORMUON, "normuon_beta2": 0.9, "normuon_axis": "shape", "weight_decay": 1.2,
            "normuon_form": "fp32_mean_squares", "qk_split": "head_pairs",
            "master_weights": "fp32_truncated"}  # fmt: skip


def train_record_2026_07_17(
    group: dist.ProcessGroup | None = None, **settings: object
) -> tuple[list[torch.Tensor], Muon]:
    """record_2026_07_17's NorMuon on bf16 matrices: two (4, d, d) stacks split into head pairs (16
    rows), two tall MLP matrices (one at lr_mul 2); every rank draws DDP's averaged grads."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(4, 32, 32), (128, 32), (128, 32), (4, 32, 32)]
    params = [torch.nn.Parameter((torch.randn(s, generator=gen) / 16).bfloat16()) for s in shapes]
    for p in params[::3]:
        p.muon_head_rows = 16  # type: ignore[attr-defined]
        p.stack_of = "q, k, v, o"  # type: ignore[attr-defined]  # as the model declares it
    params[2].lr_mul = 2.0  # type: ignore[attr-defined]
    kw = {**KW, **RECORD_2026_07_17, **settings}
    opt = Muon(params, ns_dtype=torch.bfloat16, process_group=group, parallelism="ddp_all_gather",
               **kw)  # fmt: skip
    for _ in range(STEPS):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).bfloat16()
        opt.step()
    return [p.detach() for p in params], opt


def _record_2026_07_17_main(rank: int, world: int, out: str) -> None:
    params, opt = train_record_2026_07_17(dist.group.WORLD)
    torch.save({"params": params, "opt": opt.state_dict()}, Path(out) / f"rank{rank}.pt")


@pytest.mark.timeout(180)
def test_record_2026_07_17_normuon_on_two_ranks_is_bitwise_single_process(tmp_path: Path) -> None:
    """Head-pair blocks, per-row statistics and the fp32 master (its mantissa buffers) under
    the all_gather exchange: every rank's weights and state equal one process's."""
    run_ranks(_record_2026_07_17_main, WORLD, str(tmp_path))
    reference, ref_opt = train_record_2026_07_17()
    assert_ranks_are(tmp_path, reference, ref_opt, None)


def assert_ranks_are(tmp_path: Path, reference: list, ref_opt, keys: tuple | None) -> None:
    """Every rank's saved parameters and optimizer state (`keys`, or all of it) equal the
    single process's, bit for bit."""
    want = ref_opt.state_dict()["state"]
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for a, b in zip(got["params"], reference, strict=True):
            assert torch.equal(a, b), f"rank {rank} differs from single-process NorMuon"
        for i, state in want.items():
            if keys is None:
                assert set(got["opt"]["state"][i]) == set(state)
            for key in keys or state:
                assert torch.equal(got["opt"]["state"][i][key], state[key]), (rank, i, key)
