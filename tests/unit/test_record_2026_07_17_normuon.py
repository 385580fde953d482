"""record_2026_07_17's NorMuon (docs/records.md D.3 "NorMuon") and record_2025_11_29's
NorMuon fixes, against the records' formulas written out in float64 with no project code in the
reference, each with a negative control (a plausible misreading that must not match):

    Q, K split into head-pair blocks of 2·head_dim rows, V and O whole      (qk_split)
    r = mean(O², −1) where rows ≥ cols, else mean(O², −2); V ← β₂V + (1−β₂)r (normuon_axis)
    Ô = O/√max(V, 1e-10) · ‖O‖_F / max(‖O/√max(V, 1e-10)‖_F, 1e-10)
    W ← W − mη·Ô − 1.2·η·(mη)·[Ô⊙W ≥ 0]⊙W,  m = 1 (Q/K/V/O), 2 (c_fc), 4 (c_proj)
    master fp32 = bf16 weight ‖ 16-bit mantissa; the weight is the master truncated to bf16
"""

import copy

import pytest
import torch
import torch.distributed as dist

from optim.config import MuonConfig
from optim.muon.master import master_of
from optim.muon.normuon import mark_head_pairs, normalise
from optim.muon.optimizer import Muon
from optim.muon.update import host_values, step_matrix
from tests.unit.test_normuon import polar_express

D, ROWS, LR, MU, BETA2, DECAY = 96, 32, 0.023, 0.95, 0.9, 1.2  # head_dim 16: pairs of 32 rows
RECORD_2026_07_17 = dict(
    lr=LR, momentum=MU, ns_coefficients="polar_express", eps=1e-6, normuon_beta2=BETA2,
    normuon_axis="shape", normuon_form="fp32_mean_squares", qk_split="head_pairs",
    weight_decay=DECAY, weight_decay_form="cautious", lr_scale="original",
)  # fmt: skip
SHAPES = {"qkvo": (4, D, D), "fc": (4 * D, D), "proj": (4 * D, D)}  # both MLP stored tall
M = {"qkvo": 1.0, "fc": 2.0, "proj": 4.0}  # fc: the shape factor 2; proj: 2 × lr_mul 2


def blocks(x: torch.Tensor, name: str, split: bool) -> list[torch.Tensor]:
    """The matrices of a parameter (views): Q/K head pairs, V, O; or the matrix itself."""
    if name != "qkvo":
        return [x]
    if not split:
        return list(x)
    return [x[i, k : k + ROWS] for i in (0, 1) for k in range(0, D, ROWS)] + [x[2], x[3]]


def reference(weights, grads, *, split=True, axis="shape", beta2=BETA2, m=M):
    """Steps of record_2026_07_17's NorMuon in float64; returns the weights after each step."""
    w = {n: x.double().clone() for n, x in weights.items()}
    b = {n: torch.zeros_like(x) for n, x in w.items()}
    v: dict = {}
    out = []
    for step in grads:
        for n, g in step.items():
            b[n].mul_(MU).add_((1 - MU) * g.double())
            u = (1 - MU) * g.double() + MU * b[n]
            o_hat = torch.zeros_like(u)
            pairs = zip(blocks(u, n, split), blocks(o_hat, n, split), strict=True)
            for j, (uj, oj) in enumerate(pairs):
                o = polar_express(uj)
                rows, cols = o.shape
                dim = -1 if axis == "shape" and rows >= cols else -2
                vj = v.setdefault((n, j), torch.zeros_like(o.mean(dim, keepdim=True)))
                vj.mul_(beta2).add_((1 - beta2) * (o * o).mean(dim, keepdim=True))
                scaled = o / vj.clamp_min(1e-10).sqrt()
                oj.copy_(scaled * o.norm() / scaled.norm().clamp_min(1e-10))
            mask = (o_hat * w[n] >= 0).double()
            w[n] = w[n] - m[n] * LR * o_hat - DECAY * LR * (m[n] * LR) * mask * w[n]
        out.append({n: x.clone() for n, x in w.items()})
    return out


def draw(dtype=torch.float64, steps=2):
    gen = torch.Generator().manual_seed(0)
    weights = {n: (torch.rand(s, generator=gen, dtype=torch.float64) - 0.5) / 16
               for n, s in SHAPES.items()}  # fmt: skip
    grads = [{n: torch.randn(s, generator=gen, dtype=torch.float64) for n, s in SHAPES.items()}
             for _ in range(steps)]  # fmt: skip
    params = {n: torch.nn.Parameter(w.to(dtype, copy=True)) for n, w in weights.items()}
    params["qkvo"].muon_head_rows = ROWS  # as build_optimizer marks a (4, d, d) stack
    params["qkvo"].stack_of = "q, k, v, o"  # as the model's merged attention declares it
    params["proj"].lr_mul = 2.0
    return weights, grads, params


def run(params, grads, opt):
    out = []
    for step in grads:
        for n, p in params.items():
            p.grad = step[n].to(p.dtype)
        opt.step()
        out.append({n: p.detach().double().clone() for n, p in params.items()})
    return out


def close(a: dict, b: dict, atol: float) -> bool:
    return all(torch.allclose(a[n], b[n], rtol=0, atol=atol) for n in a)


def test_one_and_two_steps_are_the_formula_and_misreadings_are_not() -> None:
    weights, grads, params = draw()
    got = run(
        params,
        grads,
        Muon(params.values(), MuonConfig(**RECORD_2026_07_17), ns_dtype=torch.float64),
    )
    want = reference(weights, grads)
    for step in (0, 1):
        assert close(got[step], want[step], 1e-12), step
    misreadings = {
        "whole Q and K": reference(weights, grads, split=False),
        "per column (record_2025_11_29)": reference(weights, grads, axis="columns"),
        "beta2 0.95 (record_2025_11_29)": reference(weights, grads, beta2=0.95),
        "c_proj at 2 (lr_mul unread)": reference(weights, grads, m={**M, "proj": 2.0}),
        "c_fc at 1 (no shape factor)": reference(weights, grads, m={**M, "fc": 1.0}),
    }
    for name, wrong in misreadings.items():
        assert not close(got[1], wrong[1], 1e-6), name


def test_the_record_2026_07_17_normalisation_takes_both_norms_from_r() -> None:
    """The record's fused form equals the plain formula (here in float64); in bf16, ρ is
    rounded to bf16 and Ô = O·ρ is bf16."""
    spread = torch.linspace(0.1, 2, D, dtype=torch.float64)
    o = torch.randn(2, ROWS, D, dtype=torch.float64) * spread
    v0 = torch.rand(2, 1, D, dtype=torch.float64)
    v = v0.clone()
    got = normalise(o, v, BETA2, -2, "fp32_mean_squares")
    want_v = BETA2 * v0 + (1 - BETA2) * (o * o).mean(-2, keepdim=True)
    scaled = o / want_v.sqrt()
    want = scaled * o.norm(dim=(-2, -1), keepdim=True) / scaled.norm(dim=(-2, -1), keepdim=True)
    torch.testing.assert_close(v, want_v, rtol=1e-14, atol=0)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=0)
    ob = o.to(torch.bfloat16)
    got_b = normalise(ob, v0.float(), BETA2, -2, "fp32_mean_squares").double()
    od = ob.double()
    scaled = od / (BETA2 * v0 + (1 - BETA2) * (od * od).mean(-2, keepdim=True)).sqrt()
    rho = (scaled * od.norm(dim=(-2, -1), keepdim=True) / scaled.norm(dim=(-2, -1), keepdim=True)
           / od)[:, :1]  # fmt: skip
    rho_b = rho.to(torch.bfloat16).double()
    torch.testing.assert_close(got_b, (od * rho_b).to(torch.bfloat16).double(), rtol=0, atol=0)
    assert not torch.equal(got_b, (od * rho).to(torch.bfloat16).double())  # ρ unrounded


def test_the_master_is_exact_and_the_weight_its_truncation() -> None:
    """bf16 weights with the fp32 master (bf16 ‖ mantissa) follow the float64 chain to fp32
    precision, where plain bf16 weights do not; each weight is its master truncated toward
    zero, not rounded to nearest. Momentum and second moments are fp32, and survive a
    state_dict round trip as fp32."""
    _, grads, params = draw(torch.bfloat16, steps=2)
    start = {n: p.detach().double() for n, p in params.items()}
    hp = MuonConfig(**RECORD_2026_07_17, master_weights="fp32_truncated")
    opt = Muon(params.values(), hp, ns_dtype=torch.float32)
    run(params, grads, opt)
    rounded = [{n: g.to(torch.bfloat16) for n, g in step.items()} for step in grads]
    want = reference(start, rounded)[-1]
    plain = dict(draw(torch.bfloat16, steps=2)[2])
    got_plain = run(plain, grads, Muon(plain.values(), MuonConfig(**RECORD_2026_07_17),
                                       ns_dtype=torch.float32))[-1]  # fmt: skip
    masters = {}
    for n, p in params.items():
        state = opt.state[p]
        assert state["momentum_buffer"].dtype == torch.float32
        assert state["mantissa"].dtype == torch.int16
        high = p.detach().view(torch.int16).to(torch.int32) << 16
        master = (high | (state["mantissa"].to(torch.int32) & 0xFFFF)).view(torch.float32)
        masters[n] = master.double()
        assert (master.abs() >= p.detach().float().abs()).all()  # toward zero
        assert (master.sign() * p.detach().float().sign() >= 0).all()
        assert not torch.equal(master.to(torch.bfloat16), p.detach())  # round-to-nearest differs
    assert close(masters, want, 2e-7)
    assert not close(got_plain, want, 1e-5)
    fresh = Muon(params.values(), hp, ns_dtype=torch.float32)
    fresh.load_state_dict(opt.state_dict())
    buf = fresh.state[params["fc"]]["momentum_buffer"]
    assert buf.dtype == torch.float32
    assert torch.equal(buf, opt.state[params["fc"]]["momentum_buffer"])


def test_the_master_step_decays_where_the_update_is_zero() -> None:
    """The record's mask is Ô⊙W ≥ 0: a zero update entry takes the decay (">" would not)."""
    w = torch.tensor([[0.5, -0.25, 0.125, 1.0]], dtype=torch.float64)
    o = torch.tensor([[0.0, 0.0, -1.0, 2.0]], dtype=torch.float64)
    group = {"lr": LR, "weight_decay": DECAY}
    weight, mantissa = w.to(torch.bfloat16), torch.zeros(w.shape, dtype=torch.int16)  # exact
    hp = MuonConfig(**{**RECORD_2026_07_17, "normuon_beta2": 0.0})  # the step after NorMuon
    step_matrix(weight, o, group, hp, lr_mul=4.0, mantissa=mantissa)
    master = master_of(weight, mantissa).double()
    m = 4.0
    want = w - m * LR * o - DECAY * LR * (m * LR) * (o * w >= 0).double() * w
    strict = w - m * LR * o - DECAY * LR * (m * LR) * (o * w > 0).double() * w
    torch.testing.assert_close(master, want, rtol=1e-5, atol=0)  # products rounded to fp32
    assert not torch.allclose(master, strict, rtol=1e-4, atol=0)


def test_record_2025_11_29_fixes() -> None:
    """(b) the gates' decay coefficient is bf16(1.2·η), not bf16(1.2·bf16(η)); (a) O stays in
    bf16 through the normalisation (each step rounded), where the fp32 form does not round."""
    bf16 = torch.bfloat16
    differs = [
        f for f in torch.linspace(0.1, 1.93, 400).tolist()
        if torch.tensor(1.2 * LR * f, dtype=torch.float64).to(bf16)
        != torch.tensor(1.2 * torch.tensor(LR * f).to(bf16).item()).to(bf16)
    ]  # fmt: skip
    assert differs  # the η where the two readings part
    for f in differs[:5]:
        want = torch.tensor(1.2 * LR * f, dtype=torch.float64).to(bf16).item()
        group = {"lr": LR * f, "weight_decay": DECAY, "momentum": MU}
        assert host_values(group, MuonConfig(normuon_form="o_dtype"), bf16)["coefficient"] == want
    o = (torch.randn(8, 24, dtype=torch.float64) * torch.linspace(0.1, 2, 24)).to(bf16)
    v = torch.rand(1, 24, dtype=torch.float32)
    record = normalise(o, v.clone(), 0.95, -2, "o_dtype")
    fp32 = normalise(o, v.clone(), 0.95, -2, "fp32")
    assert record.dtype == bf16 and fp32.dtype == torch.float32
    v2 = v.clone().lerp_((o * o).mean(-2, keepdim=True).float(), 0.05)
    step1 = (o / v2.sqrt()).to(bf16)
    want = (step1 * (o.norm() / step1.norm())).to(bf16)
    torch.testing.assert_close(record, want, rtol=0, atol=0)
    assert not torch.equal(fp32, record.float())


def test_refusals_name_their_key(monkeypatch: pytest.MonkeyPatch) -> None:
    p = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"master_weights=fp32_truncated needs bf16 matrices"):
        Muon([torch.nn.Parameter(torch.zeros(4, 4))], MuonConfig(master_weights="fp32_truncated"))
    with pytest.raises(ValueError, match=r"qk_split=head_pairs runs in one process .*fsdp"):
        Muon([p], MuonConfig(qk_split="head_pairs"), parallelism="fsdp_gather")
    with pytest.raises(ValueError, match=r"normuon_form=fp32_mean_squares needs NorMuon"):
        MuonConfig(normuon_form="fp32_mean_squares").validate()
    with pytest.raises(ValueError, match=r"qk_split=head_pairs needs the \(4, d, d\)"):
        mark_head_pairs(torch.nn.Linear(4, 4), [("weight", p)], "head_pairs")
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    hp = MuonConfig(master_weights="fp32_truncated")
    with pytest.raises(ValueError, match=r"master_weights=fp32_truncated runs .*ddp_owners"):
        Muon([p], hp, process_group=object(), parallelism="ddp_owners")  # type: ignore[arg-type]


def test_record_2026_07_17_model_at_toy_size_takes_it() -> None:
    """record_2026_07_17's model (d = 96, 6 heads of 16) with its NorMuon keys through
    build_optimizer: W_q, W_k in blocks of 32 rows (per-column statistics: wide), W_v, W_o and both
    MLP matrices per row; every weight bf16, the truncation of its master."""
    from model import GPT
    from optim import build_optimizer
    from tests.helpers import compose_config
    from trainer.config import to_config

    keys = {**RECORD_2026_07_17, "master_weights": "fp32_truncated"}
    cfg = to_config(compose_config([
        "model=record_2026_07", "run_dir=.", "model.n_embd=96", "model.bigram.rows=97",
        "train.stages.rows=[{window:3,mtp_weights:[1.0]}]",
        "model.bigram.dim=8", "model.bigram.signs=16", "model.residual.mudd_hidden=8",
        "model.compile=false", *(f"optim.muon.{k}={v}" for k, v in keys.items()),
    ]))  # fmt: skip
    cfg.optim.lr_mul = {"*mlp.proj*": 2.0}
    model = GPT(cfg.model, cfg.train.stages)
    muon = build_optimizer(model, cfg.optim, device=torch.device("cpu")).parts[0]
    params = [p for g in muon.param_groups for p in g["params"]]
    for p in params:
        p.grad = torch.randn_like(p)
    muon.step()
    attn, mlp = model.blocks[0].attn.qkvo, model.blocks[0].mlp
    assert attn.muon_head_rows == 32 and mlp.fc.weight.muon_head_rows == 0
    moments = {k: tuple(v.shape) for k, v in muon.state[attn].items() if "second" in k}
    assert moments == {"second_moment": (6, 1, 96), "second_moment_1": (2, 96, 1)}
    assert muon.state[mlp.proj.weight]["second_moment"].shape == (384, 1)
    assert mlp.proj.weight.lr_mul == 2.0 and mlp.fc.weight.lr_mul == 1.0
    for p in params:
        bits = p.view(torch.int16).to(torch.int32) << 16
        low = muon.state[p]["mantissa"].to(torch.int32) & 0xFFFF
        master = (bits | low).view(torch.float32)
        assert p.dtype == torch.bfloat16 and (master.abs() >= p.float().abs()).all()


def test_record_2025_11_29_keeps_o_in_bf16_through_the_decay_term() -> None:
    """(a) O ← bf16(O + λη·M⊙W): with η = 1 and bf16-valued fp32 weights the final
    subtraction is exact, so the weight shows the rounded sum; the fp32 form does not round."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(16, 24, generator=gen).bfloat16().float()
    o = torch.randn(16, 24, generator=gen).bfloat16()
    group = {"lr": 1.0, "weight_decay": 0.3}
    # the step after NorMuon (β₂ = 0 leaves it out)
    keys = dict(normuon_beta2=0.0, weight_decay=0.3, weight_decay_form="cautious", lr_scale="none")
    got = {}
    for form in ("o_dtype", "fp32"):
        got[form] = w.clone()
        step_matrix(got[form], o, group, MuonConfig(**keys, normuon_form=form))
    o64, w64 = o.double(), w.double()
    coef = torch.tensor(0.3).item()  # λ·η in fp32
    summed = (o64 + (coef * (o64 * w64 >= 0).double() * w64).float().double()).float()
    want = w64 - summed.bfloat16().double()
    torch.testing.assert_close(got["o_dtype"].double(), want, rtol=0, atol=0)
    assert not torch.equal(got["fp32"].double(), want)


def test_the_master_resumes_exactly() -> None:
    """Saved after 2 steps and loaded into a fresh optimizer: the next 2 steps are the
    uninterrupted run's, bit for bit (torch's load_state_dict would cast the int16 low halves
    and the fp32 moments to bf16; they are put back as saved)."""
    cfg = MuonConfig(lr=0.02, normuon_beta2=0.9, normuon_axis="shape",
                     normuon_form="fp32_mean_squares", master_weights="fp32_truncated",
                     weight_decay=1.2, weight_decay_form="cautious")  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(64, 32, generator=gen).bfloat16()
    grads = [torch.randn(64, 32, generator=gen).bfloat16() for _ in range(4)]
    w = torch.nn.Parameter(start.clone())
    opt = Muon([w], cfg)
    for k, g in enumerate(grads):
        w.grad = g.clone()
        opt.step()
        if k == 1:
            saved, at_save = copy.deepcopy(opt.state_dict()), w.detach().clone()
    w2 = torch.nn.Parameter(at_save)
    opt2 = Muon([w2], cfg)
    opt2.load_state_dict(saved)
    assert opt2.state[w2]["mantissa"].dtype == torch.int16
    for g in grads[2:]:
        w2.grad = g.clone()
        opt2.step()
    assert torch.equal(w2, w)
