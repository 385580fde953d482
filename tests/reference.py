"""Float64 pieces of the base GPT written from the formulas, for the tests' reference forwards
(no project module): RMSNorm without a gain, and rotary on pairs (i, i + D/2)."""

import torch


def norm(z: torch.Tensor) -> torch.Tensor:
    return z / torch.sqrt(z.square().mean(-1, keepdim=True) + torch.finfo(z.dtype).eps)


def rotate(z: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary: z¹ ← z¹cos + z²sin, z² ← −z¹sin + z²cos, θ_j = base^(−j/(D/2)) (fp32 table)."""
    D = z.size(-1)
    theta = base ** (-torch.arange(D // 2).float() / (D // 2))
    angle = torch.arange(z.size(1), dtype=torch.float64)[:, None] * theta.double()
    cos, sin = angle.cos()[None, :, None], angle.sin()[None, :, None]
    z1, z2 = z[..., : D // 2], z[..., D // 2 :]
    return torch.cat([z1 * cos + z2 * sin, -z1 * sin + z2 * cos], -1)
