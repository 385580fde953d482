"""record_2026_07_17's MUDD dense connections (docs/records.md D.1 "MUDD", steps 5–6, D.10 item 4)
against the record's formulas, written out here in float64.

The toy model maps record_2026_07_17's layers onto 5: layer 1 (table 0) is the record's layer 1 and
its output c₃ (the skip's source), layer 2 has no attention and takes the gated skip (the record's
layer 6) and its output is c₇ (attn_input_layer), layer 3 attends from RMSNorm(c₇) (layers 8, 9),
layer 4 is the MUDD block with table 1 (the record's layer 10 with VE₄); sublayer scales, x0 after
attention, per-head value gates and sparse attention gates are on, as in the record.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.config import update
from model.forward_context import build_context
from model.mudd import coefficients
from model.step_inputs import step_inputs
from optim.partition import param_roles
from tests.reference import norm, rotate

H, D, K = 2, 16, 12  # heads, head dim, gate channels
CFG = update(ModelConfig(n_layer=5, n_head=H, n_embd=H * D, gate_channels=K), {
    "residual.mudd": True, "residual.attn_input_layer": 2, "residual.skips": [[1, 2]],
    "attention.layers": "AA.AA", "embed.value_embeds": ".0..1",
    "embed.value_gate": True, "attention.gate": True, "residual.sublayer_scales": True,
    "residual.x0_after_attention": True,
})  # fmt: skip
NAMES = ("mudd.w1", "mudd.w2", "mudd.b2")


def gelu(z: torch.Tensor, form: str) -> torch.Tensor:
    if form == "tanh":
        return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    return 0.5 * z * (1 + torch.erf(z / math.sqrt(2)))


def mudd(P: dict, y: torch.Tensor, j: int, n: int, form: str = "erf") -> list[torch.Tensor]:
    """MUDD_j(y) = 0.1·(GELU(y·W1_jᵀ)·W2_j[0:n]ᵀ + b2_j[0:n]), n columns (B, T, 1)."""
    w1, w2, b2 = P["mudd.w1"][j], P["mudd.w2"][j, :n], P["mudd.b2"][j, :n]
    out = 0.1 * (gelu(y @ w1.T, form) @ w2.T + b2)
    return [out[..., i : i + 1] for i in range(n)]


def attn(P: dict, layer: int, u: torch.Tensor, aux: torch.Tensor, base: float) -> torch.Tensor:
    """Attn_ℓ(u) with v ← v + aux (B, T, H, D), QK-norm, rotary, causal, sparse gate."""
    pre, (B, T, _) = f"blocks.{layer}.attn.", u.shape
    q, k, v = ((u @ P[pre + f"{n}.weight"].T).view(B, T, H, D) for n in "qkv")
    v = v + aux
    q, k = rotate(norm(q), base), rotate(norm(k), base)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    s = torch.einsum("bihd,bjhd->bhij", q, k).div(math.sqrt(D)).masked_fill(~causal, -math.inf)
    y = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)
    y = y * torch.sigmoid(u[..., :K] @ P[pre + "gate.weight"].T)[..., None]
    return y.reshape(B, T, H * D) @ P[pre + "o.weight"].T


def mlp(P: dict, layer: int, n: torch.Tensor) -> torch.Tensor:
    pre = f"blocks.{layer}.mlp."
    return F.relu(n @ P[pre + "fc.weight"].T).square() @ P[pre + "proj.weight"].T


def mudd_layer(
    P: dict, x, c0, c7, ve, base: float, variant: str = "spec", bigram=None
) -> torch.Tensor:
    """The record's layer 10 (last layer 4 here), from D.1 "MUDD"."""
    B, T, _ = x.shape
    form = "tanh" if variant == "tanh gelu" else "erf"
    m = mudd(P, x, 0, 14, form)
    v_mudd = m[0] * c0 + m[1] * c7 + m[2] * x
    x_new = (1 + m[5]) * x + m[3] * c0 + m[4] * c7
    if variant == "v from recombined x":  # misreading: v_mudd after the recombination
        v_mudd = m[0] * c0 + m[1] * c7 + m[2] * x_new
    x = x_new
    first, second = (m[7], m[6]) if variant == "m6<->m7" else (m[6], m[7])
    g = torch.cat([first.expand(B, T, H // 2), second.expand(B, T, H - H // 2)], -1)[..., None]
    aux = g * ve.view(B, T, H, D) + v_mudd.view(B, T, H, D)
    x = m[8] * x + m[9] * attn(P, 4, norm(c7), aux, base) + m[10] * c0
    if bigram is not None:
        k = bigram.size(-1)
        x = torch.cat([x[..., :k] + m[11] * bigram, x[..., k:]], -1)
    return m[12] * x + m[13] * mlp(P, 4, norm(x))


def reference(model: GPT, idx: torch.Tensor, variant: str = "spec") -> torch.Tensor:
    """Logits by D.1 steps 1–6 for the toy layout (module docstring)."""
    cfg, P = model.cfg, dict(model.named_parameters())
    base, (B, T) = cfg.attention.rope_base, idx.shape
    r, p, lam = (
        P["sublayer_scales.resid_lambdas"],
        P["sublayer_scales.post_lambdas"],
        P["x0_injection.lambdas"],
    )
    ve0, ve1 = P["value_embeds.0.weight"][idx], P["value_embeds.1.weight"][idx]
    x = x0 = norm(P["embed.weight"][idx])
    outs = []
    for layer in range(4):
        if layer == 2:  # the skip from c₃ = out₁, no attention
            x = x + torch.sigmoid(P["scalars.skip_gate"]) * outs[1]
        else:
            u = norm(outs[2] if layer == 3 else x)
            aux = torch.zeros(B, T, H, D, dtype=x.dtype)
            if layer == 1:  # per-head value gate on table 0
                gate_in = torch.cat([u[..., : K // 2], ve0[..., : K // 2]], -1)
                gate = 2 * torch.sigmoid(gate_in @ P["value_gates.weight"][0].T)
                aux = gate[..., None] * ve0.view(B, T, H, D)
            x = r[layer, 0] * x + p[layer, 0] * attn(P, layer, u, aux, base) + lam[layer] * x0
        x = r[layer, 1] * x + p[layer, 1] * mlp(P, layer, norm(x))
        outs.append(x)
    c0, c3, c7, c9 = x0, outs[1], outs[2], x
    x = mudd_layer(P, x, c0, c7, ve1, base, variant)
    n = mudd(P, x, 1, 5, "tanh" if variant == "tanh gelu" else "erf")
    back = c9 if variant == "n1 on c9" else c7
    x = x + n[0] * c0 + n[1] * back + n[2] * c9 + n[3] * ve0 + n[4] * c3
    c = cfg.head.softcap
    return c * torch.tanh(norm(x) @ P["lm_head.weight"].T / c)


def randomised(cfg: ModelConfig = CFG, seed: int = 0) -> GPT:
    """Float64, every parameter random: W2 too, so every coefficient matters."""
    torch.manual_seed(seed)
    model = GPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
    return model


def tokens(B: int = 2, T: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 50257, (B, T), generator=torch.Generator().manual_seed(seed))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_logits_and_every_gradient_match_the_spec() -> None:
    model, idx = randomised(), tokens()
    got, want = model(idx), reference(model, idx)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    targets = idx.roll(-1, 1)
    names, params = zip(*model.named_parameters(), strict=True)
    g_got = torch.autograd.grad(F.cross_entropy(got.flatten(0, 1), targets.flatten()), params)
    g_want = torch.autograd.grad(F.cross_entropy(want.flatten(0, 1), targets.flatten()), params)
    for name, a, b in zip(names, g_got, g_want, strict=True):
        assert b.abs().max() > 0, name  # every parameter is reached
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    # The post-loop network reads 5 outputs; MUDD layer 4's value gate is never read.
    assert g_got[names.index("mudd.w2")][1, 5:].abs().max() == 0
    assert g_got[names.index("value_gates.weight")][1].abs().max() == 0  # layer 4's row: unread
    # Negative controls: plausible misreadings are far outside the tolerance.
    for variant in ("v from recombined x", "n1 on c9", "tanh gelu", "m6<->m7"):
        assert rel(reference(model, idx, variant), got) > 1e-5, variant


def test_the_bigram_term_enters_the_mudd_layer_with_m11() -> None:
    """x[:, 0:k] += m11·b after the attention sublayer, b = the context's bigram term."""
    model = randomised()
    idx, gen = tokens(), torch.Generator().manual_seed(4)
    x, c7 = (torch.randn(2, 8, H * D, generator=gen, dtype=torch.float64) for _ in range(2))
    b = torch.randn(2, 8, 5, generator=gen, dtype=torch.float64)
    step = step_inputs(CFG.attention, None, None, None, None)
    ctx = build_context(model, idx, x, step, None)  # x0 = c₀ = x here
    ctx.bigram_term = b
    got = model.blocks[4](x, model.rotary, ctx, model.points, c7)
    P, ve = dict(model.named_parameters()), model.value_embeds["1"](idx)
    base = CFG.attention.rope_base
    torch.testing.assert_close(got, mudd_layer(P, x, x, c7, ve, base, bigram=b), rtol=1e-12,
                               atol=1e-12)  # fmt: skip
    assert rel(mudd_layer(P, x, x, c7, ve, base), got) > 1e-6  # control: b does enter


def test_initial_coefficients_are_the_static_layers() -> None:
    """W2 = 0: m8 = m12 = √1.1 and m9 = m13 = 1 (the sublayer scales), m6 = m7 = 2, m11 = 0.05,
    m10 and the sources 0; n1 = −0.5 (the backout), the other n 0. The init: W1 Kaiming-uniform
    U(±1/√d), two draws j = 0, 1."""
    model = GPT(CFG)
    assert not model.mudd.w2.any()
    y = torch.randn(2, 3, H * D)
    P = {k: v.detach().double() for k, v in model.named_parameters()}
    m = torch.cat(mudd(P, y.double(), 0, 14), -1)
    want = torch.zeros(14, dtype=torch.float64)
    want[6:14] = torch.tensor([2, 2, math.sqrt(1.1), 1, 0, 0.05, math.sqrt(1.1), 1])
    torch.testing.assert_close(m, want.expand_as(m), rtol=1e-7, atol=1e-7)
    n = torch.cat(mudd(P, y.double(), 1, 5), -1)
    torch.testing.assert_close(n, torch.tensor([0, -0.5, 0, 0, 0.0]).double().expand_as(n))
    bound = 1 / math.sqrt(H * D)
    torch.manual_seed(7)
    model.mudd.reset()
    torch.manual_seed(7)
    drawn = torch.empty(2, 64, H * D)
    for j in range(2):
        torch.nn.init.uniform_(drawn[j], -bound, bound)
    assert torch.equal(model.mudd.w1.detach(), drawn)


def test_with_w2_zero_the_block_is_the_static_layer_and_backout() -> None:
    """Without a table on the last layer: the MUDD model at W2 = 0 is the plain model whose last
    layer has r = √1.1, p = 1, λ^x0 = 0, followed by the backout x − 0.5·c₇."""
    on = update(CFG, {"embed.value_embeds": ".0..."})
    static = update(on, {"residual.mudd": False, "residual.backout_layer": 2})
    a = randomised(on)
    a.mudd.reset()
    b = GPT(static).double()
    missing, unexpected = b.load_state_dict(a.state_dict(), strict=False)
    assert set(unexpected) == set(NAMES) and set(missing) == {"scalars.backout_lambda"}
    with torch.no_grad():
        (
            b.sublayer_scales.resid_lambdas[4],
            b.sublayer_scales.post_lambdas[4],
            b.x0_injection.lambdas[4],
        ) = math.sqrt(1.1), 1.0, 0.0
        b.scalars.backout_lambda.fill_(0.5)
    idx = tokens()
    torch.testing.assert_close(a(idx), b(idx), rtol=1e-6, atol=1e-6)  # b2 is fp32-rounded
    with torch.no_grad():
        b.scalars.backout_lambda.fill_(0.4)
    assert rel(a(idx), b(idx)) > 1e-4  # control


def test_bf16_model_stores_and_runs_the_networks_in_bf16() -> None:
    """In a bf16 model the tensors are bf16 (√1.1/0.1 stored as 10.5, so m8 = bf16(1.05) =
    1.046875) and the networks run in bf16; all three are Adam's (role "scalar")."""
    model = GPT(update(CFG, {"numerics.dtype": "bf16"}))
    assert all(model.get_parameter(n).dtype == torch.bfloat16 for n in NAMES)
    assert model.mudd.b2[0, 8].item() == model.mudd.b2[0, 12].item() == 10.5
    y = torch.randn(1, 2, H * D).bfloat16()
    m = coefficients(y, (model.mudd.w1, model.mudd.w2, model.mudd.b2), 0, 14)
    assert m[8].dtype == torch.bfloat16 and m[8].shape == (1, 2, 1)
    assert (m[8] == 1.046875).all()
    model(tokens()).float().square().mean().backward()
    assert all(model.get_parameter(n).grad.dtype == torch.bfloat16 for n in NAMES)
    scalars = {n for n, _ in param_roles(model)["scalar"]}
    assert set(NAMES) <= scalars


def test_off_builds_nothing() -> None:
    off = update(CFG, {"residual.mudd": False})
    names = {n for n, _ in GPT(off).named_parameters()}
    on = {n for n, _ in GPT(CFG).named_parameters()}
    assert not names & set(NAMES)
    assert on == names | set(NAMES)


@pytest.mark.parametrize(("change", "key"), [
    ({"residual.attn_input_layer": -1}, "attn_input_layer"),
    ({"residual.attn_input_layer": 4}, "attn_input_layer"),
    ({"residual.skips": []}, "skips"),
    ({"residual.backout_layer": 2}, "backout_layer"),
    ({"embed.value_embeds": "..1.1"}, "value_embeds"),
    ({"n_head": 1, "n_embd": 16}, "n_head"),
    ({"attention.layers": "AA.A."}, "attention.layers"),
    ({"residual.mudd_hidden": 0}, "mudd_hidden"),
])  # fmt: skip
def test_missing_sources_are_named(change: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        GPT(update(CFG, change))
