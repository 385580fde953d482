"""record_2026_07_17's λ⁰/λ¹, scalar vector, inits and dtypes (docs/records.md D.1:
"Inits and dtypes", "λ⁰ and λ¹", Attn_ℓ steps 1 and 9), each checked against the record's
formula or number."""

import math

import pytest
import torch

from model import GPT, ModelConfig
from model.config import update

D_KEYS = {
    "attention.merged_qkvo": True, "attention.weight_lambdas": True,
    "attention.out_init": "uniform", "numerics.packed_scalars": True,
    "numerics.scalars_layout": "weight_lambdas", "embed.smear": True,
    "residual.skips": [[1, 2]], "residual.skip_per_token": True,
}  # fmt: skip


def record_2026_07_17(**changes: object) -> ModelConfig:
    return update(ModelConfig(n_layer=3, n_head=2, n_embd=32), {**D_KEYS, **changes})


def test_the_scalar_vector_is_the_records_table() -> None:
    """D.1: 2ℓ, 2ℓ+1 = (λ⁰, λ¹) from (0.5, 1); 2n = λ_smear 0; 2n+1 = w_skip −1.5; then ones
    to the multiple (11 layers: 24 entries, no padding)."""
    model = GPT(update(record_2026_07_17(), {"n_layer": 11}))
    v = model.scalars.packed.detach()
    assert v.shape == (24,) and v.dtype == torch.float32
    assert v[0:22:2].eq(0.5).all() and v[1:22:2].eq(1.0).all()
    assert v[22] == 0.0 and v[23] == -1.5
    assert GPT(record_2026_07_17()).scalars.packed.tolist() == [0.5, 1, 0.5, 1, 0.5, 1, 0, -1.5]
    assert GPT(record_2026_07_17(n_layer=4)).scalars.packed.tolist()[8:] == [
        0,
        -1.5,
        1,
        1,
        1,
        1,
        1,
        1,
    ]


def test_the_lambdas_multiply_the_weights_in_float64() -> None:
    """q, k, v = u·(λ⁰·W_qkv)ᵀ and out = y·(λ¹·W_o)ᵀ: the same as the model without λ whose
    weights are the scaled ones; and λ's gradient is that of the scale."""
    torch.manual_seed(0)
    on = GPT(record_2026_07_17()).double()
    with torch.no_grad():
        on.scalars.packed[0:6] = torch.tensor([0.3, 1.7, -0.8, 0.6, 1.2, 2.1])
    off = GPT(
        update(
            record_2026_07_17(),
            {"attention.weight_lambdas": False, "numerics.scalars_layout": "mixes"},
        )
    ).double()
    with torch.no_grad():
        for name, p in off.named_parameters():
            if name.endswith("qkvo"):
                layer = int(name.split(".")[1])
                p.copy_(on.get_parameter(name))
                p[:3] *= on.scalars.packed[2 * layer]
                p[3] *= on.scalars.packed[2 * layer + 1]
            elif name == "scalars.packed":  # smear and skip logits at their old places
                p[off.scalars.layout.smear] = on.scalars.packed[6]
                p[off.scalars.layout.skip_gate(0)] = on.scalars.packed[7]
            else:
                p.copy_(on.get_parameter(name))
    idx = torch.randint(0, 50257, (2, 10), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(on(idx), off(idx), rtol=1e-12, atol=1e-12)
    # λ's gradient: ∂L/∂λ⁰ = Σ ∂L/∂W'·W for W' = λ⁰·W (the chain rule through the weights)
    loss_on, loss_off = on(idx).square().mean(), off(idx).square().mean()
    loss_on.backward()
    loss_off.backward()
    for layer in range(3):
        w = on.blocks[layer].attn.qkvo
        g = off.blocks[layer].attn.qkvo.grad
        grad = on.scalars.packed.grad
        torch.testing.assert_close(grad[2 * layer], (g[:3] * w[:3]).sum(), rtol=1e-9, atol=0)
        torch.testing.assert_close(grad[2 * layer + 1], (g[3] * w[3]).sum(), rtol=1e-9, atol=0)


def test_the_own_lambdas_without_the_packed_vector() -> None:
    """Unpacked, each attention holds its (λ⁰, λ¹); scaling them is scaling its weights."""
    torch.manual_seed(0)
    cfg = update(ModelConfig(n_layer=2, n_head=2, n_embd=32), {"attention.weight_lambdas": True})
    model = GPT(cfg).double()
    attn = model.blocks[0].attn
    assert attn.weight_lambdas.tolist() == [0.5, 1.0]
    assert attn.weight_lambdas.role == "scalar"
    with torch.no_grad():
        attn.o.weight.normal_()
        model.lm_head.weight.normal_()
    idx = torch.randint(0, 50257, (1, 6), generator=torch.Generator().manual_seed(2))
    before = model(idx)
    with torch.no_grad():  # λ⁰ → 2λ⁰ with W_qkv/2, λ¹ → 3λ¹ with W_o/3: the same forward
        attn.weight_lambdas.mul_(torch.tensor([2.0, 3.0], dtype=torch.float64))
        for w in (attn.q.weight, attn.k.weight, attn.v.weight):
            w.div_(2)
        attn.o.weight.div_(3)
    torch.testing.assert_close(model(idx), before, rtol=1e-12, atol=1e-12)


def test_the_records_inits_at_its_width() -> None:
    """Q, K, V, O all U(±1/32) at d = 768 (1/32 = √3·0.5/√768), c_proj zero, head N(0, 0.005²),
    E = W_headᵀ, gates zero; bf16 where the table says bf16, the scalars fp32."""
    torch.manual_seed(0)
    cfg = update(ModelConfig(n_layer=2, n_head=6, n_embd=768, init_std=0.5), {
        **D_KEYS, "residual.skips": [],
        "residual.skip_per_token": False, "attention.gate": True,
        "numerics.dtype": "bf16", "numerics.bf16_matrices": True, "head.bf16": True,
        "head.init_std": 0.005, "embed.tied_init": True, "mlp.proj_in_out": True,
    })  # fmt: skip
    model = GPT(cfg)
    assert math.isclose(1 / 32, math.sqrt(3) * 0.5 / math.sqrt(768))
    w = model.blocks[0].attn.qkvo.float()
    for s in range(4):  # each of W_q, W_k, W_v, W_o: uniform on ±1/32 (std 1/(32√3))
        assert w[s].abs().max() <= 1 / 32
        assert abs(w[s].std().item() * 32 * math.sqrt(3) - 1) < 0.01
    mlp = model.blocks[0].mlp
    assert mlp.proj.weight.shape == (3072, 768) and mlp.fc.weight.shape == (3072, 768)
    assert mlp.proj.weight.eq(0).all() and abs(mlp.fc.weight.float().abs().max() - 1 / 32) < 1e-3
    head = model.lm_head.weight
    assert abs(head.float().std().item() / 0.005 - 1) < 0.01
    assert torch.equal(model.embed.weight, head)  # E = W_headᵀ (both stored (vocab, d))
    assert model.blocks[0].attn.gate.weight.eq(0).all() and model.smear_gate.weight.eq(0).all()
    for name, p in model.named_parameters():
        assert p.dtype == (torch.float32 if name == "scalars.packed" else torch.bfloat16), name


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"numerics.packed_scalars": False}, r"layout=weight_lambdas .*packed_scalars=true"),
        ({"numerics.scalars_layout": "mixes"}, r"weight_lambdas has no place"),
        ({"residual.x0_shortcut": True}, r"no place for model\.residual\.x0_shortcut"),
        ({"numerics.bf16_matrices": True}, r"bf16_matrices=true needs model\.numerics\.dtype"),
        ({"embed.tied_init": True, "embed.rows": 50257}, r"embed\.rows must be 0"),
        ({"head.init_std": -1.0}, r"head\.init_std must be >= 0"),
    ],
)
def test_bad_settings_name_their_key(changes: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        record_2026_07_17(**changes).validate()


def test_off_the_model_is_as_before() -> None:
    torch.manual_seed(0)
    a = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32))
    assert a.blocks[0].attn.weight_lambdas is None  # off builds nothing
    assert not any("weight_lambdas" in n for n, _ in a.named_parameters())
    assert a.blocks[0].attn.o.weight.eq(0).all() and a.lm_head.weight.eq(0).all()
