"""record_medium_2025_12_31's optimizers (docs/records.md M.3, M.10 item 7) from the preset itself
(experiment=record_medium_2025_12_31) and against M.3's formulas written here in float64:

- every tensor's optimizer, LR at f = 1, betas, weight-decay factor and decay per step, to
  M.3's table's printed digits;
- NorMuon's steps 1–5 (momentum, Polar Express, per-row normalisation of every matrix, the
  8 × 16 gates too, the cautious decay on the weights) against a float64 reference, with
  misreadings that must fail (record_2026_07_17's per-column axis for wide matrices, P without its
  factor 2, record_2026_07_17's β₂);
- a bf16 gate's step with its two factors rounded to bf16;
- the tie: the head's and the table's gradients summed every step, as one tensor's
  (optim.tie_sum=step), which in bf16 differs from record_2026_07_17's sum of the pairs' sums.
"""

import pytest
import torch
from torch import nn

from model import GPT
from optim.adam import Adam
from optim.adam_table import resolve_table
from optim.build import build_optimizer
from optim.config import AdamWConfig, MuonConfig
from optim.groups import partition_params
from optim.muon.optimizer import Muon
from optim.muon.update import lr_scale_factor, step_matrix
from optim.tied import TiedEmbedHead
from tests.helpers import compose_config
from tests.unit.test_normuon import polar_express
from trainer.config import to_config

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def preset():
    """The experiment at toy width (4 heads of 16; the record's 16-layer table)."""
    overrides = ["experiment=record_medium_2025_12_31", "model.n_embd=64", "model.n_head=4",
                 "model.compile=false", "run_dir=."]  # fmt: skip
    return to_config(compose_config(overrides))


@pytest.fixture(scope="module")
def model(preset) -> nn.Module:
    with torch.device("meta"):
        return GPT(preset.model, preset.train.stages)


VE_GATES = "value_gates.weight"  # the ten G^ve_ℓ as the slices of one stack
# M.3: name -> (optimizer, LR at f = 1, betas or NorMuon's β₂, decay per step at f = 1)
M3 = {
    "lm_head.weight": ("adam", 0.004, (0.8, 0.95), 1.2e-5),
    "embed.weight": ("adam", 0.004, (0.8, 0.95), 1.2e-5),
    **{f"value_embeds.{i}.weight": ("adam", 0.3, (0.8, 0.95), 2.25e-3) for i in range(5)},
    "embed2.weight": ("adam", 0.3, (0.8, 0.95), 2.25e-3),
    "smear_gate.weight": ("adam", 4e-5, (0.8, 0.95), 0.0),
    "skips.token_gate.weight": ("adam", 4e-5, (0.8, 0.95), 0.0),
    "x0_lambdas.lambdas": ("adam", 0.02, (0.8, 0.95), 0.0),
    "scalars.packed": ("adam", 0.04, (0.9, 0.99), 0.0),
    **{f"blocks.{i}.attn.gate.weight": ("normuon", 0.0015, 0.95, 2.7e-5) for i in range(16)},
    VE_GATES: ("normuon", 0.0015, 0.95, 2.7e-5),
    **{f"blocks.{i}.attn.qkvo": ("normuon", 0.03, 0.95, 5.4e-4) for i in range(16)},
    **{f"blocks.{i}.mlp.fc.weight": ("normuon", 0.03, 0.95, 5.4e-4) for i in range(16)},
    **{f"blocks.{i}.mlp.proj.weight": ("normuon", 0.06, 0.95, 1.08e-3) for i in range(16)},
}  # fmt: skip


def test_every_tensor_takes_its_m3_row(preset, model: nn.Module) -> None:
    cfg = preset.optim
    groups = partition_params(model, "muon_adamw", cfg.roles)
    adam = [x for k in ("embed", "head", "scalar") for x in groups[k]]
    assert {n for n, _ in adam} | {n for n, _ in groups["muon"]} == set(M3)
    rows = resolve_table(adam, groups["muon"], cfg)
    a = cfg.adamw
    bases = {"embed": a.embed_lr, "head": a.head_lr, "scalar": a.scalar_lr}
    for group, base in bases.items():
        for name, _ in groups[group]:
            kind, lr, betas, decay = M3[name]
            row = rows[name]
            got_lr = base * row.lr_mul
            assert kind == "adam" and row.betas == betas, name
            assert got_lr == pytest.approx(lr, rel=1e-12), name
            assert a.weight_decay * row.wd_mul * got_lr**2 == pytest.approx(decay, rel=1e-12), name
    build_optimizer(model, cfg, device=CPU)  # sets each Muon parameter's lr_mul
    m = cfg.muon
    for name, p in groups["muon"]:
        kind, lr, beta2, decay = M3[name]
        factor = lr_scale_factor(p.shape[-2:], m.lr_scale) * getattr(p, "lr_mul", 1.0)
        assert kind == "normuon" and m.normuon_beta2 == beta2, name
        assert m.lr * factor == pytest.approx(lr, rel=1e-12), name
        assert m.weight_decay * m.lr * (factor * m.lr) == pytest.approx(decay, rel=1e-12), name
    assert (m.normuon_axis, m.normuon_form, m.weight_decay_form) == (
        "rows", "fp32_mean_squares", "cautious",
    )  # fmt: skip
    assert (a.eps, a.eps_placement, a.update_every, a.state_dtype) == (1e-8, "raw", 2, "param")
    assert (cfg.tie_embed_head_until, cfg.tie_sum) == (785, "step")


# NorMuon at toy shapes: P (4, d, d) at lr_mul 2, C_fc and C_proj (4d, d) tall (C_proj stored
# (in, out), lr_mul 2), a gate 8 × 16 at lr_mul 0.1; M.3's η, μ, β₂ and decay.
D = 32
SHAPES = {"qkvo": (4, D, D), "fc": (4 * D, D), "proj": (4 * D, D), "gate": (8, 16)}
LR, MU, BETA2, DECAY = 0.015, 0.95, 0.95, 1.2
M = {"qkvo": 2.0, "fc": 2.0, "proj": 4.0, "gate": 0.1}  # shape factor × lr_mul
LR_MUL = {"qkvo": 2.0, "proj": 2.0, "gate": 0.1}


def reference(weights, grads, *, axis="rows", m=M, beta2=BETA2):
    """M.3's NorMuon steps 1–5 in float64; the weights after each step."""
    w = {n: x.double().clone() for n, x in weights.items()}
    b = {n: torch.zeros_like(x) for n, x in w.items()}
    v: dict = {}
    out = []
    for step in grads:
        for n, g in step.items():
            b[n].mul_(MU).add_((1 - MU) * g.double())
            u = (1 - MU) * g.double() + MU * b[n]
            o_hat = torch.zeros_like(u)
            mats = list(zip(u, o_hat, strict=True)) if n == "qkvo" else [(u, o_hat)]
            for j, (uj, oj) in enumerate(mats):  # step 2: P's four blocks one by one
                o = polar_express(uj)
                rows, cols = o.shape
                dim = -1 if axis == "rows" or rows >= cols else -2
                vj = v.setdefault((n, j), torch.zeros_like(o.mean(dim, keepdim=True)))
                vj.mul_(beta2).add_((1 - beta2) * (o * o).mean(dim, keepdim=True))
                scaled = o / vj.clamp_min(1e-10).sqrt()
                oj.copy_(scaled * o.norm() / scaled.norm().clamp_min(1e-10))
            mask = (o_hat * w[n] >= 0).double()  # step 5: ≥, the weight and Ô of one sign
            w[n] = w[n] - m[n] * LR * o_hat - DECAY * LR * (m[n] * LR) * mask * w[n]
        out.append({n: x.clone() for n, x in w.items()})
    return out


def draw(dtype=torch.float64, steps=2):
    gen = torch.Generator().manual_seed(0)
    weights = {n: (torch.rand(s, generator=gen, dtype=torch.float64) - 0.5) / 8
               for n, s in SHAPES.items()}  # fmt: skip
    grads = [{n: torch.randn(s, generator=gen, dtype=torch.float64) for n, s in SHAPES.items()}
             for _ in range(steps)]  # fmt: skip
    params = {n: nn.Parameter(w.to(dtype, copy=True)) for n, w in weights.items()}
    for p in params.values():  # a merged weight is a named stack, as its module declares it
        if p.ndim == 3:
            p.stack_of = "q, k, v, o"
    for n, mul in LR_MUL.items():
        params[n].lr_mul = mul  # as build_optimizer sets optim.lr_mul's factors
    return weights, grads, params


def test_normuon_steps_are_the_formula_and_misreadings_are_not(preset) -> None:
    weights, grads, params = draw()
    opt = Muon(params.values(), preset.optim.muon, ns_dtype=torch.float64)
    got = []
    for step in grads:
        for n, p in params.items():
            p.grad = step[n]
        opt.step()
        got.append({n: p.detach().clone() for n, p in params.items()})
    want = reference(weights, grads)

    def close(a: dict, b: dict, atol: float) -> bool:
        return all(torch.allclose(a[n], b[n], rtol=0, atol=atol) for n in a)

    for step in (0, 1):
        assert close(got[step], want[step], 1e-12), step
    misreadings = {
        "the gate per column (record_2026_07_17's shape rule)": reference(
            weights, grads, axis="shape"
        ),
        "P at 1 (lr_mul unread)": reference(weights, grads, m={**M, "qkvo": 1.0}),
        "beta2 0.9 (record_2026_07_17)": reference(weights, grads, beta2=0.9),
    }
    for name, wrong in misreadings.items():
        assert not close(got[1], wrong[1], 1e-6), name


def test_a_bf16_gate_steps_in_bf16_with_its_factors_rounded_first() -> None:
    """W ← W − (W⊙M)·bf16(λη)·bf16(η') − Ô·bf16(η'), each product rounded to bf16 (M.3 step 5:
    "both factors are rounded to bf16"), not with the factors in full precision."""
    gen = torch.Generator().manual_seed(1)
    w0 = (torch.randn(8, 16, generator=gen) / 256).bfloat16()  # near the size of a step
    o = torch.randn(8, 16, generator=gen).bfloat16()
    group = {"lr": 0.015 * 1.73, "weight_decay": DECAY}
    # the step after NorMuon (β₂ = 0 leaves it out)
    hp = MuonConfig(normuon_beta2=0.0, normuon_form="fp32_mean_squares", weight_decay=DECAY,
                    weight_decay_form="cautious", normuon_axis="rows")  # fmt: skip
    w = w0.clone()
    step_matrix(w, o, group, hp, 0.1)
    lr = group["lr"]
    step = torch.tensor(lr * 1.0 * 0.1, dtype=torch.bfloat16).item()
    decay = torch.tensor(DECAY * lr, dtype=torch.bfloat16).item()
    mask = (o * w0 >= 0).bfloat16()
    assert torch.equal(w, w0 - w0 * mask * decay * step - o * step)
    full = w0 - w0 * mask * (DECAY * lr) * (lr * 0.1) - o * (lr * 0.1)
    assert not torch.equal(w, full)


def tie_pair(tie_sum: str) -> tuple[torch.Tensor, torch.Tensor, Adam]:
    """A bf16 head W and table E, tied in one Adam of M's settings (update every 2 steps,
    split after the second update)."""
    gen = torch.Generator().manual_seed(2)
    head = nn.Parameter(torch.randn(6, 4, generator=gen).bfloat16())
    embed = nn.Parameter(head.detach().clone())
    settings = AdamWConfig(beta1=0.8, eps=1e-8, eps_placement="raw", update_every=2,
                           weight_decay=0.005, weight_decay_form="cautious")  # fmt: skip
    opt = Adam([{"params": [embed, head], "lr": 0.004}], settings)
    opt.tie = TiedEmbedHead(embed, head, split_update=2, per_step=tie_sum == "step")
    return embed, head, opt


def test_the_tie_sums_one_tensors_gradient_every_step() -> None:
    """optim.tie_sum=step: W's update takes (g_W + g_E)₀ + (g_W + g_E)₁, each sum rounded to
    bf16 as autograd's for the record's one tensor; the table follows W, and after the second
    update takes W's Adam state (t = 2) and trains apart. record_2026_07_17's form, (g_W₀ + g_W₁) +
    (g_E₀ + g_E₁), differs in bf16 on these gradients."""
    gen = torch.Generator().manual_seed(3)
    grads = [(torch.randn(6, 4, generator=gen).bfloat16(), torch.randn(6, 4, generator=gen)
              .bfloat16() * 1e-3) for _ in range(6)]  # fmt: skip
    embed, head, opt = tie_pair("step")
    w0 = head.detach().clone()
    sums = []
    for g_head, g_embed in grads[:2]:
        head.grad, embed.grad = g_head, g_embed
        sums.append(g_head + g_embed)
        opt.step()
    one = sums[0] + sums[1]
    ref = nn.Parameter(w0.clone())
    alone = Adam([{"params": [ref], "lr": 0.004}], opt.hp)
    for g in (torch.zeros_like(one), one):  # the pair's sum at the second step
        ref.grad = g
        alone.step()
    assert torch.equal(head.detach(), ref.detach()) and torch.equal(embed.detach(), head.detach())
    for g_head, g_embed in grads[2:4]:
        head.grad, embed.grad = g_head, g_embed
        opt.step()
    assert int(opt.state[embed]["step"]) == 2 == int(opt.state[head]["step"])  # the split
    for g_head, g_embed in grads[4:]:
        head.grad, embed.grad = g_head, g_embed
        opt.step()
    assert not torch.equal(embed.detach(), head.detach()) and int(opt.state[embed]["step"]) == 3
    pairs = (grads[0][0] + grads[1][0]) + (grads[0][1] + grads[1][1])
    assert not torch.equal(pairs, one)  # record_2026_07_17's order rounds otherwise here
