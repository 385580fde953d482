"""Learnable XSA (record_2026_07_17, D.1 Attn_ℓ step 7; #82): after attention, each head's output
loses a learned part of its component along the token's own value.

    v̂ = v / max(‖v‖, 10⁻⁴)                       per head and token (v after the value mixes)
    y_h <- y_h − tanh(α_ℓ,h)·⟨y_h, v̂_h⟩·v̂_h        before the output gate

α is the (n_layer, n_head) fp32 `xsa.alphas` (`XSA`), the record's tensor (rows of layers
without XSA are never read), zero at initialisation, so XSA starts off. tanh(α) enters in the
output's dtype. The part acts at the attention's `after_heads` point (model/points.py), in the
layers whose plan has XSA (model.attention.xsa); the attention itself knows nothing of it.
"""

import torch
from torch import Tensor, nn

from model.config import ModelConfig
from model.part import Part
from model.plan import LayerSpec

NORM_FLOOR = 1e-4


class XSA(Part):
    """The part, built only when some layer has XSA (model.attention.xsa): `alphas`
    (n_layer, n_head) fp32, zero at `reset`."""

    def __init__(self, cfg: ModelConfig, plan: list[LayerSpec]) -> None:
        super().__init__()
        self.alphas = nn.Parameter(torch.zeros(cfg.n_layer, cfg.n_head))
        self.alphas.role = "scalar"  # type: ignore[attr-defined]  # Adam, not Muon
        self.layers = frozenset(i for i, spec in enumerate(plan) if spec.xsa)

    def after_heads(self, y: Tensor, v: Tensor, layer: int) -> Tensor:
        """Its point (model/points.py): layer ℓ's heads' output y (B, H, T, D) with its own
        values v, XSA'd where ℓ has XSA, with its row of α."""
        return xsa(y, v, self.alphas[layer]) if layer in self.layers else y

    @torch.no_grad()
    def reset(self) -> None:
        self.alphas.zero_()


def xsa(y: Tensor, v: Tensor, alpha: Tensor) -> Tensor:
    """y − tanh(α)·⟨y, v̂⟩·v̂ for y, v (B, H, T, D) and α (H,) (module docstring)."""
    v_hat = v / v.norm(dim=-1, keepdim=True).clamp_min(NORM_FLOOR)
    gain = torch.tanh(alpha).to(y.dtype)[:, None, None]
    return y - gain * (y * v_hat).sum(-1, keepdim=True) * v_hat
