"""record_2026_07_17's value embeddings (docs/records.md D.1, "Gated value embeddings"): five
untied tables, N(0, 0.01²), each added to its layer's values gated per head,
aux_h = 2σ([u[0:6], ve[0:6]]·G[h]ᵀ)·ve_h, v ← v + aux; checked against the formula in float64."""

import pytest
import torch

from model import GPT, ModelConfig, attention
from model.config import update

# 4 layers, 2 heads of 16; tables 0 and 1 on layers 1 and 3, layer 2 without one
CFG = update(ModelConfig(n_layer=4, n_head=2, n_embd=32, gate_channels=12),
             {"embed.value_embeds": ".0.1", "embed.value_gate": True,
              "embed.value_std": 0.01})  # fmt: skip


def values_seen(model: GPT, monkeypatch: pytest.MonkeyPatch, idx: torch.Tensor) -> tuple:
    """The v each layer hands to the kernel, and each attention's input u."""
    seen_v, seen_u = [], []
    real = attention.attend

    def spy(q, k, v, mask, scale):
        seen_v.append(v.detach())
        return real(q, k, v, mask, scale)

    monkeypatch.setattr(attention, "attend", spy)
    for block in model.blocks:
        block.attn.register_forward_pre_hook(lambda m, a: seen_u.append(a[0].detach()))
    model(idx)
    return seen_v, seen_u


def test_the_gated_value_is_the_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = GPT(CFG).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    idx = torch.randint(0, 50257, (2, 9), generator=torch.Generator().manual_seed(1))
    seen_v, seen_u = values_seen(model, monkeypatch, idx)
    for layer, table in ((0, None), (1, "0"), (2, None), (3, "1")):
        attn, u = model.blocks[layer].attn, seen_u[layer]
        v = (u @ attn.v.weight.T).view(2, 9, 2, 16)
        if table is not None:  # the gates are the rows of value_gates.weight, in layer order
            ve, g = model.value_embeds[table](idx), model.value_gates.weight[int(table)]
            gate = 2 * torch.sigmoid(torch.cat([u[..., :6], ve[..., :6]], -1) @ g.T)
            assert gate.std() > 0.01  # per token and head
            v = v + gate[..., None] * ve.view(2, 9, 2, 16)
        else:
            assert model.value_gates.weight.shape[0] == 2  # no table, no gate, v as it is
        torch.testing.assert_close(seen_v[layer], v.transpose(1, 2), rtol=1e-13, atol=1e-13)
    # negative controls: the gate reading u[0:12] alone, or no factor 2, is not what ran
    attn, u, ve = model.blocks[1].attn, seen_u[1], model.value_embeds["0"](idx)
    raw, g = (u @ attn.v.weight.T).view(2, 9, 2, 16), model.value_gates.weight[0]
    for gate in (
        2 * torch.sigmoid(u[..., :12] @ g.T),
        torch.sigmoid(torch.cat([u[..., :6], ve[..., :6]], -1) @ g.T),
    ):
        wrong = (raw + gate[..., None] * ve.view(2, 9, 2, 16)).transpose(1, 2)
        assert (wrong - seen_v[1]).abs().max() > 1e-4
    assert not hasattr(attn, "value_mix")  # record_2025_11_29's α, β are gone


def test_the_gate_starts_open_and_the_tables_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """G = 0 at initialisation, so aux = 2σ(0)·ve = ve exactly; tables N(0, 0.01²)."""
    torch.manual_seed(0)
    model = GPT(CFG)
    for name in ("0", "1"):
        std = model.value_embeds[name].weight.std().item()
        assert 0.009 < std < 0.011
    assert not model.value_gates.weight.any()
    idx = torch.randint(0, 50257, (1, 5), generator=torch.Generator().manual_seed(2))
    seen_v, seen_u = values_seen(model, monkeypatch, idx)
    raw = (seen_u[1] @ model.blocks[1].attn.v.weight.T).view(1, 5, 2, 16)
    ve = model.value_embeds["0"](idx).view(1, 5, 2, 16)
    assert torch.equal(seen_v[1], (raw + ve).transpose(1, 2))


def test_the_gate_needs_tables() -> None:
    with pytest.raises(ValueError, match=r"model\.embed\.value_gate"):
        update(ModelConfig(), {"embed.value_gate": True}).validate()
