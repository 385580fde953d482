"""record_2026_07_17's residual stream, the parts built so far (docs/records.md D.1 forward,
steps 4 and 5): the per-token skip gate and the attention of the late layers reading an
earlier layer's output, checked at each layer's input against the formulas in float64."""

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.config import update

BASE = ModelConfig(n_layer=4, n_head=2, n_embd=32, gate_channels=12)


def run(cfg: ModelConfig, seed: int = 0) -> tuple[GPT, torch.Tensor, dict, dict]:
    """A float64 model with every parameter random, one forward; each block's input and
    output and each attention's input, by layer."""
    torch.manual_seed(seed)
    model = GPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    ins, outs, attn_in = {}, {}, {}
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda m, a, i=i: ins.__setitem__(i, a[0]))
        block.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o))
        block.attn.register_forward_pre_hook(lambda m, a, i=i: attn_in.__setitem__(i, a[0]))
    idx = torch.randint(0, 50257, (2, 10), generator=torch.Generator().manual_seed(1))
    model(idx)
    x0 = F.rms_norm(model.embed(idx), (32,))
    return model, x0, ins, {"out": outs, "attn": attn_in}


def test_the_skip_gate_is_per_token() -> None:
    """Input of layer 2 = out₁ + σ(w)·2·σ(x0_t[0:12]·gᵀ)·out₀ (D.1 step 4, the skip 3 → 6 in
    the record's layers)."""
    cfg = update(BASE, {"residual.skips": [[0, 2]],
                        "residual.skip_per_token": True})  # fmt: skip
    model, x0, ins, got = run(cfg)
    w, g = model.scalars.skip_gate, model.skips.token_gate.weight  # (), (1, 12)
    gate = torch.sigmoid(w) * 2 * torch.sigmoid(x0[..., :12] @ g.T)  # (B, T, 1)
    assert gate.std() > 0.01  # it does vary by token
    want = got["out"][1] + gate * got["out"][0]
    torch.testing.assert_close(ins[2], want, rtol=1e-13, atol=1e-13)
    one_weight = got["out"][1] + torch.sigmoid(w) * got["out"][0]  # record_2025_11_29's gate
    assert (ins[2] - one_weight).abs().max() > 1e-3
    without_two = got["out"][1] + gate / 2 * got["out"][0]
    assert (ins[2] - without_two).abs().max() > 1e-3


def test_a_closed_token_gate_is_record_2025_11_29_skip() -> None:
    """g = 0 (its initial value): σ(w)·2·σ(0) = σ(w), bit for bit the one-weight skip."""
    on = update(BASE, {"residual.skips": [[0, 2]],
                       "residual.skip_per_token": True})  # fmt: skip
    torch.manual_seed(0)
    a = GPT(on)
    assert not a.skips.token_gate.weight.any()
    with torch.no_grad():
        for block in a.blocks:  # open the branches so the skip matters
            torch.nn.init.normal_(block.mlp.proj.weight, std=0.5)
    b = GPT(update(on, {"residual.skip_per_token": False}))
    b.load_state_dict({k: v for k, v in a.state_dict().items() if "token_gate" not in k})
    idx = torch.randint(0, 50257, (1, 8), generator=torch.Generator().manual_seed(2))
    assert torch.equal(a(idx), b(idx))
    with pytest.raises(ValueError, match=r"model\.residual\.skip_per_token"):
        update(BASE, {"residual.skip_per_token": True}).validate()


def test_later_layers_attend_from_an_earlier_output() -> None:
    """With attn_input_layer = 0 the attention of layers 1–3 reads RMSNorm(out₀), layer 0 its own
    stream (record_2026_07_17: layers 8–10 read RMSNorm(c₇)). Layer 1's own stream is out₀ anyway;
    layers 2 and 3 tell the two apart."""
    _, _, ins, got = run(update(BASE, {"residual.attn_input_layer": 0}))
    torch.testing.assert_close(got["attn"][0], F.rms_norm(ins[0], (32,)))
    for layer in (1, 2, 3):
        torch.testing.assert_close(got["attn"][layer], F.rms_norm(got["out"][0], (32,)))
    for layer in (2, 3):
        assert (got["attn"][layer] - F.rms_norm(ins[layer], (32,))).abs().max() > 1e-3
    with pytest.raises(ValueError, match=r"model\.residual\.attn_input_layer"):
        update(BASE, {"residual.attn_input_layer": 4}).validate()


def test_x0_is_injected_right_after_attention() -> None:
    """x ← r·x + p·Attn(u) + λ^x0_ℓ·x0, then the MLP; a layer without attention injects
    nothing (D.1 step 5; record_2026_07_17's layer 6)."""
    cfg = update(BASE, {"residual.x0_after_attention": True, "residual.sublayer_scales": True,
                        "attention.layers": "A.AA"})  # fmt: skip
    torch.manual_seed(0)
    model = GPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    assert (
        model.x0_injection.lambdas.shape == (4,)
        and model.x0_injection.lambdas.dtype == torch.float64
    )
    seen: dict = {}
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(("in", i), a[0]))
        block.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(("out", i), o))
        block.mlp.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(("mlp", i), o))
        if block.attn is not None:
            block.attn.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(("a", i), o))
    idx = torch.randint(0, 50257, (2, 10), generator=torch.Generator().manual_seed(1))
    model(idx)
    x0 = F.rms_norm(model.embed(idx), (32,))
    r, p, lam = (
        model.sublayer_scales.resid_lambdas,
        model.sublayer_scales.post_lambdas,
        model.x0_injection.lambdas,
    )
    for i in range(4):
        x = seen["in", i]
        if i != 1:
            x = r[i, 0] * x + p[i, 0] * seen["a", i] + lam[i] * x0
        want = r[i, 1] * x + p[i, 1] * seen["mlp", i]
        torch.testing.assert_close(seen["out", i], want, rtol=1e-13, atol=1e-13)
    without = (
        r[0, 1] * (r[0, 0] * seen["in", 0] + p[0, 0] * seen["a", 0]) + p[0, 1] * seen["mlp", 0]
    )
    assert (seen["out", 0] - without).abs().max() > 1e-3  # the λ^x0 term is there
    assert GPT(BASE).x0_injection is None  # off builds nothing
    assert not GPT(cfg).x0_injection.lambdas.any()  # λ^x0 starts at 0
