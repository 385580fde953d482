"""Muon and Newton–Schulz against torch's reference implementation, on CPU."""

import copy

import pytest
import torch

from optim.muon.newton_schulz import (
    ns_coefficients,
    zeropower,
)
from optim.muon.optimizer import Muon
from optim.muon.update import lr_scale_factor

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

# Mixed shapes: several of one shape (batched together), tall and wide (a 64×32 shares a batch
# with the 32×64s once transposed), and one odd shape on its own.
SHAPES = [(32, 32), (32, 64), (32, 32), (64, 32), (32, 64), (24, 40), (32, 32), (64, 32)]

# Our Newton–Schulz multiplies in a different operand layout from torch's, so bf16 rounds
# differently: the orthogonalised matrices differ by ~0.5-1 % (relative Frobenius), below the
# ~1.2 % that bf16 itself costs against an fp32 run. 2 % accepts that and still rejects a 2 %
# change of the normalisation, one Newton-Schulz step more or less (~35 %) or a flipped
# Nesterov / LR scale (see the negative tests).
RTOL = 0.02
GRAM_RTOL = 0.05


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


def run_steps(opt_cls, params, grads, **kwargs):
    """Clone `params`, take one step per list in `grads`, return (new params, optimizer)."""
    ps = [p.clone().requires_grad_() for p in params]
    for p, q in zip(ps, params, strict=True):  # a named stack stays one (optim/muon/stacks.py)
        if hasattr(q, "stack_of"):
            p.stack_of = q.stack_of
    opt = opt_cls(ps, **kwargs)
    for gs in grads:
        for p, g in zip(ps, gs, strict=True):
            p.grad = g.clone()
        opt.step()
    return ps, opt


def random_problem(steps: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(steps)]
    return params, grads


def max_delta_err(ours, ref, start) -> float:
    """Worst relative error of our parameter change against the reference's."""
    return max(rel_err(a - p0, b - p0) for a, b, p0 in zip(ours, ref, start, strict=True))


# --- Muon against torch.optim.Muon -----------------------------------------------------------


@pytest.mark.parametrize(
    ("nesterov", "lr_scale", "weight_decay", "ns_steps"),
    [
        (True, "original", 0.0, 5),
        (False, "original", 0.0, 5),
        (True, "match_rms_adamw", 0.0, 5),
        (False, "match_rms_adamw", 0.1, 5),
        (True, "original", 0.1, 3),
    ],
)
@pytest.mark.parametrize("ns_form", ["factored", "gram"])
def test_matches_torch_muon(nesterov, lr_scale, weight_decay, ns_steps, ns_form):
    """factored (the default) is torch's own arrangement of the iteration; gram the same
    polynomials on the Gram matrix, which rounds differently in bf16 (measured ≤ 0.031)."""
    params, grads = random_problem()
    kw = {"lr": 0.02, "momentum": 0.9, "nesterov": nesterov, "weight_decay": weight_decay}
    ours, _ = run_steps(
        Muon, params, grads, lr_scale=lr_scale, ns_steps=ns_steps, ns_form=ns_form, **kw
    )
    ref, _ = run_steps(
        torch.optim.Muon, params, grads, adjust_lr_fn=lr_scale, ns_steps=ns_steps, **kw
    )
    assert max_delta_err(ours, ref, params) < (RTOL if ns_form == "factored" else GRAM_RTOL)


def test_fp32_newton_schulz_matches_torch_muon():
    """ns_dtype=fp32 (what `auto` picks on CPUs without native bf16) is the same update: it
    differs from torch's bf16 run only by bf16's own rounding."""
    params, grads = random_problem()
    kw = {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}
    ours, _ = run_steps(Muon, params, grads, ns_dtype=torch.float32, **kw)
    ref, _ = run_steps(torch.optim.Muon, params, grads, **kw)
    assert max_delta_err(ours, ref, params) < RTOL
    bf16, _ = run_steps(Muon, params, grads, **kw)
    assert ours[0].dtype == torch.float32
    assert not all(torch.equal(a, b) for a, b in zip(ours, bf16, strict=True))


@pytest.mark.parametrize(
    ("ours_kw", "torch_kw"),
    [
        ({"nesterov": False}, {"nesterov": True}),
        ({"lr_scale": "none"}, {"adjust_lr_fn": "original"}),  # differs on the tall matrices
        ({"lr_scale": "original"}, {"adjust_lr_fn": "match_rms_adamw"}),
        ({"momentum": 0.8}, {"momentum": 0.9}),
        ({"ns_steps": 4}, {"ns_steps": 5}),
        ({"weight_decay": 0.0}, {"weight_decay": 0.1}),
    ],
)
def test_comparison_detects_a_mismatch(ours_kw, torch_kw):
    """The comparison above is strict enough to fail when one setting differs."""
    params, grads = random_problem()
    base = {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 0.0}
    ours, _ = run_steps(Muon, params, grads, **{**base, **ours_kw})
    ref, _ = run_steps(torch.optim.Muon, params, grads, **{**base, **torch_kw})
    assert max_delta_err(ours, ref, params) > 5 * RTOL


def test_polar_express_step_uses_its_coefficients_and_norm_scale():
    """torch has no per-iteration coefficients, so check one step against zeropower itself."""
    torch.manual_seed(0)
    p0, g = torch.randn(24, 40), torch.randn(24, 40)
    (p,), _ = run_steps(
        Muon, [p0], [[g]], lr=0.1, momentum=0.9, ns_coefficients="polar_express", ns_form="factored"
    )
    update = g.lerp(0.1 * g, 0.9)  # Nesterov lookahead on the first buffer, (1 - 0.9)·g
    coefficients = ns_coefficients("polar_express", 5)
    expected = p0.clone().add_(zeropower(update, coefficients, 1e-7, 1.02), alpha=-0.1)
    torch.testing.assert_close(p, expected, rtol=0, atol=1e-6)
    plain_norm = p0.clone().add_(zeropower(update, coefficients, 1e-7, 1.0), alpha=-0.1)
    assert (p - plain_norm).abs().max() > 1e-3


def test_batched_step_equals_one_matrix_at_a_time():
    params, grads = random_problem()
    together, _ = run_steps(Muon, params, grads, lr=0.02)
    for i in range(len(params)):
        alone, _ = run_steps(Muon, [params[i]], [[gs[i]] for gs in grads], lr=0.02)
        assert torch.equal(together[i], alone[0])


@pytest.mark.parametrize("nesterov", [True, False])
def test_momentum_buffer_is_the_ema_of_the_gradients(nesterov):
    params, grads = random_problem(steps=4)
    ps, opt = run_steps(Muon, params, grads, momentum=0.9, nesterov=nesterov)
    for i, p in enumerate(ps):
        ema = torch.zeros_like(params[i])
        for gs in grads:
            ema = 0.9 * ema + 0.1 * gs[i]
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], ema, rtol=1e-5, atol=1e-6)


def test_resume_from_state_dict_is_bitwise():
    params, grads = random_problem(steps=6)
    straight, _ = run_steps(Muon, params, grads, lr=0.02, weight_decay=0.1)
    first, opt = run_steps(Muon, params, grads[:3], lr=0.02, weight_decay=0.1)
    saved = copy.deepcopy(opt.state_dict())
    resumed = [p.detach().clone().requires_grad_() for p in first]
    opt2 = Muon(resumed, lr=0.5)  # the loaded state replaces this LR
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["lr"] == 0.02
    for gs in grads[3:]:
        for p, g in zip(resumed, gs, strict=True):
            p.grad = g.clone()
        opt2.step()
    for a, b in zip(resumed, straight, strict=True):
        assert torch.equal(a, b)


def test_schedule_keys_are_read_every_step():
    params, grads = random_problem(steps=2)
    ps, opt = run_steps(Muon, params, grads[:1], lr=0.02, momentum=0.9)
    before = [p.detach().clone() for p in ps]
    opt.param_groups[0]["lr"] = 0.0
    opt.param_groups[0]["momentum"] = 0.5
    for p, g in zip(ps, grads[1], strict=True):
        p.grad = g.clone()
    opt.step()
    for p, b in zip(ps, before, strict=True):
        assert torch.equal(p, b)  # lr 0 leaves the weights alone...
    buf = opt.state[ps[0]]["momentum_buffer"]
    expected = 0.5 * (0.1 * grads[0][0]) + 0.5 * grads[1][0]  # ...but momentum 0.5 is used
    torch.testing.assert_close(buf, expected, rtol=1e-5, atol=1e-6)


def test_closure_runs_with_grad_and_its_loss_is_returned():
    torch.manual_seed(0)
    w = torch.randn(16, 32, requires_grad=True)
    x = torch.randn(32)
    opt = Muon([w], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (w @ x).square().sum()
        loss.backward()
        return loss

    before = w.detach().clone()
    loss = opt.step(closure)
    assert loss is not None and loss.item() == pytest.approx(((before @ x).square().sum()).item())
    assert not torch.equal(w, before)


def test_params_without_grad_are_left_alone():
    a, b = torch.randn(8, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    b_before = b.detach().clone()
    opt = Muon([a, b], lr=0.1)
    a.grad = torch.randn(8, 16)
    opt.step()
    assert torch.equal(b, b_before) and b not in opt.state and a in opt.state


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": -0.1}, "lr must be >= 0"),
        ({"momentum": 1.0}, r"momentum must be in \[0, 1\)"),
        ({"momentum": -0.1}, r"momentum must be in \[0, 1\)"),
        ({"ns_steps": 0}, "ns_steps must be an integer >= 1"),
        ({"eps": 0.0}, "eps must be > 0"),
        ({"weight_decay": -1.0}, "weight_decay must be >= 0"),
        ({"ns_coefficients": "cubic"}, "ns_coefficients must be one of"),
        ({"lr_scale": "sqrt"}, "lr_scale must be one of"),
    ],
)
def test_bad_hyperparameters_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Muon([torch.zeros(4, 4, requires_grad=True)], **kwargs)


@pytest.mark.parametrize("shape", [(4,), ()])
def test_non_matrix_params_are_rejected(shape):
    with pytest.raises(ValueError, match="only takes matrices"):
        Muon([torch.zeros(4, 4, requires_grad=True), torch.zeros(shape, requires_grad=True)])


def test_bad_group_added_later_leaves_the_optimizer_unchanged():
    opt = Muon([torch.zeros(4, 4, requires_grad=True)])
    with pytest.raises(ValueError, match="lr must be >= 0"):
        opt.add_param_group({"params": [torch.zeros(4, 4, requires_grad=True)], "lr": -1.0})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [torch.zeros(4, 4, requires_grad=True)], "lr": 0.1})
    assert opt.param_groups[1]["lr"] == 0.1


def test_settings_are_one_muon_config():
    """A standalone Muon's settings are `optim.muon`'s (one object, one source of defaults);
    keyword overrides change fields of it, and the param groups carry the per-group ones."""
    from optim.config import MuonConfig

    opt = Muon([torch.zeros(4, 4, requires_grad=True)])
    assert opt.hp == MuonConfig()
    group = opt.param_groups[0]
    assert {k: group[k] for k in ("lr", "momentum", "weight_decay")} == {
        "lr": MuonConfig.lr, "momentum": MuonConfig.momentum, "weight_decay": 0.0
    }  # fmt: skip
    tuned = Muon([torch.zeros(4, 4, requires_grad=True)], MuonConfig(ns_steps=3), lr=0.1)
    assert tuned.hp == MuonConfig(ns_steps=3, lr=0.1) and tuned.param_groups[0]["lr"] == 0.1
    with pytest.raises(TypeError, match="ns_stepz"):
        Muon([torch.zeros(4, 4, requires_grad=True)], ns_stepz=3)


def test_lr_scale_factor():
    assert lr_scale_factor((3072, 768), "original") == 2.0
    assert lr_scale_factor((768, 3072), "original") == 1.0
    assert lr_scale_factor((100, 400), "match_rms_adamw") == pytest.approx(4.0)
    assert lr_scale_factor((400, 100), "match_rms_adamw") == pytest.approx(4.0)
    assert lr_scale_factor((3072, 768), "none") == 1.0
    assert lr_scale_factor((768, 3072), "unit_rms_norm") == 0.5  # √(out/in), below 1 when wide
    assert lr_scale_factor((3072, 768), "unit_rms_norm") == 2.0


@pytest.mark.parametrize("shape", [(16, 64), (64, 16)])
def test_unit_rms_norm_scales_the_step_by_root_out_over_in(shape):
    """One step of lr_scale=unit_rms_norm is the unscaled step times √(out/in), so the update's
    RMS→RMS operator norm is η·σ_max(O) for a wide matrix as for a tall one ("original" would
    leave the wide one at 1)."""
    gen = torch.Generator().manual_seed(5)
    w0 = torch.randn(shape, generator=gen, dtype=torch.float64)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    deltas = {}
    for scale in ("unit_rms_norm", "none"):
        (w,), _ = run_steps(Muon, [w0], [[g]], lr_scale=scale, ns_dtype=torch.float64)
        deltas[scale] = w.detach() - w0
    ratio = (shape[0] / shape[1]) ** 0.5
    torch.testing.assert_close(
        deltas["unit_rms_norm"], ratio * deltas["none"], rtol=1e-12, atol=1e-15
    )


def test_a_zero_size_matrix_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"zero-size dimension, shape \(0, 4\)"):
        Muon([torch.zeros(4, 4, requires_grad=True), torch.zeros(0, 4, requires_grad=True)])


# --- The records' variants: stacked matrices, accumulating momentum, expanded Newton-Schulz --


def test_a_stack_of_matrices_is_each_matrix_on_its_own():
    """A merged 3×m×n q/k/v weight: each slice normalised and orthogonalised by itself."""
    gen = torch.Generator().manual_seed(1)
    stacked = torch.randn(3, 32, 48, generator=gen)
    grads = [torch.randn(3, 32, 48, generator=gen) for _ in range(3)]
    stacked.stack_of = "q, k, v"
    ps, _ = run_steps(Muon, [stacked], [[g] for g in grads], lr=0.02, ns_dtype=torch.float32)
    apart, _ = run_steps(
        Muon, list(stacked), [list(g) for g in grads], lr=0.02, ns_dtype=torch.float32
    )
    for j in range(3):
        assert torch.equal(ps[0][j], apart[j]), j


def test_accumulating_momentum_is_the_records_recursion():
    params, grads = random_problem(steps=4)
    ps, opt = run_steps(Muon, params, grads, momentum=0.9, momentum_form="accumulate")
    for i, p in enumerate(ps):
        buf = torch.zeros_like(params[i])
        for gs in grads:
            buf = 0.9 * buf + gs[i]
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], buf, rtol=1e-5, atol=1e-5)


def test_accumulate_and_ema_agree_at_constant_momentum_only():
    """U_acc = U_ema / (1 − μ) when μ is constant, and Newton–Schulz normalises the scale
    away; while μ changes (the warmup) the two forms weigh past gradients differently."""
    params, grads = random_problem(steps=4)
    kw = {"momentum": 0.9, "ns_dtype": torch.float32}
    ema, _ = run_steps(Muon, params, grads, **kw)
    acc, _ = run_steps(Muon, params, grads, momentum_form="accumulate", **kw)
    assert max_delta_err(acc, ema, params) < 1e-4
    warm = []
    for form in ("ema", "accumulate"):
        ps = [p.clone().requires_grad_() for p in params]
        opt = Muon(ps, momentum_form=form, ns_dtype=torch.float32)
        for step, gs in enumerate(grads):
            opt.param_groups[0]["momentum"] = 0.5 + 0.1 * step  # a warmup
            for p, g in zip(ps, gs, strict=True):
                p.grad = g.clone()
            opt.step()
        warm.append(ps)
    assert max_delta_err(warm[1], warm[0], params) > 1e-2


@pytest.mark.parametrize("banks", [False, True])
def test_a_param_group_takes_its_own_newton_schulz(banks: bool) -> None:
    """Two groups, the square matrices with 3 Polar Express iterations and the others with the
    optimizer's 5 classic ones, step exactly as two optimizers each built with one group's
    settings (eager, and over banks); a bad per-group value is refused naming its key."""
    gen = torch.Generator().manual_seed(0)
    shapes = {"square": [(16, 16), (16, 16)], "rest": [(8, 24), (24, 8)]}
    start = {k: [torch.randn(s, generator=gen) for s in v] for k, v in shapes.items()}
    grads = {k: [[torch.randn(s, generator=gen) for s in v] for _ in range(3)]
             for k, v in shapes.items()}  # fmt: skip
    own = {"ns_steps": 3, "ns_coefficients": "polar_express"}
    kw = {"ns_dtype": torch.float32, "banks": banks, "lr": 0.05}

    def train(groups: dict[str, dict], **settings: object) -> dict[str, list[torch.Tensor]]:
        params = {k: [p.clone().requires_grad_() for p in start[k]] for k in groups}
        opt = Muon([{"params": params[k], **extra} for k, extra in groups.items()],
                   **kw, **settings)  # fmt: skip
        for step in range(3):
            for k, ps in params.items():
                for p, g in zip(ps, grads[k][step], strict=True):
                    p.grad = g.clone()
            opt.step()
        return {k: [p.detach() for p in ps] for k, ps in params.items()}

    together = train({"square": own, "rest": {}})
    alone = {**train({"square": {}}, **own), **train({"rest": {}})}
    for k in shapes:
        assert all(torch.equal(a, b) for a, b in zip(together[k], alone[k], strict=True)), k
    default = train({"square": {}, "rest": {}})["square"]
    assert not any(torch.equal(a, b) for a, b in zip(default, together["square"], strict=True))
    p = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"optim\.muon\.ns_steps must be an integer >= 1"):
        Muon([{"params": [p], "ns_steps": 0}])
    with pytest.raises(ValueError, match=r"optim\.muon\.ns_coefficients must be one of"):
        Muon([{"params": [p], "ns_coefficients": "cubic"}])
