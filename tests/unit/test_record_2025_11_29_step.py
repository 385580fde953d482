"""Three optimizer steps of the 2025-11 record's preset (at 4 layers, in float64) against its
optimizers written out from the formulas of docs/records.md, record_2025_11_29 (C.3, C.4), with no
project code in the reference: NorMuon on every matrix (each slice of the merged q/k/v/o on
its own, C_fc at twice the LR, gates included), Adam on the tables, the head and the scalar
vector only at the odd step, with the sum of the two steps' gradients. Steps 0 (even), 1
(odd) and 2 (even) at the schedule's values. The moments are float64 here (the preset's are
each parameter's dtype, pinned below); Newton–Schulz runs in float64 on both sides."""

import math

import torch

from model import GPT
from optim import build_optimizer
from tests.helpers import compose_config
from tests.unit.test_normuon import polar_express
from trainer.config import to_config
from trainer.schedule import Schedule

# Record #46's toy (`size=toy`: 4 layers, three stages over 6 scheduled steps and 2 extension
# steps) at d 32
TOY_C = ["experiment=record_2025_11_29", "size=toy", "run_dir=.", "model.n_embd=32"]
LR_MUON, BETA2, DECAY, EPS_NS = 0.023, 0.95, 1.2, 1e-6
ADAM = {"embed": 0.6, "head": 0.008, "scalar": 0.04}
B1, B2, EPS = 0.65, 0.95, 1e-8


def f(s: int) -> float:
    """C.4's LR multiplier at toy size: 6 scheduled steps, peaks 1 / 1.51 / 1.93 above
    x = 0.33 / 0.66, decay over the last 55 % to 0.1, then 0.1."""
    x = s / 6
    p = 1.0 if x <= 0.33 else 1.51 if x <= 0.66 else 1.93
    if x < 0.45:
        return p
    return 0.1 + (p - 0.1) * (6 - s) / (0.55 * 6) if x <= 1 else 0.1


def mu(s: int) -> float:
    """C.4's momentum at toy size: 0.85 -> 0.95 over 3 steps, 0.95 -> 0.85 over the last 2."""
    if s < 3:
        return 0.85 + 0.1 * s / 3
    return 0.95 - 0.1 * (s - 6) / 2 if s > 6 else 0.95


def normuon(w: torch.Tensor, g: torch.Tensor, st: dict, s: int, lr_mul: float) -> torch.Tensor:
    """One NorMuon step of C.3 on a matrix (its stored shape) or each matrix of a stack."""
    m, eta = mu(s), LR_MUON * f(s)
    b = st.setdefault("b", torch.zeros_like(w))
    b.mul_(m).add_((1 - m) * g)
    o = polar_express((1 - m) * g + m * b)
    v = st.setdefault("v", torch.zeros(*w.shape[:-2], 1, w.shape[-1], dtype=w.dtype))
    n0 = o.norm(dim=(-2, -1), keepdim=True)
    v.mul_(BETA2).add_((1 - BETA2) * (o * o).mean(dim=-2, keepdim=True))
    o = o / v.clamp_min(1e-10).sqrt()
    o = o * n0 / o.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10)
    o = o + DECAY * eta * (o * w >= 0).double() * w
    return w - lr_mul * eta * o


def adam(w: torch.Tensor, g: torch.Tensor, st: dict, s: int, lr: float) -> torch.Tensor:
    """C.3's Adam: the gradient is kept at even s and summed with the odd step's."""
    acc = st["acc"] = st.get("acc", 0.0) + g
    if s % 2 == 0:
        return w
    t = st["t"] = st.get("t", 0) + 1
    m = st["m"] = B1 * st.get("m", 0.0) + (1 - B1) * acc
    v = st["v"] = B2 * st.get("v", 0.0) + (1 - B2) * acc * acc
    st["acc"] = 0.0
    return w - lr * f(s) * (math.sqrt(1 - B2**t) / (1 - B1**t)) * m / (v.sqrt() + EPS)


def test_three_steps_are_the_records_optimizers() -> None:
    cfg = to_config(compose_config(TOY_C))
    torch.manual_seed(0)
    model = GPT(cfg.model, cfg.train.stages).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    opt = build_optimizer(model, cfg.optim, device=torch.device("cpu"))
    opt.parts[0].ns_dtype = torch.float64  # NorMuon's Newton–Schulz in float64, as the reference
    schedule = Schedule.for_run(cfg.train, cfg.optim, cfg.model)
    groups = {g["name"]: g["param_names"] for o in opt.parts for g in o.param_groups}
    group_of = {n: k for k, names in groups.items() for n in names}
    assert set(groups) == {"muon", "embed", "head", "scalar"}
    assert len(groups["muon"]) == 11 and groups["scalar"] == ["scalars.packed"]
    ref = {n: p.detach().clone() for n, p in model.named_parameters()}
    states: dict[str, dict] = {n: {} for n in ref}
    gen = torch.Generator().manual_seed(1)
    for s in range(3):
        opt.set_step(schedule.at(s).optim)
        for n, p in model.named_parameters():
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            g, group = p.grad.clone(), group_of[n]
            if group == "muon":
                ref[n] = normuon(ref[n], g, states[n], s, 2.0 if ".mlp.fc." in n else 1.0)
            else:
                ref[n] = adam(ref[n], g, states[n], s, ADAM[group])
        opt.step()
        opt.zero_grad()
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.detach(), ref[n], rtol=1e-9, atol=1e-12, msg=f"{s} {n}")
    assert schedule.at(1).optim.lr_mult == f(1) and schedule.at(2).optim.muon_momentum == mu(2)


def test_the_presets_adam_moments_are_each_parameters_dtype() -> None:
    """The record's timed run restores its optimizer through torch's load_state_dict after the
    warm-up, which casts the bf16 moments it built to each parameter's dtype: fp32 for the
    scalar vector, bf16 for the tables and the head (state_dtype=param, not bf16)."""
    cfg = to_config(compose_config(TOY_C))
    assert cfg.optim.adamw.state_dtype == "param"
    model = GPT(cfg.model, cfg.train.stages)
    opt = build_optimizer(model, cfg.optim, device=torch.device("cpu"))
    for _ in range(2):  # the odd step updates
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        opt.zero_grad()
    adam = opt.parts[-1]
    dtypes = {}
    for g in adam.param_groups:
        for n, p in zip(g["param_names"], g["params"], strict=True):
            dtypes[n] = (p.dtype, adam.state[p]["exp_avg"].dtype, adam.state[p]["exp_avg_sq"].dtype)
    assert dtypes.pop("scalars.packed") == (torch.float32,) * 3
    assert dtypes and set(dtypes.values()) == {(torch.bfloat16,) * 3}, dtypes
