"""optim/adam.py against torch's AdamW and against the 2025-11 record's Adam written out in float64
(docs/records.md, record_2025_11_29 (C.3)): ε on the raw √v, bf16 moments, updates every other step
from the summed gradients, exact resume inside a pair; and `optim.lr_mul` in both optimizers."""

import pytest
import torch
from torch import nn

from optim import build_optimizer
from optim.adam import Adam
from optim.config import AdamWConfig, MuonConfig, OptimConfig
from optim.muon.update import step_matrix

CPU = torch.device("cpu")


def grads(seed: int, shape: tuple[int, ...], n: int, dtype=torch.float64) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=dtype) for _ in range(n)]


def run(opt: torch.optim.Optimizer, p: torch.Tensor, gs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The parameter after each step with gradients `gs`."""
    out = []
    for g in gs:
        p.grad = g.to(p.dtype)
        opt.step()
        p.grad = None
        out.append(p.detach().clone())
    return out


def record_adam(p0, gs, lr, b1, b2, eps, every):
    """C.3's Adam in float64: on every `every`-th step, with the sum of the gradients since
    the last update: m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g²,
    p ← p − lr·(√(1−β₂ᵗ)/(1−β₁ᵗ))·m/(√v + ε)."""
    p, m, v, t, acc, out = p0.clone(), 0.0, 0.0, 0, 0.0, []
    for s, g in enumerate(gs, 1):
        acc = acc + g
        if s % every == 0:
            t += 1
            m = b1 * m + (1 - b1) * acc
            v = b2 * v + (1 - b2) * acc * acc
            p = p - lr * ((1 - b2**t) ** 0.5 / (1 - b1**t)) * m / (v.sqrt() + eps)
            acc = 0.0
        out.append(p.clone())
    return out


def test_corrected_placement_is_torch_adamw() -> None:
    settings = AdamWConfig(beta1=0.8, beta2=0.95, eps=1e-3, weight_decay=0.1)
    assert settings.torch_equivalent
    ours, theirs = (torch.randn(5, 7, dtype=torch.float64, generator=torch.Generator().
                                manual_seed(0)).requires_grad_() for _ in range(2))  # fmt: skip
    ref = torch.optim.AdamW([theirs], lr=0.01, betas=(0.8, 0.95), eps=1e-3, weight_decay=0.1)
    gs = grads(1, (5, 7), 6)
    for a, b in zip(
        run(Adam([{"params": [ours], "lr": 0.01}], settings), ours, gs),
        run(ref, theirs, gs),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("every", [1, 2, 3])
def test_raw_placement_and_summed_pairs_are_the_records_formula(every: int) -> None:
    settings = AdamWConfig(beta1=0.65, beta2=0.95, eps=1e-8, weight_decay=0.0,
                           eps_placement="raw", update_every=every)  # fmt: skip
    p = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    want = record_adam(p, grads(3, (4, 6), 6), 0.04, 0.65, 0.95, 1e-8, every)
    param = p.clone().requires_grad_()
    opt = Adam([{"params": [param], "lr": 0.04}], settings)
    got = run(opt, param, grads(3, (4, 6), 6))
    for s, (a, b) in enumerate(zip(got, want, strict=True), 1):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15, msg=f"step {s}")
        if s % every:  # between updates the parameter has not moved at all
            assert torch.equal(a, got[s - 2] if s > 1 else p)


def test_bf16_moments_for_every_parameter() -> None:
    """fp32 scalars and a bf16 table both get bf16 moments; the step stays the formula's up
    to the moments' rounding, which the fp32-moment run does not have."""
    gs = grads(4, (64,), 4, torch.float32)
    p0 = torch.randn(64, generator=torch.Generator().manual_seed(7))
    want = record_adam(p0.double(), [g.double() for g in gs], 0.04, 0.65, 0.95, 1e-8, 1)[-1]
    got = {}
    for dtype in ("param", "bf16"):
        settings = AdamWConfig(eps_placement="raw", state_dtype=dtype, beta1=0.65, eps=1e-8)
        scalars = p0.clone().requires_grad_()
        table = torch.randn(16, 8).bfloat16().requires_grad_()
        opt = Adam([{"params": [scalars, table], "lr": 0.04}], settings)
        for g in gs:
            scalars.grad, table.grad = g, torch.ones(16, 8, dtype=torch.bfloat16)
            opt.step()
        moments = {
            opt.state[p][k].dtype for p in (scalars, table) for k in ("exp_avg", "exp_avg_sq")
        }
        assert moments == ({torch.bfloat16} if dtype == "bf16" else {torch.float32, torch.bfloat16})
        got[dtype] = scalars.detach().double() - p0.double()
    step = want - p0.double()
    torch.testing.assert_close(got["param"], step, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got["bf16"], step, rtol=3e-2, atol=1e-4)
    assert not torch.equal(got["bf16"], got["param"])


def test_a_checkpoint_inside_a_pair_resumes_exactly() -> None:
    settings = AdamWConfig(eps_placement="raw", state_dtype="bf16", update_every=2)
    gs = grads(5, (3, 5), 6, torch.float32)
    p = torch.randn(3, 5, generator=torch.Generator().manual_seed(6))
    straight = p.clone().requires_grad_()
    want = run(Adam([{"params": [straight], "lr": 0.1}], settings), straight, gs)
    first = p.clone().requires_grad_()
    opt = Adam([{"params": [first], "lr": 0.1}], settings)
    run(opt, first, gs[:3])  # the third gradient waits for the fourth
    saved = opt.state_dict()
    assert int(saved["state"][0]["pending"]) == 1
    resumed = first.detach().clone().requires_grad_()
    again = Adam([{"params": [resumed], "lr": 0.1}], settings)
    again.load_state_dict(saved)
    got = run(again, resumed, gs[3:])
    for a, b in zip(got, want[3:], strict=True):
        assert torch.equal(a, b)


def test_build_uses_torch_adamw_unless_a_setting_needs_ours() -> None:
    model = nn.Sequential(nn.Embedding(10, 4))
    default = build_optimizer(model, OptimConfig(), device=CPU)
    assert any(type(p) is torch.optim.AdamW for p in default.parts)
    cfg = OptimConfig(adamw=AdamWConfig(update_every=2))
    ours = build_optimizer(model, cfg, device=CPU)
    assert any(type(p) is Adam for p in ours.parts)
    ours.init_state()  # a sharded run's eager state: nothing pending, nothing counted
    state = next(iter(ours.parts[-1].state.values()))
    assert int(state["pending"]) == 0 and int(state["step"]) == 0


class TwoMatrices(nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 6, bias=False, dtype=dtype)
        self.proj = nn.Linear(8, 6, bias=False, dtype=dtype)


def test_lr_mul_scales_the_whole_muon_step_cautious_decay_included() -> None:
    torch.manual_seed(0)
    model = TwoMatrices()
    with torch.no_grad():
        model.proj.weight.copy_(model.fc.weight)
    muon = MuonConfig(lr=0.02, weight_decay=1.2, weight_decay_form="cautious", ns_dtype="fp32")
    cfg = OptimConfig(muon=muon, lr_mul={"fc.*": 2.0})
    opt = build_optimizer(model, cfg, device=CPU)
    w0 = model.fc.weight.detach().clone()
    g = torch.randn(6, 8, dtype=torch.float64)
    model.fc.weight.grad, model.proj.weight.grad = g.clone(), g.clone()
    opt.step()
    # the same orthogonalised O and mask for both: fc moves twice as far as proj
    d_fc, d_proj = model.fc.weight - w0, model.proj.weight - w0
    torch.testing.assert_close(d_fc, 2 * d_proj, rtol=1e-12, atol=1e-15)


def test_bf16_matrices_step_with_a_bf16_lr() -> None:
    """The record's gates: W ← W − bf16(η)·O in bf16 (0.023 → 0.02294921875)."""
    gen = torch.Generator().manual_seed(8)
    p = torch.randn(6, 12, generator=gen).bfloat16()
    o = torch.randn(6, 12, generator=gen).bfloat16()
    group = {"lr": 0.023, "weight_decay": 0.0}
    got = p.clone()
    step_matrix(got, o, group, MuonConfig())
    assert torch.tensor(0.023, dtype=torch.bfloat16).item() == 0.02294921875
    assert torch.equal(got, (p.float() - 0.02294921875 * o.float()).bfloat16())
    assert not torch.equal(got, (p.float() - 0.023 * o.float()).bfloat16())


def test_lr_mul_errors_name_the_key() -> None:
    model = TwoMatrices()
    with pytest.raises(ValueError, match=r"optim.lr_mul: \['nothing\*'\] match no"):
        build_optimizer(model, OptimConfig(lr_mul={"nothing*": 2.0}), device=CPU)
    emb = nn.Sequential(nn.Embedding(10, 4))
    with pytest.raises(ValueError, match="torch's AdamW"):
        build_optimizer(emb, OptimConfig(lr_mul={"*": 2.0}), device=CPU)
    with pytest.raises(ValueError, match=r"optim.lr_mul\['\*'\] must be > 0"):
        OptimConfig(lr_mul={"*": 0.0}).validate(10)
    with pytest.raises(ValueError, match=r"optim\.adamw\.update_every"):
        AdamWConfig(update_every=0).validate()
    with pytest.raises(ValueError, match=r"optim\.adamw\.state_dtype"):
        AdamWConfig(state_dtype="fp16").validate()


def _sharded_pairs(grad_of, between) -> tuple[list, list, Adam]:
    """Six steps of a one-rank sharded Adam (LocalView(1): each rank sums its own pair)
    and the unsharded one, each gradient set by `grad_of(step, p, g)` on the sharded side,
    `between(params)` after each of its steps: (the unsharded parameters, the sharded
    ones, the sharded optimizer) once both are done."""
    from optim.ddp_rows import LocalView

    settings = AdamWConfig(eps_placement="raw", update_every=2)
    gen = torch.Generator().manual_seed(8)
    start = [torch.randn(300, 256, generator=gen), torch.randn(5, generator=gen)]
    gs = [[torch.randn(s.shape, generator=gen) for s in start] for _ in range(6)]
    sides = []
    for comm in (None, LocalView(1)):
        params = [nn.Parameter(s.clone()) for s in start]
        opt = Adam([{"params": params, "lr": 0.01}], settings, comm=comm)
        for step, g in enumerate(gs):
            for p, gp in zip(params, g, strict=True):
                p.grad = gp.clone() if comm is None else grad_of(step, p, gp)
            opt.step()
            if comm is not None:
                between(params)
            opt.zero_grad(set_to_none=comm is None)
        sides.append((params, opt))
    (want, _), (got, sharded) = sides
    assert sharded.shards is not None and sharded.local_sums
    return want, got, sharded


def test_a_pairs_first_gradient_is_its_sum_without_a_copy() -> None:
    """Sharded with a period, the first gradient of a pair becomes the rank's sum as it is
    (no copy: one pass over every table saved on the steps between updates), and p.grad
    lets go of it: the zero_grad(set_to_none=False) after each step of `_sharded_pairs`
    would otherwise wipe the sum, and the result would leave the unsharded optimizer's."""
    want, got, sharded = _sharded_pairs(lambda step, p, g: g.clone(), lambda params: None)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    params = [p for g in sharded.param_groups for p in g["params"]]
    for p in params:  # the next pair's first step
        p.grad = torch.ones_like(p)
    kept = [p.grad for p in params]
    sharded.step()
    assert all(p.grad is None for p in params)
    for p, g in zip(params, kept, strict=True):
        assert sharded.state[p]["grad_sum"] is g


def test_a_pairs_first_gradient_that_is_a_view_is_copied() -> None:
    """A gradient that views another tensor (a bucket its owner reuses) is copied into the
    sum: its owner overwriting the bucket after the step leaves the result alone."""
    buckets: list[torch.Tensor] = []

    def grad_of(step: int, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        bucket = torch.empty(g.numel() + 7)
        bucket[: g.numel()].copy_(g.reshape(-1))
        buckets.append(bucket)
        return bucket[: g.numel()].view(g.shape)

    def between(params: list[torch.Tensor]) -> None:
        for bucket in buckets:
            bucket.fill_(1e6)
        buckets.clear()

    want, got, _ = _sharded_pairs(grad_of, between)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
