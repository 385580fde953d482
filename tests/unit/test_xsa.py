"""Learnable XSA (record #82; docs/records.md D.1 Attn_ℓ step 7 and "Learnable XSA") against
its formula.

In each attention layer with XSA, after y = softmax(s·q·kᵀ + mask)·v and before the output
projection, per head h and token t (v the token's own value vector for that head):
    v̂ = v / max(‖v‖, 10⁻⁴),   y_h,t ← y_h,t − tanh(α_ℓ,h)·⟨y_h,t, v̂_h,t⟩·v̂_h,t
with α = xsa.alphas, a learned (n_layer, n_head) fp32 tensor, zero at init (XSA off at step 0).
`reference()` writes the base GPT's forward pass out by hand from the parameters, read by name.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.config import update
from optim.partition import param_roles
from tests.reference import norm, rotate

BASE = ModelConfig(n_layer=3, n_head=2, n_embd=32)
ON = update(BASE, {"attention.xsa": "X.X"})
ON_LAYERS = (0, 2)
RECORD = ".X.XX..XX.X"  # record_2026_07_17's 11-layer XSA pattern
WRONG = ("sign", "no tanh", "previous token", "unnormalised", "no floor")


def xsa(y: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor, variant: str) -> torch.Tensor:
    """Step 7 on (B, T, H, D) tensors; the other variants are wrong readings (controls)."""
    # max(‖v‖, 1e-4) written as √max(‖v‖², 1e-8): the same value, with a gradient defined at v = 0.
    floor = 0.0 if variant == "no floor" else 1e-8
    vhat = v / v.square().sum(-1, keepdim=True).clamp_min(floor).sqrt()
    if variant == "previous token":
        vhat = vhat.roll(1, 1)
    if variant == "unnormalised":
        vhat = v
    gate = alpha if variant == "no tanh" else torch.tanh(alpha)
    sign = -1.0 if variant == "sign" else 1.0
    return y - sign * gate[:, None] * (y * vhat).sum(-1, keepdim=True) * vhat


def reference(model: GPT, idx: torch.Tensor, variant: str = "spec") -> torch.Tensor:
    cfg, P = model.cfg, dict(model.named_parameters())
    H, D, (B, T) = cfg.n_head, cfg.head_dim, idx.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = norm(P["embed.weight"][idx])
    for layer in range(cfg.n_layer):
        pre = f"blocks.{layer}."
        u = norm(x)
        q, k, v = ((u @ P[pre + f"attn.{n}.weight"].T).view(B, T, H, D) for n in "qkv")
        q, k = rotate(norm(q), cfg.attention.rope_base), rotate(norm(k), cfg.attention.rope_base)
        scale = cfg.attention.scale or 1 / math.sqrt(D)
        scores = torch.einsum("bihd,bjhd->bhij", q, k).mul(scale).masked_fill(~causal, -math.inf)
        y = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v)
        if layer in ON_LAYERS:
            y = xsa(y, v, P["xsa.alphas"][layer], variant)
        x = x + y.reshape(B, T, H * D) @ P[pre + "attn.o.weight"].T
        x = x + F.relu(norm(x) @ P[pre + "mlp.fc.weight"].T).square() @ P[pre + "mlp.proj.weight"].T
    c = cfg.head.softcap
    return c * torch.tanh(norm(x) @ P["lm_head.weight"].T / c)


def randomised(cfg: ModelConfig, double: bool = True, seed: int = 0) -> GPT:
    """Every weight random (the zero-initialised o, proj and head too); α distinct and non-zero
    per layer and head, some beyond |α| = 1 so that tanh(α) and α differ clearly."""
    torch.manual_seed(seed)
    model = GPT(cfg).double() if double else GPT(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "xsa.alphas":
                p.copy_(torch.linspace(-1.2, 1.3, p.numel()).view(p.shape))
            else:
                p.copy_(torch.randn(p.shape) * 0.5)
    return model


def tokens(B: int = 2, T: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 50257, (B, T), generator=torch.Generator().manual_seed(seed))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_forward_and_gradients_match_the_formula() -> None:
    model = randomised(ON)
    idx = tokens()
    targets = idx.roll(-1, 1)
    got, want = model(idx), reference(model, idx)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    names, params = zip(*model.named_parameters(), strict=True)
    g_got = torch.autograd.grad(F.cross_entropy(got.flatten(0, 1), targets.flatten()), params)
    g_want = torch.autograd.grad(F.cross_entropy(want.flatten(0, 1), targets.flatten()), params)
    for name, a, b in zip(names, g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13, msg=name)
        if name != "xsa.alphas":
            assert b.abs().max() > 0, name
    # α of a layer without XSA is never read; each α of a layer with XSA is.
    g_alpha = g_got[names.index("xsa.alphas")]
    for layer in range(BASE.n_layer):
        if layer in ON_LAYERS:
            assert (g_alpha[layer] != 0).all(), layer
        else:
            assert torch.equal(g_alpha[layer], torch.zeros(BASE.n_head, dtype=g_alpha.dtype))
    # Negative controls: each wrong reading is far outside the tolerance ("no floor" only
    # matters below ‖v‖ = 1e-4, tested in test_the_floor).
    for variant in WRONG[:-1]:
        assert rel(reference(model, idx, variant), got) > 1e-3, variant


def test_zero_alpha_is_the_plain_model_bit_for_bit() -> None:
    off = randomised(BASE, double=False)
    on = GPT(ON)
    missing, unexpected = on.load_state_dict(off.state_dict(), strict=False)
    assert set(missing) == {"xsa.alphas"} and not unexpected
    assert torch.equal(on.xsa.alphas.detach(), torch.zeros(BASE.n_layer, BASE.n_head))
    idx = tokens()
    assert torch.equal(on(idx), off(idx))
    # Control: one non-zero α of a layer with XSA changes the logits.
    with torch.no_grad():
        on.xsa.alphas[2, 1] = 0.5
    assert not torch.equal(on(idx), off(idx))


def test_off_builds_nothing_and_on_builds_zero_scalar_alphas() -> None:
    for pattern in ("", "..."):
        off = GPT(update(BASE, {"attention.xsa": pattern}))
        assert off.xsa is None
        assert not any("xsa" in n for n, _ in off.named_parameters())
        assert not any(s.xsa for s in off.plan)
    on = GPT(ON)
    alphas = on.xsa.alphas
    assert alphas.shape == (BASE.n_layer, BASE.n_head) and alphas.dtype == torch.float32
    assert torch.equal(alphas.detach(), torch.zeros(BASE.n_layer, BASE.n_head))
    assert alphas.requires_grad and alphas.role == "scalar"
    assert "xsa.alphas" in {n for n, _ in param_roles(on)["scalar"]}
    assert [s.xsa for s in on.plan] == [layer in ON_LAYERS for layer in range(BASE.n_layer)]
    summary = on.plan_summary().split(" | ")
    assert len(summary) == BASE.n_layer
    assert [("xsa" in s) for s in summary] == [s.xsa for s in on.plan]
    # bf16 numerics keep α in fp32 (the parameter table's dtype).
    assert GPT(update(ON, {"numerics.dtype": "bf16"})).xsa.alphas.dtype == torch.float32


def scaled_head0(model: GPT, v_scale: float, o_scale: float) -> None:
    """Multiply head 0's value rows (of every layer) by v_scale and its W_o columns by o_scale."""
    D, P = model.cfg.head_dim, dict(model.named_parameters())
    with torch.no_grad():
        for layer in range(model.cfg.n_layer):
            P[f"blocks.{layer}.attn.v.weight"][:D] *= v_scale
            P[f"blocks.{layer}.attn.o.weight"][:, :D] *= o_scale


def test_the_floor() -> None:
    idx = tokens()
    targets = idx.roll(-1, 1)
    # Head 0's values exactly zero: v̂ = 0/1e-4 = 0, finite logits and gradients.
    model = randomised(ON)
    scaled_head0(model, 0.0, 1.0)
    logits = model(idx)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, reference(model, idx), rtol=1e-12, atol=1e-12)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    # Head 0's values small but non-zero (‖v‖ ≈ 5e-5 < 1e-4), W_o scaled up to keep head 0
    # visible: the floor divides by 1e-4, not by ‖v‖, so v̂ is shorter than a unit vector.
    model = randomised(ON)
    scaled_head0(model, 5e-6, 2e5)
    P = dict(model.named_parameters())
    v0 = norm(norm(P["embed.weight"][idx])) @ P["blocks.0.attn.v.weight"].T  # layer 0's values
    v_norms = v0[..., : model.cfg.head_dim].norm(dim=-1)
    assert (v_norms < 1e-4).all() and (v_norms > 1e-5).all()
    got, want = model(idx), reference(model, idx)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # Control: dividing by ‖v‖ itself (no floor) gives other logits.
    assert rel(reference(model, idx, "no floor"), got) > 1e-3


@pytest.mark.parametrize("n_layer", [11, 4])  # 4: no rounding ties (0, 3⅓, 6⅔, 10)
def test_pattern_and_bad_character(n_layer: int) -> None:
    cfg = ModelConfig(n_layer=n_layer, n_head=2, n_embd=32)
    model = GPT(update(cfg, {"attention.xsa": RECORD}))
    # Nearest-layer resampling: layer ℓ of n reads character round(ℓ·(m−1)/(n−1)).
    want = [RECORD[round(layer * 10 / (n_layer - 1))] == "X" for layer in range(n_layer)]
    if n_layer == 11:
        assert [i for i, on in enumerate(want) if on] == [1, 3, 4, 7, 8, 10]
    assert [s.xsa for s in model.plan] == want
    assert model.xsa.alphas.shape == (n_layer, 2)
    with pytest.raises(ValueError, match=r"model\.attention\.xsa"):
        GPT(update(BASE, {"attention.xsa": "XY."}))
