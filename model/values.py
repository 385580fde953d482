"""The attention values' mixes, applied to v before rotary and attention (per head):

    v <- (1−λ)·v + λ·v₁       value residual: v₁ = block 0's raw v, λ fixed or learned
                               (model.attention.value_residual; the 2024-11 record)
    v <- α·v + β·ve            value embeddings: ve = VE_t[tokens] in layers with a table,
                               v <- α·v in the other attention layers, (α, β) from (0.5, 0.5)
                               (model.embed.value_embeds; the 2025-01 and 2025-11 records)
    v_h <- v_h + 2σ([u[:k/2], ve[:k/2]]·G[h]ᵀ)·ve_h
                               or gated per head (model.embed.value_gate; record_2026_07_17,
                               #55, #70;
                               record_medium_2025_12_31's gate reads u[:k] alone, #55's form:
                               model.embed.value_gate_input=stream):
                               u the attention's input, ve the whole lookup, G (heads × k)
                               zero so the gate starts at 1; no α, β, and layers without a
                               table keep v. The G of the layers with a table are the rows of
                               one (layers with a table, heads, k) tensor `value_gates.weight`, in
                               layer order, as record_2026_07_17's ve_gate_bank (the MUDD
                               layer's row
                               is never read: its gate is MUDD's)

Their parameters (but the gates) belong to the attention module that reads them (`value_lambda`,
`value_mix`): those names are what the optimizer's groups and the checkpoints know.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig
from model.context import Context
from model.layers import declare
from model.part import Part
from model.plan import LayerSpec
from model.points import Points


@dataclass(frozen=True)
class ValueMix:
    """One attention layer's value mixes (only those that are on)."""

    residual: str  # "off" | "fixed" | "learned"
    fixed_lambda: float
    embeds: bool  # the value-embedding mix (α, β) is on
    table: int | None  # this layer's value-embedding table
    layer: int  # its place in the packed scalars
    gate: int = 0  # the per-head value gate's input width k; 0 = (α, β)
    gate_reads_value: bool = True  # its input [u[:k/2], ve[:k/2]] (record_2026_07_17), else u[:k]
    slot: int | None = None  # its gate's row of the model's `value_gates.weight`

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
        gated = embeds and cfg.embed.value_gate
        if embeds and not gated and not cfg.numerics.packed_scalars:
            owner.value_mix = nn.Parameter(torch.tensor([0.5, 0.5]))  # (α, β)
        width = cfg.gate_channels if gated else 0
        reads_value = cfg.embed.value_gate_input == "stream_and_value"
        return cls(
            att.value_residual, att.value_residual_lambda, embeds, spec.value_embed, layer, width,
            reads_value, spec.value_slot,
        )  # fmt: skip

    def __call__(
        self, owner: nn.Module, v: Tensor, ctx: Context, points: Points, u: Tensor
    ) -> Tensor:
        """v (B, T, H, D) after the mixes; `points`: the model's parts by where they act (the
        value gates, the scalars); `u`: the attention's input (B, T, d)."""
        if self.residual != "off":
            if ctx.v1 is None:  # block 0: remember its raw values (the mix is then an identity)
                ctx.v1 = v
            lam = owner.value_lambda if self.residual == "learned" else self.fixed_lambda
            v = (1 - lam) * v + lam * ctx.v1
        if self.gate:
            if self.table is not None:
                ve = ctx.value_embeds[self.table]
                g = points.value_gates.weight[self.slot].to(u.dtype)
                if self.gate_reads_value:
                    half = self.gate // 2
                    read = torch.cat([u[..., :half], ve[..., :half]], -1)
                else:
                    read = u[..., : self.gate]
                gate = 2 * torch.sigmoid(F.linear(read, g))
                v = v + gate[..., None] * ve.view_as(v)
        elif self.embeds:
            mix = points.scalars.value_mix(self.layer)
            mix = owner.value_mix if mix is None else mix
            alpha, beta = mix[0], mix[1]
            if self.table is None:
                v = alpha * v
            else:
                v = alpha * v + beta * ctx.value_embeds[self.table].view_as(v)
        return v


class ValueGates(Part):
    """The part, built only with model.embed.value_gate and some value table: `weight` (layers
    with a table, n_head, k), an Adam parameter (record_2026_07_17's gates are Adam's;
    record_medium_2025_12_31 routes it to NorMuon, optim.roles, each layer's (n_head, k) slice a
    matrix), zero at `reset`."""

    def __init__(self, cfg: ModelConfig, plan: list[LayerSpec]) -> None:
        super().__init__()
        rows = sum(s.value_embed is not None for s in plan)
        self.weight = nn.Parameter(torch.zeros(rows, cfg.n_head, cfg.gate_channels))
        # Adam, not Muon; where optim.roles gives it to Muon, a stack of one matrix a layer
        declare(self.weight, "scalar", stack_of="layers with a value table")

    @torch.no_grad()
    def cast_bf16(self) -> None:
        """bf16 as the record's gates."""
        self.weight.data = self.weight.data.to(torch.bfloat16)

    def reset(self) -> None:
        """2σ(0) = 1: each value table starts added whole."""
        self.weight.zero_()

    @staticmethod
    def wanted(cfg: ModelConfig, plan: list[LayerSpec]) -> bool:
        return cfg.embed.value_gate and any(s.value_embed is not None for s in plan)
