"""record_2026_07_17's training loss (docs/records.md D.2, with its FP8 head, and D.4): multi-token
prediction with the stage weights, and the record's own form whose loss writes the e5m2 logit
gradient (σ rounded to bf16, the end-of-sequence quirk) that the FP8 head uses as its G₈.
Each is checked against the formula written here in float64, with explicit casts."""

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.config import HeadConfig, update
from model.forward_schedule import forward_args
from model.loss import model_loss
from model.mtp_schedule import mtp_weights_at
from model.record_loss import e5m2_satfinite, record_head_loss, record_loss_rows
from optim.config import OptimConfig
from stages import Stage, StageTable
from trainer.config import TrainConfig
from trainer.forward import forward_backward
from trainer.runtime import init_runtime
from trainer.schedule import Schedule
from trainer.train_step import filled

CAP = {"softcap": 23.0, "softcap_form": "sigmoid", "softcap_shift": 5.0, "softcap_divisor": 7.5}
PLAIN = HeadConfig(**CAP, loss="plain", reduction="sum", mtp=True)
RECORD = HeadConfig(**CAP, loss="sigmoid_e5m2_grad", reduction="sum", mtp=True)
G_S, X_S, W_S = 0.75 / 448, 100 / 448, 1.6 / 448  # fixed_over_448's divisors
WEIGHTS = [1.0, 0.5, 0.2]
B, T, V = 2, 6, 40
# Seeds whose reference values all lie clear of rounding boundaries (`cast`)
GRAD_SEED, HEAD_SEED = 3, 0


def data(seed: int, scale: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    z = (torch.randn(B, T, V, generator=gen) * scale).to(torch.bfloat16)
    return z, torch.randint(0, V, (B, T), generator=gen)


def kept(i: int) -> list[int]:
    """The k whose target y_{i+k} lies in the row."""
    return [k for k in range(len(WEIGHTS)) if i + k < T]


def cast(x: torch.Tensor, dtype: torch.dtype, band: torch.Tensor | float = 2.5e-7) -> torch.Tensor:
    """x (float64) rounded to `dtype` (e5m2 saturating), asserting that no value lies within
    `band` (relative, or absolute where a tensor) of a rounding boundary: the reference then
    decides every rounding, whatever the last bits of fp32 arithmetic (the default: two fp32
    roundings)."""
    delta = x.abs() * band if isinstance(band, float) else band

    def to(v: torch.Tensor) -> torch.Tensor:
        return v.clamp(-57344, 57344).to(dtype) if dtype == torch.float8_e5m2 else v.to(dtype)

    lo, hi = to(x - delta), to(x + delta)
    assert torch.equal(lo.double(), hi.double()), "test data on a rounding boundary: reseed"
    return lo


def sigma_ref(z: torch.Tensor, rounded: bool = True) -> torch.Tensor:
    """bf16(σ((z + 5)/7.5)) in float64 (fp32's ½ + ½·tanh errs by ~1e-7 absolute)."""
    sig = 1 / (1 + torch.exp(-(z.double() + 5) / 7.5))
    return cast(sig, torch.bfloat16, 2e-7 + 2e-7 * sig).double() if rounded else sig


def g_ref(
    z: torch.Tensor, y: torch.Tensor, quirk: bool = True, rounded: bool = True
) -> tuple[torch.Tensor, ...]:
    """(loss, G before the cast, its rounding band) of the record's form, by loops over rows,
    positions and k: G = (23/7.5)/g_s·(S_w·p − Σ_k w_k·1[y_{i+k} = j])·σ(1 − σ), S_w = Σ of all
    K weights (quirk) or of the kept ones (the 'fixed' reading); σ rounded or not."""
    sig = sigma_ref(z, rounded).view(B * T, V)
    c = 23 * sig
    lse = torch.logsumexp(c, -1)
    p = torch.exp(c - lse[:, None])
    g, band, loss = torch.zeros_like(p), torch.zeros_like(p), 0.0
    for b in range(B):
        for i in range(T):
            n = b * T + i
            s_w = sum(WEIGHTS) if quirk else sum(WEIGHTS[k] for k in kept(i))
            onehots = torch.zeros(V, dtype=torch.float64)
            for k in kept(i):
                t = y[b, i + k]
                loss += WEIGHTS[k] * (lse[n] - c[n, t]).item()
                onehots[t] += WEIGHTS[k]
            factor = (23 / 7.5) / G_S * sig[n] * (1 - sig[n])
            g[n] = factor * (s_w * p[n] - onehots)
            band[n] = factor * (s_w * p[n] + onehots) * 1e-5 + g[n].abs() * 1e-5
    return torch.tensor(loss, dtype=torch.float64), g, band


def shifted(y: torch.Tensor) -> torch.Tensor:
    """(B·T, K) targets y_{i+k}, −1 where dropped, written out by loops."""
    out = torch.full((B * T, len(WEIGHTS)), -1)
    for b in range(B):
        for i in range(T):
            for k in kept(i):
                out[b * T + i, k] = y[b, i + k]
    return out


# record_2026_07_17's MTP column (D.4): the weights of each stage, the last falling over it
STAGES_D = StageTable(
    rows=[Stage(mtp_weights=w) for w in ([1.0, 0.5, 0.25], [1.0, 0.5], [1.0])], mtp_decay=True
)


def test_the_weights_follow_the_records_stages() -> None:
    """D.4: [1, 0.5, 0.25·(1 − s/460)] → [1, 0.5·(1 − (s − 460)/460)] → [1], zeros padding
    the dropped k, at the record's 1,380 scheduled steps; the values are the record's bits,
    its 0.25·(1 − 3x) with x = s/1,380 in stage 0 and 0.5·(1 − (3x − 1)) in stage 1."""
    w = STAGES_D
    for s in (0, 300, 459):
        assert mtp_weights_at(w, s, 1380) == (1.0, 0.5, 0.25 * (1 - 3 * (s / 1380)))
        assert mtp_weights_at(w, s, 1380)[2] == pytest.approx(0.25 * (1 - s / 460), abs=1e-15)
    for s in (460, 552, 919):
        assert mtp_weights_at(w, s, 1380) == (1.0, 0.5 * (1 - (3 * (s / 1380) - 1)), 0.0)
        assert mtp_weights_at(w, s, 1380)[1] == pytest.approx(0.5 * (1 - (s - 460) / 460))
    for s in (920, 1379, 1380, 1389):  # the extension keeps [1]
        assert mtp_weights_at(w, s, 1380) == (1.0, 0.0, 0.0)
    assert mtp_weights_at(w, 0, 1380) != (1.0, 0.5, 0.0)  # the third weight starts at 0.25
    held = StageTable(rows=w.rows)  # without mtp_decay each row's weights hold
    assert mtp_weights_at(held, 459, 1380) == (1.0, 0.5, 0.25)
    assert mtp_weights_at(held, 919, 1380) == (1.0, 0.5, 0.0)
    # the step-argument route: only with head.mtp, a 1-D tensor on the device
    on = update(ModelConfig(), {"head.mtp": True})
    schedule = Schedule(1390, OptimConfig(), on, TrainConfig(steps=1390, stages=w))
    assert schedule.model_args(500)["mtp_weights"] == mtp_weights_at(w, 500, 1390)
    assert "mtp_weights" not in forward_args(ModelConfig(), w, 500, 1390)
    tensor = filled(mtp_weights_at(w, 10, 1380), torch.device("cpu"))
    assert tensor.shape == (3,) and tensor.tolist() == list(mtp_weights_at(w, 10, 1380))


def test_the_mtp_loss_and_its_gradient_are_the_formula() -> None:
    """Plain form, by autograd: Σ_i Σ_k w_k·(lse_i − ĉ_i[y_{i+k}]) over the kept terms, and its
    true gradient (S_w over the kept terms only), against loops in float64."""
    z, y = data(0)
    z = z.double().requires_grad_()
    loss = model_loss(z, y, PLAIN, True, torch.tensor(WEIGHTS, dtype=torch.float64))
    loss.backward()
    zd = z.detach()
    sig = torch.sigmoid((zd + 5) / 7.5)
    c = 23 * sig
    lse = torch.logsumexp(c, -1)
    want, grad = 0.0, torch.zeros_like(zd)
    for b in range(B):
        for i in range(T):
            for k in kept(i):
                t = y[b, i + k]
                want += WEIGHTS[k] * (lse[b, i] - c[b, i, t]).item()
                onehot = F.one_hot(t, V).double()
                grad[b, i] += WEIGHTS[k] * (torch.softmax(c[b, i], -1) - onehot)
    grad *= 23 / 7.5 * sig * (1 - sig)
    torch.testing.assert_close(loss, torch.tensor(want, dtype=torch.float64), rtol=1e-13, atol=0)
    torch.testing.assert_close(z.grad, grad, rtol=1e-11, atol=1e-15)
    # negative controls: targets wrapping around the row end, or running into the next row
    wrapped = sum(WEIGHTS[k] * (lse[b, i] - c[b, i, y[b, (i + k) % T]]).item()
                  for b in range(B) for i in range(T) for k in range(3))  # fmt: skip
    flat = y.flatten()
    across = sum(WEIGHTS[k] * (lse.flatten()[n] - c.flatten(0, 1)[n, flat[n + k]]).item()
                 for n in range(B * T) for k in range(3) if n + k < B * T)  # fmt: skip
    assert abs(wrapped - want) > 1 and abs(across - want) > 1
    mean = HeadConfig(**{**PLAIN.__dict__, "reduction": "mean"})
    torch.testing.assert_close(
        model_loss(zd, y, mean, True, torch.tensor(WEIGHTS, dtype=torch.float64)) * B * T, loss
    )


def test_evaluation_is_the_next_token_mean() -> None:
    z, y = data(1)
    want = F.cross_entropy(23 * torch.sigmoid((z.float().flatten(0, 1) + 5) / 7.5), y.flatten())
    for cfg in (PLAIN, RECORD):
        got = model_loss(z.float(), y, cfg, False, torch.tensor(WEIGHTS))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


def test_the_record_forms_logit_gradient_is_the_formula_with_its_quirk() -> None:
    """G₈ = e5m2((23/7.5)/g_s·(S_w·p − Σ_k w_k·1[y_{i+k} = j])·σ(1 − σ)), σ rounded to bf16,
    S_w over all K weights also at each row's last K − 1 positions."""
    z, y = data(GRAD_SEED)
    loss, g8 = record_loss_rows(z.flatten(0, 1), shifted(y), torch.tensor(WEIGHTS), RECORD, G_S)
    want_loss, g, band = g_ref(z, y)
    torch.testing.assert_close(loss.double(), want_loss, rtol=1e-5, atol=0)
    assert g8.dtype == torch.float8_e5m2
    assert torch.equal(g8.double(), cast(g, torch.float8_e5m2, band).double())
    # negative controls: the 'fixed' S_w differs exactly at the row ends; σ not rounded differs
    _, fixed, band = g_ref(z, y, quirk=False)
    differs = (g8.double() != cast(fixed, torch.float8_e5m2, band).double()).view(B, T, V)
    assert differs[:, T - 2 :].any(dim=-1).all() and not differs[:, : T - 2].any()
    _, unrounded, _ = g_ref(z, y, rounded=False)
    assert (g8.double() != unrounded.clamp(-57344, 57344).to(torch.float8_e5m2).double()).any()
    # satfinite: past 57,344 the cast saturates, NaN stays
    big = e5m2_satfinite(torch.tensor([1e6, -1e6, 60000.0, float("nan")])).float()
    assert big[:3].tolist() == [57344.0, -57344.0, 57344.0] and math.isnan(big[3])


def e4m3(v: torch.Tensor, divisor: float) -> torch.Tensor:
    """e4m3(bf16(v / divisor)) as float64, the division in fp32 as bf16 arithmetic does it
    (W·280 often lands exactly between two bf16 values: the fp32 divisor decides)."""
    q = v.float() / torch.tensor(divisor, dtype=torch.float32)
    return q.to(torch.bfloat16).to(torch.float8_e4m3fn).double()


def gemm(a8: torch.Tensor, b8: torch.Tensor, s_a: float, s_b: float) -> torch.Tensor:
    """An FP8 GEMM's output before its last cast: the exact sum of the FP8 products (float64
    holds it), times the product of the two fp32 scales, rounded to fp32 (model/fp8.py). The
    products times x_s·w_s often land within fp32's rounding of a bf16 tie: only these
    explicit roundings decide them."""
    scale = torch.tensor(s_a, dtype=torch.float32) * torch.tensor(s_b, dtype=torch.float32)
    return (a8 @ b8 * scale.double()).float()


def head_ref(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(loss, ∂X, ∂W) of D.1's FP8 head and the record's loss, in float64 with explicit casts:
    X₈ = e4m3(bf16(X/x_s)), W₈ = e4m3(bf16(W/w_s)) (`e4m3`), logits = bf16(X₈·W₈ᵀ·x_s·w_s)
    (`gemm`), G₈ from the loss as above; ∂X = bf16(G₈·W₈·g_s·w_s), ∂W = bf16((X₈ᵀ·G₈·x_s·g_s)ᵀ)
    (W is V × d here, the record's transpose)."""
    x8, w8 = (e4m3(v, s) for v, s in ((x.flatten(0, 1), X_S), (weight, W_S)))
    logits = gemm(x8, w8.T, X_S, W_S).to(torch.bfloat16).view(B, T, V)
    loss, g, band = g_ref(logits, y)
    g8 = cast(g, torch.float8_e5m2, band).double()
    dx = gemm(g8, w8, G_S, W_S).to(torch.bfloat16)
    dw = gemm(x8.T, g8, X_S, G_S).T.to(torch.bfloat16)
    return loss, dx, dw


def head_data(seed: int) -> tuple[torch.Tensor, torch.nn.Linear, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, 32, generator=gen).to(torch.bfloat16).requires_grad_()
    head = torch.nn.Linear(32, V, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, 32, generator=gen) * 0.08)
    return x, head, torch.randint(0, V, (B, T), generator=gen)


def test_the_whole_head_path_is_d1s_formula() -> None:
    """FP8 head + record form (fp8_scales=fixed_over_448) against `head_ref`; with k
    micro-steps G₈ is the same and dequantised at g_s/k; the incoming gradient is ignored."""
    x, head, y = head_data(HEAD_SEED)
    w = torch.tensor(WEIGHTS)
    loss = record_head_loss(head, x, y, w, RECORD, "fixed_over_448")
    loss.backward()
    want_loss, dx, dw = head_ref(x.detach(), head.weight.detach(), y)
    torch.testing.assert_close(loss.double(), want_loss, rtol=1e-5, atol=0)
    assert torch.equal(x.grad.flatten(0, 1), dx) and torch.equal(head.weight.grad, dw)
    grads = x.grad.clone(), head.weight.grad.clone()
    x.grad = head.weight.grad = None
    (record_head_loss(head, x, y, w, RECORD, "fixed_over_448", micro_steps=2) * 7).backward()
    assert torch.equal(x.grad * 2, grads[0]) and torch.equal(head.weight.grad * 2, grads[1])


GPT_CFG = update(ModelConfig(n_layer=1, n_head=2, n_embd=32), {
    "numerics.dtype": "bf16", "numerics.fp8_scales": "fixed_over_448", "head.fp8": True,
    "head.mtp": True, **{f"head.{k}": v for k, v in CAP.items()}, "head.reduction": "sum",
    "head.loss": "sigmoid_e5m2_grad"})  # fmt: skip


def test_the_model_takes_the_weights_as_a_step_value() -> None:
    torch.manual_seed(0)
    model = GPT(GPT_CFG)
    idx = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(4))
    y = idx.roll(-1, 1)
    table = StageTable(rows=[Stage(mtp_weights=WEIGHTS)], mtp_decay=True)
    args = {"mtp_weights": filled(mtp_weights_at(table, 0, 100), torch.device("cpu"))}
    loss = forward_backward(model, (idx, y), init_runtime("cpu", "none"), model_args=args)
    assert torch.isfinite(loss) and model.lm_head.weight.grad.abs().sum() > 0
    assert model.count_flops(idx, **args) > 0
    with pytest.raises(ValueError, match=r"model\.head\.mtp"):
        model(idx, y)  # training without its weights
    # evaluation: next-token mean, as the plain loss without MTP gives it
    plain = GPT(update(GPT_CFG, {"head.loss": "plain", "head.mtp": False}))
    plain.load_state_dict(model.state_dict())
    model.eval()
    plain.eval()
    assert torch.equal(model(idx, y, **args), plain(idx, y))
    # plain form: weights [1, 0, 0] are next-token training
    fp32 = update(ModelConfig(n_layer=1, n_head=2, n_embd=32), {"head.reduction": "sum"})
    mtp = GPT(update(fp32, {"head.mtp": True, "head.loss": "plain"}))
    one = GPT(fp32)
    one.load_state_dict(mtp.state_dict())
    torch.testing.assert_close(mtp(idx, y, mtp_weights=torch.tensor([1.0, 0, 0])), one(idx, y))


def test_off_builds_nothing_and_wrong_settings_name_their_key() -> None:
    assert not HeadConfig().mtp and HeadConfig().loss == "auto"
    off, on = GPT(ModelConfig(n_layer=1)), GPT(update(ModelConfig(n_layer=1), {"head.mtp": True}))
    assert list(off.state_dict()) == list(on.state_dict())
    idx = torch.randint(0, 50257, (1, 8), generator=torch.Generator().manual_seed(5))
    weights = torch.tensor([1.0, 0.5, 0.25])  # ignored without head.mtp
    assert torch.equal(off(idx, idx, mtp_weights=weights), off(idx, idx))
    for base, changes, key in (
        (ModelConfig(), {"head.mtp": True, "head.loss": "fused"}, r"model\.head\.mtp"),
        (ModelConfig(), {"head.mtp": True, "head.loss_dtype": "bf16"}, r"model\.head\.loss_dtype"),
        (GPT_CFG, {"head.fp8": False}, r"model\.head\.fp8"),
        (GPT_CFG, {"head.reduction": "mean"}, r"model\.head\.reduction"),
        (GPT_CFG, {"head.softcap_form": "tanh", "head.softcap_shift": 0.0,
                   "head.softcap_divisor": 0.0}, r"model\.head\.softcap_form"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=key):
            update(base, changes).validate()
    GPT_CFG.validate()
    for weights, said in (([1.0, -0.5], "must be finite weights >= 0"),
                          ([1.0, float("nan")], "must be finite weights >= 0")):  # fmt: skip
        with pytest.raises(ValueError, match=rf"train\.stages\.rows\.0\.mtp_weights {said}"):
            StageTable(rows=[Stage(mtp_weights=weights)]).validate(10)
