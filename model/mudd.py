"""MUDD dense connections (record_2026_07_17, #81 as rewritten in cfab12b7; docs/records.md D.1
"MUDD", forward steps 5–6; model.residual.mudd): the last layer's residual coefficients, its extra
values and its value-embedding gate, and a mix of earlier streams after it, all per token from two
small coefficient networks on the un-normalised stream y:

    MUDD_j(y) = 0.1·(GELU(y·W1_jᵀ)·W2_j[0:n]ᵀ + b2_j[0:n])     j = 0, 1; GELU exact (erf)

Sources: c₀ = x0 (the stream at the first layer's input), c₇ = output of layer
model.residual.attn_input_layer, c₃ = output of the one gated skip's source
(model.residual.skips), c₉ = the last layer's input, ve₀ = value table 0's lookup. The last
layer (H heads) is, for its input x:

    (m0 … m13) = MUDD₀(x);  c₉ = x
    v_mudd = m0·c₀ + m1·c₇ + m2·x                          from the input, before the next line
    x <- (1 + m5)·x + m3·c₀ + m4·c₇
    aux_h = g_h·ve_h + v_mudd_h,  g = m6 for heads < H/2, m7 for the rest
                                   (ve: this layer's value table; without one aux = v_mudd)
    a = Attn(RMSNorm(c₇); v <- v + aux)                   no value mix (nor its value_gate)
    x <- m8·x + m9·a + m10·c₀;  x[:, 0:k] += m11·b          b: the bigram term, where there is one
    x <- m12·x + m13·MLP(RMSNorm(x))

and after it, before the final norm:

    (n0 … n4) = MUDD₁(x);  x <- x + n0·c₀ + n1·c₇ + n2·c₉ + n3·ve₀ + n4·c₃

The layer's own resid/post/x0 lambdas are not read. Parameters (the model's `mudd`, `MUDD`):
`w1` (2, h, d), `w2` (2, 14, h), `b2` (2, 14), h = model.residual.mudd_hidden; both networks have
14 outputs (the record's one tensor per kind), the second reads only its first 5. Adam, not
Muon (role "scalar"); in the model's dtype (bf16 in a bf16 model, so the networks run in
bf16). Initialisation: W1_j Kaiming-uniform U(±1/√d) (torch's a = √5), drawn in fp32 for
j = 0 then 1; W2 zero; b2 zero except the values that make the block, with W2 = 0, the static
layer at its init: m6 = m7 = 2 (the value gate's 2σ at its maximum, the record's choice),
m8 = m12 = r, m9 = m13 = p (model.residual.resid_init, post_init), m11 = 0.05 (the record's
bigram λ), n1 = −0.5 (record_2025_11_29's backout λ). b2 holds them divided by 0.1, rounded to the
parameter's dtype: in bf16 √1.1/0.1 is stored as 10.5 (effective ≈ 1.047, not 1.0488).
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig
from model.context import Context
from model.layers import rms_norm
from model.part import Part
from model.plan import LayerSpec
from model.points import Points
from model.residual import inject_bigram
from model.rotary import Rotary

SCALE = 0.1  # the networks' output scale: b2 and W2 hold coefficients ×10
OUTPUTS = 14  # per network: the last layer's 14 (the post-loop network reads 5 of them)
POST_OUTPUTS = 5
VE_GATE_INIT = 2.0  # m6, m7
BIGRAM_INIT = 0.05  # m11: the record's bigram λ init
BACKOUT_INIT = -0.5  # n1: record_2025_11_29's backout, −λ_back


class MUDD(Part):
    """The part, built only with model.residual.mudd: `w1` (2, h, d), `w2` (2, 14, h), `b2`
    (2, 14) in the model's dtype. Drawn by `reset`."""

    def __init__(self, cfg: ModelConfig, plan: list[LayerSpec]) -> None:
        super().__init__()
        if not plan[-1].attention:
            raise ValueError(
                "model.residual.mudd makes the last layer the MUDD block, which attends: the "
                "last layer of model.attention.layers must have attention"
            )
        if all(s.value_embed != 0 for s in plan):
            raise ValueError(
                "model.residual.mudd adds ve₀ after the last layer: model.embed.value_embeds, "
                f"resampled to model.n_layer ({cfg.n_layer}), must keep table 0"
            )
        self.cfg = cfg
        dtype = torch.bfloat16 if cfg.numerics.dtype == "bf16" else torch.float32
        h, d = cfg.residual.mudd_hidden, cfg.n_embd
        for name, shape in (("w1", (2, h, d)), ("w2", (2, OUTPUTS, h)), ("b2", (2, OUTPUTS))):
            p = nn.Parameter(torch.empty(shape, dtype=dtype))
            p.role = "scalar"  # type: ignore[attr-defined]  # Adam: never orthogonalised by Muon
            setattr(self, name, p)

    @property
    def net(self) -> tuple[Tensor, Tensor, Tensor]:
        """(W1, W2, b2), as `coefficients` takes them."""
        return self.w1, self.w2, self.b2

    @torch.no_grad()
    def reset(self) -> None:
        drawn = torch.empty(self.w1.shape, dtype=torch.float32, device=self.w1.device)
        for j in range(drawn.size(0)):  # one Kaiming draw per network: bound 1/√d
            nn.init.kaiming_uniform_(drawn[j], a=math.sqrt(5))
        self.w1.copy_(drawn)
        self.w2.zero_()
        self.b2.copy_(bias_table(self.cfg))


def bias_table(cfg: ModelConfig) -> Tensor:
    """b2's initial values (2, 14) in fp32, as the record builds them before its bf16 cast."""
    res = cfg.residual
    b = torch.zeros(2, OUTPUTS, dtype=torch.float32)
    b[0, 6] = b[0, 7] = VE_GATE_INIT / SCALE
    b[0, 8] = b[0, 12] = res.resid_init / SCALE
    b[0, 9] = b[0, 13] = res.post_init / SCALE
    b[0, 11] = BIGRAM_INIT / SCALE
    b[1, 1] = BACKOUT_INIT / SCALE
    return b


def coefficients(y: Tensor, net: tuple[Tensor, Tensor, Tensor], j: int, n: int) -> list[Tensor]:
    """MUDD_j(y): n per-token coefficients (B, T, 1) each, in y's dtype."""
    w1, w2, b2 = (p[j].to(y.dtype) for p in net)
    hidden = F.gelu(F.linear(y, w1))  # exact (erf) GELU
    return ((F.linear(hidden, w2[:n]) + b2[:n]) * SCALE).split(1, dim=-1)


def mudd_layer(
    block: nn.Module, x: Tensor, rotary: Rotary, ctx: Context, points: Points, c7: Tensor
) -> Tensor:
    """The last layer's output (module docstring) for its input x; `block` a `Block`, the MUDD
    part at `points.after_layers`."""
    c0, m = ctx.x0, coefficients(x, points.after_layers.net, 0, OUTPUTS)
    B, T, d = x.shape
    H = block.attn.n_head
    v_mudd = (m[0] * c0 + m[1] * c7 + m[2] * x).view(B, T, H, d // H)
    x = (1 + m[5]) * x + m[3] * c0 + m[4] * c7
    aux = v_mudd
    if block.value_table is not None:
        ve = ctx.value_embeds[block.value_table].to(x.dtype).view_as(v_mudd)
        gate = torch.cat([m[6], m[7]], -1).repeat_interleave(H // 2, -1)[..., None]
        aux = gate * ve + v_mudd
    a = block.attn(rms_norm(c7), rotary, ctx, points, aux)
    x = m[8] * x + m[9] * a + m[10] * c0
    if ctx.bigram_term is not None:  # the bigram term b (B, T, k), where there is one
        x = inject_bigram(x, ctx.bigram_term, m[11])
    if block.mlp is not None:
        x = m[12] * x + m[13] * block.mlp(rms_norm(x), ctx.micro_steps)
    return x


def mudd_out(
    x: Tensor, net: tuple[Tensor, Tensor, Tensor], c0: Tensor, c7: Tensor, c9: Tensor,
    ve0: Tensor, c3: Tensor,
) -> Tensor:  # fmt: skip
    """The stream after the last layer: x plus MUDD₁(x)'s mix of the five sources."""
    n = coefficients(x, net, 1, POST_OUTPUTS)
    return x + n[0] * c0 + n[1] * c7 + n[2] * c9 + n[3] * ve0.to(x.dtype) + n[4] * c3
