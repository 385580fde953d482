"""The residual stream around and between the layers (model.residual), each mechanism built
only when on:

    x <- a_ℓ·x + b_ℓ·x0                 x0 shortcut, before layer ℓ; (a, b) from (a₀, 0)
    x <- r_ℓ·x + Λ_ℓ0·x0 + Λ_ℓ1·x02     or the x0_lambdas form (record_medium_2025_12_31): r_ℓ
                                        packed, Λ its own tensor from 0, x02 = RMSNorm(E2[tokens])
    x <- x + w_i·out_(E−1−i)            U-net: decoder layer E+i adds encoder layer E−1−i's
                                        output, w from 1 (E = n_layer // 2)
    x <- x + σ(w_k)·out_from            gated skip k = [from, to] of model.residual.skips, at the
                                        input of layer `to`, w_k from −1.5
         + σ(w_k)·2σ(x0_t[:k]·g_kᵀ)·out_from  or per token (skip_per_token, record_2026_07_17),
                                        g_k from 0
    x <- x − λ·out_backout              backout, after the last layer, λ from 0.5
    x <- … + λ^x0_ℓ·x0                  after the attention sublayer (x0_after_attention,
                                        record_2026_07_17)
    x[:k] <- x[:k] + λ^bg_ℓ·b           then the bigram term (model/bigram.py, record_2026_07_17):
                                        before
                                        layer 0 into x (and x0), after the attention of ℓ ≥ 1
    x <- r^A_ℓ·x + p^A_ℓ·Attn_ℓ(u)      per-sublayer scales (record_2026_07_17, D.1 forward step 5):
    x <- r^M_ℓ·x + p^M_ℓ·MLP_ℓ(n)       learned fp32 (r, p) per layer and sublayer, r from √1.1
                                        and p from 1, cast to the stream's dtype before use

out_ℓ is the stream after layer ℓ. Without sublayer scales a sublayer adds its output:
x <- x + F(x). The skip and backout scalars live in the packed vector or as parameters of
their own (model/scalars.py).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig
from model.context import Context
from model.layers import linear
from model.part import Part
from model.plan import LayerSpec
from model.scalars import Scalars

ATTENTION, MLP = 0, 1  # the sublayer's column of the (n_layer, 2) scales


def x0_mix(x: Tensor, x0: Tensor, mix: Tensor) -> Tensor:
    """a·x + b·x0 with (a, b) = mix."""
    return mix[0] * x + mix[1] * x0


def add_sublayer(
    x: Tensor, out: Tensor, scales: tuple[Tensor, Tensor] | None, layer: int, sublayer: int
) -> Tensor:
    """x + out, or r·x + p·out with (r, p) the layer's sublayer scales in x's dtype."""
    if scales is None:
        return x + out
    r, p = scales[0][layer, sublayer], scales[1][layer, sublayer]
    return r.to(x.dtype) * x + p.to(x.dtype) * out


class SublayerScales(Part):
    """The part, built only with model.residual.sublayer_scales: `resid_lambdas` and
    `post_lambdas`, (n_layer, 2) fp32 each (the record's names), at r₀ and p₀ by `reset`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.init = cfg.residual.resid_init, cfg.residual.post_init
        for name in ("resid_lambdas", "post_lambdas"):
            p = nn.Parameter(torch.empty(cfg.n_layer, 2))
            p.role = "scalar"  # type: ignore[attr-defined]  # Adam's scalar group, not Muon's
            setattr(self, name, p)

    @torch.no_grad()
    def reset(self) -> None:
        self.resid_lambdas.fill_(self.init[0])
        self.post_lambdas.fill_(self.init[1])

    def pair(self) -> tuple[Tensor, Tensor]:
        """(r, p), as `add_sublayer` takes them."""
        return self.resid_lambdas, self.post_lambdas


class X0Injection(Part):
    """The part, built only with model.residual.x0_after_attention: `lambdas` (n_layer,)
    fp32, zero at `reset`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.lambdas = nn.Parameter(torch.zeros(cfg.n_layer))

    @torch.no_grad()
    def reset(self) -> None:
        self.lambdas.zero_()

    def after_attention(self, x: Tensor, ctx: Context, layer: int) -> Tensor:
        """Its point (model/points.py): x + λ^x0_ℓ·x0 after layer ℓ's attention, λ in x's
        dtype."""
        return x + self.lambdas[layer].to(x.dtype) * ctx.x0


class X0Lambdas(Part):
    """The part, built only with model.residual.x0_lambdas (record_medium_2025_12_31, #52):
    `lambdas` (n_layer, 1 or 2) fp32, Λ[ℓ, 0] the weight of x0 and Λ[ℓ, 1] of x02
    (model.embed.second_table), zero at `reset`, on Adam; r_ℓ is the packed vector's."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        columns = 2 if cfg.embed.second_table else 1
        self.lambdas = nn.Parameter(torch.zeros(cfg.n_layer, columns))
        self.lambdas.role = "scalar"  # type: ignore[attr-defined]  # Adam, not Muon

    @torch.no_grad()
    def reset(self) -> None:
        self.lambdas.zero_()

    def mix(self, x: Tensor, x0: Tensor, x02: Tensor | None, r: Tensor, layer: int) -> Tensor:
        """r_ℓ·x + Λ[ℓ, 0]·x0 (+ Λ[ℓ, 1]·x02), each fp32 0-d weight times a tensor in its
        dtype, summed left to right; layer 0 as (r₀ + Λ[0, 0])·x (+ Λ[0, 1]·x02), as the
        record computes it there (x is x0)."""
        lam = self.lambdas[layer]
        out = (r + lam[0]) * x if layer == 0 else r * x + lam[0] * x0
        return out if x02 is None else out + lam[1] * x02


def inject_bigram(x: Tensor, b: Tensor, coef: Tensor) -> Tensor:
    """x with coef·b added to its first k channels, b (B, T, k); `coef` (λ^bg_ℓ, or MUDD's
    per-token coefficient) broadcasts against b and enters in x's dtype. Out of place: the
    record adds in place, which autograd would refuse on a tensor it still needs."""
    term = coef.to(x.dtype) * b.to(x.dtype)
    return x + F.pad(term, (0, x.size(-1) - b.size(-1)))


class Skips(nn.Module):
    """Which earlier layer's output each layer's input adds (U-net, or the gated skips of
    model.residual.skips), and the backout after the last layer. Its parameters: the U-net's
    `weights` (from 1), and with model.residual.skip_per_token the gates' `token_gate` (an
    nn.Linear as the record's, bf16 in a bf16 model: row k gates skip k); the skips' logits
    and λ_back are the model's scalars."""

    def __init__(self, cfg: ModelConfig, plan: list[LayerSpec]) -> None:
        super().__init__()
        decoders = [i for i, s in enumerate(plan) if s.skip_from is not None]
        self.unet = {layer: j for j, layer in enumerate(decoders)}  # layer -> its weight
        self.weights = nn.Parameter(torch.ones(len(decoders))) if decoders else None
        r = cfg.residual
        self.gated = [(int(a), int(b)) for a, b in r.skips]  # skip k: (from, to)
        per_token = r.skip_per_token and self.gated
        self.token_gate = linear(cfg, cfg.gate_channels, len(self.gated)) if per_token else None
        self.plan = tuple(plan)
        self.backout = r.backout_layer if r.backout_layer >= 0 else None
        self.per_token = cfg.gate_channels if r.skip_per_token else 0  # k channels of x0

    @torch.no_grad()
    def reset(self) -> None:
        """The per-token gates at zero (2σ(0) = 1); the U-net's weights are made at 1."""
        if self.token_gate is not None:
            nn.init.zeros_(self.token_gate.weight)

    def into(
        self, scalars: Scalars, layer: int, x: Tensor, outputs: list[Tensor], x0: Tensor
    ) -> Tensor:
        """Layer `layer`'s input: x plus the skips that end there, in list order."""
        if layer in self.unet:
            source = self.plan[layer].skip_from
            x = x + self.weights[self.unet[layer]] * outputs[source]
        for k, (source, target) in enumerate(self.gated):
            if layer != target:
                continue
            gate = torch.sigmoid(scalars.skip(k))
            if self.token_gate is not None:  # row k alone: the record's 1-output linear of skip k
                g = self.token_gate.weight[k : k + 1].to(x0.dtype)
                gate = gate * 2 * torch.sigmoid(F.linear(x0[..., : self.per_token], g))
            x = x + gate * outputs[source]
        return x

    def out(self, scalars: Scalars, x: Tensor, outputs: list[Tensor]) -> Tensor:
        """The stream after the last layer: x less λ·(the backout layer's output)."""
        if self.backout is None:
            return x
        return x - scalars.backout() * outputs[self.backout]
