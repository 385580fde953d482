"""NorMuon and cautious weight decay (the 2025-11 record's matrix optimizer, `optim.muon.
normuon_beta2`, `optim.muon.weight_decay_form=cautious`) against a float64 reference written
out from the record's formulas, with no project code in the reference:

    B ← μB + (1−μ)G;  U = (1−μ)G + μB
    X = U / (1.02‖U‖_F + 1e-6);  5 × (A = XXᵀ, X ← aX + (bA + cA²)X)   (Polar Express)
    n₀ = ‖O‖_F;  V ← β₂V + (1−β₂)·mean_rows(O²);  O ← O/√max(V, 1e-10);  O ← O·n₀/max(‖O‖_F, 1e-10)
    M = [O⊙W ≥ 0];  O ← O + λη·M⊙W;  W ← W − ηO
"""

import pytest
import torch
import torch.distributed as dist

from optim.config import MuonConfig
from optim.muon.optimizer import Muon

# The record's Polar Express coefficients (5 iterations, safety 2e-2, cushion 2).
POLAR = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]
LR, MU, BETA2, DECAY = 0.023, 0.95, 0.95, 1.2


def polar_express(u: torch.Tensor) -> torch.Tensor:
    x = u.mT if u.shape[-2] > u.shape[-1] else u
    x = x / (1.02 * x.norm(dim=(-2, -1), keepdim=True) + 1e-6)
    for a, b, c in POLAR:
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if u.shape[-2] > u.shape[-1] else x


def reference_step(w, g, state, normuon: bool, cautious: bool):
    """One step of the record's matrix optimizer on float64 copies; returns the new W."""
    b = state.setdefault("b", torch.zeros_like(w))
    b.mul_(MU).add_((1 - MU) * g)
    u = (1 - MU) * g + MU * b
    o = polar_express(u)
    if normuon:
        v = state.setdefault("v", torch.zeros(*w.shape[:-2], 1, w.shape[-1], dtype=w.dtype))
        n0 = o.norm(dim=(-2, -1), keepdim=True)
        v.mul_(BETA2).add_((1 - BETA2) * (o * o).mean(dim=-2, keepdim=True))
        o = o / v.clamp_min(1e-10).sqrt()
        o = o * n0 / o.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10)
    if cautious:
        o = o + DECAY * LR * (o * w >= 0).double() * w
        return w - LR * o
    return w * (1 - LR * DECAY) - LR * o


SHAPES = [(48, 96), (96, 48), (3, 32, 32)]  # wide, tall (stored as the record never does), stack


@pytest.mark.parametrize("normuon", [True, False])
@pytest.mark.parametrize("cautious", [True, False])
def test_two_steps_match_the_record_formulas(normuon: bool, cautious: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(s, generator=gen) * 0.1 for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(2)]
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    for p in params:  # a merged weight is a named stack, as its module declares it
        if p.ndim == 3:
            p.stack_of = "q, k, v"
    hp = MuonConfig(
        lr=LR, momentum=MU, ns_coefficients="polar_express", ns_form="factored", eps=1e-6,
        weight_decay=DECAY, weight_decay_form="cautious" if cautious else "decoupled",
        normuon_beta2=BETA2 if normuon else 0.0, lr_scale="none",
    )  # fmt: skip
    opt = Muon(params, hp, ns_dtype=torch.float64)
    ref = [w.double() for w in weights]
    states: list[dict] = [{} for _ in SHAPES]
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
        ref = [
            reference_step(w, g.double(), s, normuon, cautious)
            for w, g, s in zip(ref, step_grads, states, strict=True)
        ]
    for p, want in zip(params, ref, strict=True):
        torch.testing.assert_close(p.detach().double(), want, rtol=1e-6, atol=1e-7)
    if normuon:
        v = opt.state[params[2]]["second_moment"]
        assert v.shape == (3, 1, 32)
        torch.testing.assert_close(v.double(), states[2]["v"], rtol=1e-6, atol=1e-9)


def test_normuon_equalises_the_columns_and_keeps_the_norm() -> None:
    from optim.muon.normuon import normalise

    o = torch.randn(64, 32, dtype=torch.float64) * torch.linspace(0.1, 3.0, 32, dtype=torch.float64)
    v = torch.zeros(1, 32, dtype=torch.float64)
    # per column (dim −2); β₂ = 0: V is this update's own column mean square
    out = normalise(o, v, 0.0, -2, "fp32")
    col_rms = out.square().mean(dim=0).sqrt()
    torch.testing.assert_close(col_rms, col_rms.mean().expand(32), rtol=1e-12, atol=0)
    torch.testing.assert_close(out.norm(), o.norm(), rtol=1e-12, atol=0)


def test_normuon_is_refused_where_a_rank_lacks_whole_updates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    p = torch.nn.Parameter(torch.zeros(4, 4))
    hp = MuonConfig(normuon_beta2=0.95)
    with pytest.raises(
        ValueError, match=r"normuon_beta2=0.95 runs .*got dist.parallelism=ddp_owners"
    ):
        Muon([p], hp, process_group=object(), parallelism="ddp_owners")  # type: ignore[arg-type]
    for fsdp in ("fsdp_gather", "fsdp_tp"):
        with pytest.raises(
            ValueError, match=rf"normuon_beta2=0.95 runs .*got dist.parallelism={fsdp}"
        ):
            Muon([p], hp, parallelism=fsdp)


def test_bad_settings_name_their_key() -> None:
    with pytest.raises(ValueError, match=r"optim\.muon\.normuon_beta2 must be in \[0, 1\)"):
        MuonConfig(normuon_beta2=1.0).validate()
    with pytest.raises(ValueError, match=r"optim\.muon\.weight_decay_form must be one of"):
        MuonConfig(weight_decay_form="sometimes").validate()
