"""One layer of the GPT: its x0 mix, its attention sublayer, its MLP sublayer.

    x <- a·x + b·x0                      x0 shortcut (model.residual.x0_shortcut), or
                                         r·x + Λ₀·x0 + Λ₁·x02 (model.residual.x0_lambdas)
    x <- x + Attn(RMSNorm(x))            unless the layer has no attention (RMSNorm of an
                                         earlier output: model.residual.attn_input_layer)
    x <- x + λ^x0·x0                     model.residual.x0_after_attention
    x[:k] <- x[:k] + λ^bg·b              the bigram term, layers ≥ 1 (model/bigram.py)
    x <- x + MLP(RMSNorm(x))             unless the layer has no MLP

each sublayer's add scaled by its (r, p) with model.residual.sublayer_scales
(model/residual.py). A layer with neither sublayer is never called. With
model.residual.mudd the last layer is the MUDD block instead (model/mudd.py).
"""

import torch
from torch import Tensor, nn

from model.attention import build_attention
from model.config import ModelConfig
from model.context import Context
from model.layers import MLP, rms_norm
from model.moe import MoE
from model.mudd import mudd_layer
from model.plan import LayerSpec
from model.points import Points
from model.residual import ATTENTION, add_sublayer, x0_mix
from model.residual import MLP as MLP_COLUMN
from model.rotary import Rotary


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: LayerSpec, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.attn = build_attention(cfg, spec, layer) if spec.attention else None
        self.mlp = (MoE(cfg) if cfg.mlp.experts else MLP(cfg)) if spec.mlp else None
        self.mudd, self.value_table = spec.mudd, spec.value_embed  # model.residual.mudd
        res = cfg.residual
        self.mixes_x0 = res.x0_shortcut and not spec.empty
        if self.mixes_x0 and not cfg.numerics.packed_scalars:
            self.x0_mix = nn.Parameter(torch.tensor([res.x0_mix_a_init, 0.0]))  # (a, b)

    def forward(
        self, x: Tensor, rotary: Rotary, ctx: Context, points: Points,
        attn_input: Tensor | None = None,
    ) -> Tensor:  # fmt: skip
        """`points`: the model's parts by where they act (model/points.py); `attn_input`: the
        stream the attention reads instead of x (RMSNorm'd here; the 2026-07 record's c₇ for
        the layers after 7), None = x."""
        if self.mudd:  # the whole layer is MUDD's (model/mudd.py)
            return mudd_layer(self, x, rotary, ctx, points, attn_input)
        if self.mixes_x0 and points.x0_mix is not None:  # the medium record's form
            r = points.scalars.resid(self.layer)
            x = points.x0_mix.mix(x, ctx.x0, ctx.x02, r, self.layer)
        elif self.mixes_x0:
            mix = points.scalars.x0_mix(self.layer)
            x = x0_mix(x, ctx.x0, self.x0_mix if mix is None else mix)
        scales = None if points.sublayer_scales is None else points.sublayer_scales.pair()
        if self.attn is not None:
            u = rms_norm(x if attn_input is None else attn_input)
            y = self.attn(u, rotary, ctx, points)
            x = add_sublayer(x, y, scales, self.layer, ATTENTION)
            for part in points.after_attention:
                x = part.after_attention(x, ctx, self.layer)
        if self.mlp is not None:
            out = self.mlp(rms_norm(x), ctx.micro_steps)
            x = add_sublayer(x, out, scales, self.layer, MLP_COLUMN)
        return x
