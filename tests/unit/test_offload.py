"""optim.offload=true: optimizer state lives off the device between steps, and changes nothing.

On this CPU-only machine "off the device" means the state tensors' own storage is freed after
each update and refilled from a separate CPU mirror before the next: the same mechanics as
on a GPU (minus pinned memory and the side stream), so a value lost or stale in the round
trip shows up as a difference from the run without offload.
"""

from dataclasses import replace

import pytest
import torch

from model import GPT, ModelConfig
from optim import build_optimizer
from optim.config import OptimConfig
from optim.schedule import optim_values

CFG = ModelConfig(n_layer=2, n_head=2, n_embd=32)


def _pair() -> tuple[list, list]:
    runs = []
    for offload in (False, True):
        torch.manual_seed(0)
        model = GPT(CFG)
        opt = build_optimizer(
            model, replace(OptimConfig(), offload=offload), device=torch.device("cpu"),
        )  # fmt: skip
        runs.append((model, opt))
    return runs


def _train(model: GPT, opt, steps: int) -> list[float]:
    gen = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        x = torch.randint(0, 50257, (2, 16), generator=gen)
        opt.set_step(optim_values(OptimConfig(), step, 10))
        loss = model(x, x.roll(-1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _state_storage(opt) -> list[int]:
    return [
        t.untyped_storage().size()
        for part in opt.parts
        for s in part.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor) and t.ndim > 0
    ]


def test_offload_is_bitwise_and_frees_the_state() -> None:
    (plain, plain_opt), (off, off_opt) = _pair()
    assert _state_storage(off_opt) and not any(_state_storage(off_opt))  # freed from the start
    assert _train(plain, plain_opt, 4) == _train(off, off_opt, 4)
    for a, b in zip(plain.parameters(), off.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not any(_state_storage(off_opt)), "the state stays freed between steps"
    # A checkpoint sees the real values, and loading them keeps offloading.
    saved, want = off_opt.state_dict(), plain_opt.state_dict()
    for s, w in zip(saved, want, strict=True):
        for n in w["state"]:
            for k, v in w["state"][n].items():
                assert torch.equal(s["state"][n][k], v), (n, k)
    off_opt.load_state_dict(saved)
    assert not any(_state_storage(off_opt))
    assert _train(plain, plain_opt, 2) == _train(off, off_opt, 2)
    with off_opt.resident():
        assert all(_state_storage(off_opt)), "resident() brings every state back"
    assert "offloaded" in off_opt.summary


def test_offload_switched_on_and_off_mid_run_changes_nothing() -> None:
    """`set_offload` between steps: two steps on the device, two offloaded, two on the device
    again equal six without offload, bit for bit; the state is freed exactly while on."""
    (plain, plain_opt), _ = _pair()
    torch.manual_seed(0)
    model = GPT(CFG)
    opt = build_optimizer(model, OptimConfig(), device=torch.device("cpu"))
    want = [_train(plain, plain_opt, 2) for _ in range(3)]
    got = [_train(model, opt, 2)]
    assert all(_state_storage(opt))
    opt.set_offload(True)
    assert _state_storage(opt) and not any(_state_storage(opt))
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"inside optimizer\.resident\(\)"):
        opt.flat_state()  # its tensors' storage is freed
    with opt.resident():
        assert len(opt.flat_state()) == len(plain_opt.flat_state())
    got.append(_train(model, opt, 2))
    assert not any(_state_storage(opt)), "the state stays freed between steps while on"
    opt.set_offload(False)
    assert all(_state_storage(opt))
    got.append(_train(model, opt, 2))
    assert got == want
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_offload_is_refused_where_muon_steps_banks() -> None:
    opt = build_optimizer(GPT(CFG), OptimConfig(compile=True, compile_backend="eager"),
                          device=torch.device("cpu"))  # fmt: skip
    with pytest.raises(ValueError, match=r"optim\.compile=true"):
        opt.set_offload(True)
    assert opt.offload is None
