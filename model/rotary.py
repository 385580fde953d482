"""Rotary position embeddings (Su et al. 2021, RoFormer).

Each pair of channels (i, i + d/2) of a head is rotated by the angle position · base^(-2i/d),
so q·k depends only on the distance between the two positions.
"""

import torch
from torch import Tensor, nn


class Rotary(nn.Module):
    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        # A buffer, not a parameter: it follows .to(device) but is never trained or saved.
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """Rotate x of shape (B, T, n_head, head_dim); angles are recomputed (T × d/2, cheap)."""
        t = torch.arange(x.size(1), device=x.device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)[None, :, None, :]
        cos, sin = freqs.cos(), freqs.sin()
        x1, x2 = x.float().chunk(2, dim=-1)
        y = torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)
        return y.type_as(x)
