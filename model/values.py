"""The attention values' mixes, applied to v before rotary and attention (per head):

    v <- (1−λ)·v + λ·v₁       value residual: v₁ = block 0's raw v, λ fixed or learned
                               (model.attention.value_residual; the 2024-11 record)
    v <- α·v + β·ve            value embeddings: ve = VE_t[tokens] in layers with a table,
                               v <- α·v in the other attention layers, (α, β) from (0.5, 0.5)
                               (model.embed.value_embeds; the 2025-01 and 2025-11 records)

Their parameters belong to the attention module that reads them (`value_lambda`,
`value_mix`): those names are what the optimizer's groups and the checkpoints know.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from model.config import ModelConfig
from model.context import Context
from model.plan import LayerSpec


@dataclass(frozen=True)
class ValueMix:
    """One attention layer's value mixes (only those that are on)."""

    residual: str  # "off" | "fixed" | "learned"
    fixed_lambda: float
    embeds: bool  # the value-embedding mix (α, β) is on
    table: int | None  # this layer's value-embedding table
    layer: int  # its place in the packed scalars

    @classmethod
    def build(
        cls, owner: nn.Module, cfg: ModelConfig, spec: LayerSpec, layer: int
    ) -> "ValueMix | None":
        """The layer's mixes, their parameters registered on `owner`; None when both are off."""
        att, embeds = cfg.attention, bool(cfg.embed.value_embeds)
        if att.value_residual == "off" and not embeds:
            return None
        if att.value_residual == "learned":
            owner.value_lambda = nn.Parameter(torch.tensor(att.value_residual_lambda))
        if embeds and not cfg.numerics.packed_scalars:
            owner.value_mix = nn.Parameter(torch.tensor([0.5, 0.5]))  # (α, β)
        return cls(att.value_residual, att.value_residual_lambda, embeds, spec.value_embed, layer)

    def __call__(self, owner: nn.Module, v: Tensor, ctx: Context) -> Tensor:
        if self.residual != "off":
            if ctx.v1 is None:  # block 0: remember its raw values (the mix is then an identity)
                ctx.v1 = v
            lam = owner.value_lambda if self.residual == "learned" else self.fixed_lambda
            v = (1 - lam) * v + lam * ctx.v1
        if self.embeds:
            packed = ctx.layout is not None
            mix = ctx.packed[ctx.layout.value_mix(self.layer)] if packed else owner.value_mix
            alpha, beta = mix[0], mix[1]
            if self.table is None:
                v = alpha * v
            else:
                v = alpha * v + beta * ctx.value_embeds[self.table].view_as(v)
        return v
