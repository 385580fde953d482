"""Learnable XSA (record D, D.1 Attn_ℓ step 7; #82): after attention, each head's output loses
a learned part of its component along the token's own value.

    v̂ = v / max(‖v‖, 10⁻⁴)                       per head and token (v after the value mixes)
    y_h <- y_h − tanh(α_ℓ,h)·⟨y_h, v̂_h⟩·v̂_h        before the output gate

α is the (n_layer, n_head) fp32 `xsa.alphas` (`XSA`), the record's tensor (rows of layers
without XSA are never read), zero at initialisation, so XSA starts off. tanh(α) enters in the
output's dtype.
"""

import torch
from torch import Tensor, nn

from model.config import ModelConfig

NORM_FLOOR = 1e-4


class XSA(nn.Module):
    """The part, built only when some layer has XSA (model.attention.xsa): `alphas`
    (n_layer, n_head) fp32, zero at `reset`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.alphas = nn.Parameter(torch.zeros(cfg.n_layer, cfg.n_head))
        self.alphas.role = "scalar"  # type: ignore[attr-defined]  # Adam, not Muon

    @torch.no_grad()
    def reset(self) -> None:
        self.alphas.zero_()


def xsa(y: Tensor, v: Tensor, alpha: Tensor) -> Tensor:
    """y − tanh(α)·⟨y, v̂⟩·v̂ for y, v (B, H, T, D) and α (H,) (module docstring)."""
    v_hat = v / v.norm(dim=-1, keepdim=True).clamp_min(NORM_FLOOR)
    gain = torch.tanh(alpha).to(y.dtype)[:, None, None]
    return y - gain * (y * v_hat).sum(-1, keepdim=True) * v_hat
