"""Per-sublayer residual scales (record #89; docs/records.md D.1 step 5 and "Per-sublayer
residual scales") against their formulas.

With `residual.sublayer_scales` each layer ℓ computes
    x ← r^A_ℓ·x + p^A_ℓ·Attn_ℓ(RMSNorm(x)),   x ← r^M_ℓ·x + p^M_ℓ·MLP_ℓ(RMSNorm(x)),
with (r, p) learned fp32 scalars (sublayer_scales.resid_lambdas and .post_lambdas: (n_layer,
2), column 0 the attention sublayer, column 1 the MLP), initialised √1.1 and 1, Adam's scalar
group, and cast to the residual stream's dtype before use. Without the option each sublayer
adds F(RMSNorm(x)).
`reference()` writes the forward pass out by hand from the parameters, read by name.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.config import update
from optim.partition import param_roles
from tests.reference import norm, rotate

# bf16 dtypes below follow the CPU's bf16 path: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

BASE = ModelConfig(n_layer=3, n_head=2, n_embd=32)
ON = update(BASE, {"residual.sublayer_scales": True})
SCALES = ("sublayer_scales.resid_lambdas", "sublayer_scales.post_lambdas")


def reference(model: GPT, idx: torch.Tensor, variant: str = "spec") -> torch.Tensor:
    """Logits by D.1 step 5. The other variants are wrong readings, used as negative controls:
    r and p exchanged, the attention and MLP columns exchanged, or the x0 mix after r^A."""
    cfg, P = model.cfg, dict(model.named_parameters())
    H, D, (B, T) = cfg.n_head, cfg.head_dim, idx.shape
    r, p = P["sublayer_scales.resid_lambdas"], P["sublayer_scales.post_lambdas"]
    if variant == "r<->p":
        r, p = p, r
    if variant == "columns":
        r, p = r.flip(1), p.flip(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = x0 = norm(P["embed.weight"][idx])
    for layer in range(cfg.n_layer):
        pre = f"blocks.{layer}."
        (rA, rM), (pA, pM) = r[layer], p[layer]
        if variant == "x0 after r":  # scale first, then mix: a·(r^A·x) + b·x0 + p^A·Attn
            a, b = P[pre + "x0_mix"]
            x, rA = a * (rA * x) + b * x0, 1.0
        elif cfg.residual.x0_shortcut:
            a, b = P[pre + "x0_mix"]
            x = a * x + b * x0
        u = norm(x)
        q, k, v = ((u @ P[pre + f"attn.{n}.weight"].T).view(B, T, H, D) for n in "qkv")
        q, k = rotate(norm(q), cfg.attention.rope_base), rotate(norm(k), cfg.attention.rope_base)
        scale = cfg.attention.scale or 1 / math.sqrt(D)
        scores = torch.einsum("bihd,bjhd->bhij", q, k).mul(scale).masked_fill(~causal, -math.inf)
        y = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v).reshape(B, T, H * D)
        x = rA * x + pA * (y @ P[pre + "attn.o.weight"].T)
        hidden = F.relu(norm(x) @ P[pre + "mlp.fc.weight"].T).square()
        x = rM * x + pM * (hidden @ P[pre + "mlp.proj.weight"].T)
    c = cfg.head.softcap
    return c * torch.tanh(norm(x) @ P["lm_head.weight"].T / c)


def randomised(cfg: ModelConfig, double: bool = True, seed: int = 0) -> GPT:
    """Every weight random (the zero-initialised o, proj and head too, so that each sublayer
    and the logits are non-trivial); r and p distinct per layer and column, and r ≠ p, so
    that exchanging any two of them changes the result."""
    torch.manual_seed(seed)
    model = GPT(cfg).double() if double else GPT(cfg)
    n = cfg.n_layer
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "sublayer_scales.resid_lambdas":
                p.copy_(torch.linspace(0.6, 1.4, 2 * n).view(n, 2))
            elif name == "sublayer_scales.post_lambdas":
                p.copy_(torch.linspace(1.7, 0.3, 2 * n).view(n, 2).roll(1, 1))
            else:
                p.copy_(torch.randn(p.shape) * (0.5 if p.ndim >= 2 else 0.3)
                        + (p.ndim < 2) * 0.5)  # fmt: skip
    return model


def tokens(B: int = 2, T: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 50257, (B, T), generator=torch.Generator().manual_seed(seed))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("x0", [False, True], ids=["plain", "x0_shortcut"])
def test_forward_and_gradients_match_the_formulas(x0: bool) -> None:
    model = randomised(update(ON, {"residual.x0_shortcut": x0}))
    idx = tokens()
    targets = idx.roll(-1, 1)
    got, want = model(idx), reference(model, idx)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # The model's own loss runs in fp32 (head.loss_dtype); it must agree to fp32 precision.
    loss_want = F.cross_entropy(want.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(model(idx, targets).double(), loss_want, rtol=1e-6, atol=0)
    # Gradients of the float64 cross-entropy mean through the model's logits, every parameter.
    names, params = zip(*model.named_parameters(), strict=True)
    loss_got = F.cross_entropy(got.flatten(0, 1), targets.flatten())
    g_got = torch.autograd.grad(loss_got, params)
    g_want = torch.autograd.grad(loss_want, params)
    for name, a, b in zip(names, g_got, g_want, strict=True):
        assert b.abs().max() > 0, name  # every parameter, the scales included, is reached
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13, msg=name)
    # Negative controls: each wrong reading is far outside that tolerance.
    wrong = ["r<->p", "columns"] + ["x0 after r"] * x0
    for variant in wrong:
        assert rel(reference(model, idx, variant), got) > 1e-3, variant


def test_initial_values_shapes_and_roles() -> None:
    for overrides, r0, p0 in (
        ({}, math.sqrt(1.1), 1.0),
        ({"residual.resid_init": 0.7, "residual.post_init": 0.25}, 0.7, 0.25),
    ):
        model = GPT(update(ON, overrides))
        for name, value in zip(SCALES, (r0, p0), strict=True):
            p = model.get_parameter(name)
            assert p.shape == (BASE.n_layer, 2) and p.dtype == torch.float32, name
            # The init rounded once to fp32, in every entry.
            assert torch.equal(p.detach(), torch.full((BASE.n_layer, 2), value)), name
            assert p.role == "scalar" and p.requires_grad, name
        scalars = {n for n, _ in param_roles(model)["scalar"]}
        assert set(SCALES) <= scalars
    assert not torch.equal(
        GPT(ON).sublayer_scales.resid_lambdas.detach(), torch.ones(BASE.n_layer, 2)
    )


def test_off_builds_nothing() -> None:
    off, on = GPT(BASE), GPT(ON)
    off_names = {n for n, _ in off.named_parameters()}
    on_names = {n for n, _ in on.named_parameters()}
    assert off.sublayer_scales is None
    assert not off_names & set(SCALES)
    assert off_names == on_names - set(SCALES)
    assert set(SCALES) <= on_names  # the control: on does build them
    assert set(off.state_dict()) == set(on.state_dict()) - set(SCALES)


def test_unit_scales_are_the_plain_residual_bit_for_bit() -> None:
    off = randomised(BASE, double=False)
    on = GPT(ON)
    missing, unexpected = on.load_state_dict(off.state_dict(), strict=False)
    assert set(missing) == set(SCALES) and not unexpected
    with torch.no_grad():
        on.sublayer_scales.resid_lambdas.fill_(1.0)
        on.sublayer_scales.post_lambdas.fill_(1.0)
    idx = tokens()
    assert torch.equal(on(idx), off(idx))
    # Control: the scales are read at all (one entry away from 1 changes the logits).
    with torch.no_grad():
        on.sublayer_scales.post_lambdas[1, 1] = 1.5
    assert not torch.equal(on(idx), off(idx))


def test_bf16_stream_uses_scales_rounded_to_bf16() -> None:
    """In a bf16 stream r and p are cast to bf16 first: values between bf16 numbers give the
    same logits, bit for bit, as the values rounded to bf16 beforehand."""
    gen = torch.Generator().manual_seed(3)
    n = BASE.n_layer
    raw = {name: 0.6 + torch.rand(n, 2, generator=gen) for name in SCALES}
    rounded = {name: v.bfloat16().float() for name, v in raw.items()}
    assert all((raw[k] != rounded[k]).all() for k in SCALES)  # none is a bf16 number

    def logits(dtype: str, values: dict[str, torch.Tensor]) -> torch.Tensor:
        model = randomised(update(ON, {"numerics.dtype": dtype}), double=False)
        with torch.no_grad():
            for name in SCALES:
                model.get_parameter(name).copy_(values[name])
        return model(tokens())

    bf16 = logits("bf16", raw)
    assert torch.equal(bf16, logits("bf16", rounded))
    # Controls: in the bf16 stream a change of one bf16 step in r is visible ...
    r = "sublayer_scales.resid_lambdas"
    stepped = {**rounded, r: rounded[r].clone()}
    stepped[r][0, 0] += 2.0**-6  # 2 or 4 bf16 steps, still a bf16 number
    assert torch.equal(stepped[r], stepped[r].bfloat16().float())
    assert not torch.equal(bf16, logits("bf16", stepped))
    # ... and an fp32 stream uses the fp32 values unrounded, so there the two differ.
    assert not torch.equal(logits("fp32", raw), logits("fp32", rounded))
    # The scales learn in fp32 whatever the stream's dtype.
    model = randomised(update(ON, {"numerics.dtype": "bf16"}), double=False)
    model(tokens()).float().square().mean().backward()
    for name in SCALES:
        grad = model.get_parameter(name).grad
        assert grad is not None and grad.dtype == torch.float32 and grad.abs().min() > 0, name
