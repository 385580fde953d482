"""Rotary position embeddings (Su et al. 2021, RoFormer).

Each pair of channels (i, i + d/2) of a head is rotated by the angle position · ω_i, so q·k
depends only on the distance between the two positions. Two frequency sets:

- "full": ω_i = base^(−2i/d) for every pair (base 10,000);
- "half_truncated" (the 2025-01 record): d/4 frequencies from 1 down to 1/1024 on the first
  half of the pairs, ω_i = 1024^(−i/(d/4 − 1)), and 0 on the rest, which leaves those
  channels unrotated.
- "interleaved_half" (record_2026_07_17, D.1 Attn_ℓ step 3): the same frequencies, but pair j is the
  adjacent channels (2j, 2j+1): z_2j ← z_2j·cos θ + z_2j+1·sin θ, z_2j+1 ← z_2j+1·cos θ −
  z_2j·sin θ, θ = t·ω_j, for j < d/4; channels d/2 … d−1 (pairs with ω = 0) never rotate.

With `reciprocal` the "full" frequencies are computed as 1 / base^(2i/d), the records' order of
operations, instead of base^(−2i/d): the same numbers to one fp32 ulp (20 of 64 differ for
d = 128), kept apart so that a record run can match the record's rotary tables bit for bit.

Angles are computed in fp32. With `bf16` (the 2024-11 record) the cos/sin tables are rounded
to bf16 and the rotation runs in the input's dtype; otherwise it runs in fp32 and the result
is cast back. Positions are indices along the sequence (a packed sequence's, across documents),
or given per token and head (the paired-head layers' 2t and 2t+1, model/paired.py).

With `stage_freqs` (YaRN, model/yarn.py: one row of frequencies per stage) the forward takes the
stage as a 0-d tensor and rotates by that row, so a compiled model does not recompile when the
stage changes; without a stage it uses the base frequencies (stage 0).
"""

import torch
from torch import Tensor, nn

from model.yarn import yarn_table


class Rotary(nn.Module):
    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        mode: str = "full",
        bf16: bool = False,
        reciprocal: bool = False,
        yarn_windows: list[int] | None = None,
        window_block: int = 128,
        yarn_max_window: int = 0,
    ) -> None:
        super().__init__()
        if mode in ("half_truncated", "interleaved_half"):
            quarter = head_dim // 4
            inv_freq = (1 / 1024) ** torch.linspace(0, 1, steps=quarter, dtype=torch.float32)
            inv_freq = torch.cat([inv_freq, inv_freq.new_zeros(quarter)])
        else:
            exponent = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
            inv_freq = 1 / base**exponent if reciprocal else base ** (-exponent)
        self.bf16 = bf16
        self.interleaved = mode == "interleaved_half"
        # A buffer, not a parameter: it follows .to(device) but is never trained or saved.
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # YaRN: the frequencies of each stage of the long window (in blocks of window_block)
        table = None
        if yarn_windows:
            table = yarn_table(inv_freq, yarn_windows, window_block, 1.0, yarn_max_window).freqs
        self.register_buffer("stage_freqs", table, persistent=False)  # None: no YaRN

    def forward(
        self, x: Tensor, stage: Tensor | None = None, positions: Tensor | None = None
    ) -> Tensor:
        """Rotate x of shape (B, T, n_head, head_dim); angles are recomputed (T × d/2, cheap).
        `stage`: the YaRN stage (0-d integer tensor), None = the base frequencies.
        `positions`: each token's and head's position (T, n_head), fp32 (the paired-head
        layers', model/paired.py); None = 0 … T−1 for every head."""
        inv_freq = self.inv_freq
        if stage is not None and self.stage_freqs is not None:
            inv_freq = self.stage_freqs.index_select(0, stage.reshape(1))[0]  # no host sync
        if positions is not None:  # the same products t·ω as the table's rows
            freqs = (positions[..., None] * inv_freq)[None]
        else:
            t = torch.arange(x.size(1), device=x.device, dtype=torch.float32)
            freqs = torch.outer(t, inv_freq)[None, :, None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if self.bf16:
            cos, sin = cos.bfloat16().to(x.dtype), sin.bfloat16().to(x.dtype)
            return self._rotate(x, cos, sin)
        return self._rotate(x.to(torch.promote_types(x.dtype, torch.float32)), cos, sin).type_as(x)

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """(x1·cos + x2·sin, x2·cos − x1·sin) for each pair (x1, x2): channels (i, i + d/2), or
        adjacent channels (2j, 2j+1) when interleaved."""
        if self.interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1).flatten(-2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


def static_spans(mode: str, head_dim: int) -> tuple[tuple[int, int], ...]:
    """The channels of a head that `mode`'s rotary never rotates (their frequency is 0), as [a, b)
    spans in order: half_truncated D/4 … D/2−1 and 3D/4 … D−1 (record_medium_2025_12_31's key-offset
    channels 32–63 and 96–127 of 128), interleaved_half D/2 … D−1 (record_2026_07_17's 64–127); none
    for full."""
    quarter = head_dim // 4
    if mode == "half_truncated":
        return ((quarter, 2 * quarter), (3 * quarter, head_dim))
    if mode == "interleaved_half":
        return ((2 * quarter, head_dim),)
    return ()
