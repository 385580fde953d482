"""record_2026_07_17's attention, the parts built so far (docs/records.md D.1 Attn_ℓ): the
interleaved rotary with a static second half (step 3) and the key offset of the long-window
layers (step 4), each against its formula written out channel by channel."""

import math

import pytest
import torch

from model import GPT, ModelConfig, attention
from model.config import AttentionConfig, update
from model.heads import offset_keys
from model.rotary import Rotary, static_spans

D, T = 16, 12  # head dim (D/4 = 4 rotating pairs), positions


def interleaved_formula(z: torch.Tensor, omega: list[float]) -> torch.Tensor:
    """D.1 step 3 for (B, T, H, D) in float64: pair j = channels (2j, 2j+1) for j < D/4,
    θ = t·ω_j; z_2j ← z_2j·cos θ + z_2j+1·sin θ, z_2j+1 ← z_2j+1·cos θ − z_2j·sin θ."""
    out = z.clone()
    for t in range(z.size(1)):
        for j, w in enumerate(omega):
            c, s = math.cos(t * w), math.sin(t * w)
            a, b = z[:, t, :, 2 * j], z[:, t, :, 2 * j + 1]
            out[:, t, :, 2 * j], out[:, t, :, 2 * j + 1] = a * c + b * s, b * c - a * s
    return out


def omegas() -> list[float]:
    """ω_j = 1024^(−j/(D/4 − 1)), as fp32 numbers (the tables are fp32)."""
    return [float(torch.tensor(1024.0 ** (-j / (D // 4 - 1)), dtype=torch.float32))
            for j in range(D // 4)]  # fmt: skip


def test_interleaved_rotary_is_the_formula() -> None:
    z = torch.randn(2, T, 3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rotary = Rotary(D, mode="interleaved_half")
    got = rotary(z)
    # θ is t·ω in fp32 before cos/sin: compare at fp32 precision of the angle
    torch.testing.assert_close(got, interleaved_formula(z, omegas()), rtol=1e-6, atol=1e-6)
    assert torch.equal(got[..., D // 2 :], z[..., D // 2 :])  # the second half never rotates
    c_pairs = Rotary(D, mode="half_truncated")(z)  # C's pairing (i, i + D/2): another rotation
    assert not torch.allclose(got, c_pairs, atol=1e-3)


def test_interleaved_rotary_in_bf16_rounds_the_tables_and_the_product() -> None:
    """rope_bf16: cos/sin stored bf16, the products and sums in bf16 (the record's tables)."""
    z = torch.randn(1, T, 2, D, generator=torch.Generator().manual_seed(1)).bfloat16()
    theta = torch.outer(torch.arange(T, dtype=torch.float32), Rotary(D).inv_freq.new_tensor(
        [*omegas(), *([0.0] * (D // 4))]))[None, :, None, :]  # fmt: skip
    cos, sin = theta.cos().bfloat16(), theta.sin().bfloat16()
    a, b = z[..., 0::2], z[..., 1::2]
    want = torch.stack((a * cos + b * sin, b * cos - a * sin), dim=-1).flatten(-2)
    assert torch.equal(Rotary(D, mode="interleaved_half", bf16=True)(z), want)


def test_yarn_rescales_only_the_rotating_pairs() -> None:
    rotary = Rotary(D, mode="interleaved_half", yarn_windows=[1, 4], window_block=4)
    z = torch.randn(1, 64, 1, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    base, later = rotary(z, torch.tensor(0)), rotary(z, torch.tensor(1))
    assert not torch.equal(base[..., : D // 2], later[..., : D // 2])
    assert torch.equal(later[..., D // 2 :], z[..., D // 2 :])


@pytest.mark.parametrize("rope", ["interleaved_half", "half_truncated"])
def test_the_key_offset_formula(rope: str) -> None:
    """record_2026_07_17's offset moves channels D/2 … D−1 (its interleaved rotary's static half),
    record_medium_2025_12_31's D/4 … D/2−1 and 3D/4 … D−1 (the half-truncated rotary's zero
    frequencies)."""
    k = torch.randn(2, 3, T, D, generator=torch.Generator().manual_seed(3))
    moved = torch.zeros(D, dtype=torch.bool)
    for a, b in static_spans(rope, D):
        moved[a:b] = True
    q = D // 4
    assert moved.nonzero().flatten().tolist() == (
        list(range(2 * q, D))
        if rope == "interleaved_half"
        else [*range(q, 2 * q), *range(3 * q, D)]
    )
    got = offset_keys(k, static_spans(rope, D))
    for t in range(T):
        assert torch.equal(got[:, :, t, ~moved], k[:, :, t, ~moved])
        source = max(t - 1, 0)  # k_0 keeps its own values
        assert torch.equal(got[:, :, t, moved], k[:, :, source, moved])
    # the moved channels are exactly those whose rotary frequency is 0
    freq = Rotary(D, mode=rope).inv_freq
    per_channel = freq.repeat_interleave(2) if rope == "interleaved_half" else freq.repeat(2)
    assert torch.equal(per_channel == 0, moved)


def test_the_key_offset_needs_static_channels() -> None:
    with pytest.raises(ValueError, match=r"key_offset shifts the key channels the rotary leaves"):
        AttentionConfig(key_offset=True, window="LS", rope="full").validate(D)


def keys_seen(cfg: ModelConfig, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The keys each layer hands to the attention kernel, for one forward from fixed weights."""
    seen: list[torch.Tensor] = []
    real = attention.attend

    def spy(q, k, v, mask, scale):
        seen.append(k.detach().clone())
        return real(q, k, v, mask, scale)

    monkeypatch.setattr(attention, "attend", spy)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, 50257, (1, 32), generator=torch.Generator().manual_seed(4))
    model(idx, window_tokens=torch.tensor(16.0))
    return seen


@pytest.mark.parametrize("rope", ["interleaved_half", "half_truncated"])
def test_only_the_long_window_layers_offset_their_keys(
    rope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = update(ModelConfig(n_layer=3, n_head=2, n_embd=32),
                  {"attention.window": "LSL", "attention.window_tokens": 32,
                   "attention.window_block": 8, "attention.rope": rope})  # fmt: skip
    spans = static_spans(rope, 16)
    plain = keys_seen(base, monkeypatch)
    shifted = keys_seen(update(base, {"attention.key_offset": True}), monkeypatch)
    assert torch.equal(shifted[0], offset_keys(plain[0], spans))  # layer 0: long
    assert torch.equal(shifted[1], plain[1])  # layer 1: short, untouched
    # W_o starts at zero, so layer 0's offset does not reach layer 2's input: its keys compare
    assert torch.equal(shifted[2], offset_keys(plain[2], spans))  # layer 2: long
    assert not torch.equal(shifted[2], plain[2])
    with pytest.raises(ValueError, match=r"model\.attention\.key_offset"):
        update(base, {"attention.key_offset": True, "attention.window": "SSS"}).validate()
