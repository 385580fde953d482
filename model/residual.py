"""The residual stream around and between the layers (model.residual), each mechanism built
only when on:

    x <- a_ℓ·x + b_ℓ·x0                 x0 shortcut, before layer ℓ; (a, b) from (a₀, 0)
    x <- x + w_i·out_(E−1−i)            U-net: decoder layer E+i adds encoder layer E−1−i's
                                        output, w from 1 (E = n_layer // 2)
    x <- x + σ(w)·out_from              the gated skip, at the input of layer skip_to, w from −1.5
         + σ(w)·2σ(x0_t[:k]·gᵀ)·out_from    or per token (record D, skip_per_token), g from 0
    x <- x − λ·out_backout              backout, after the last layer, λ from 0.5
    x <- … + λ^x0_ℓ·x0                  after the attention sublayer (record D, x0_after_attention)
    x[:k] <- x[:k] + λ^bg_ℓ·b           then the bigram term (record D, model/bigram.py): before
                                        layer 0 into x (and x0), after the attention of ℓ ≥ 1
    x <- r^A_ℓ·x + p^A_ℓ·Attn_ℓ(u)      per-sublayer scales (record D, D.1 forward step 5):
    x <- r^M_ℓ·x + p^M_ℓ·MLP_ℓ(n)       learned fp32 (r, p) per layer and sublayer, r from √1.1
                                        and p from 1, cast to the stream's dtype before use

out_ℓ is the stream after layer ℓ. Without sublayer scales a sublayer adds its output:
x <- x + F(x). The skip and backout scalars live in the packed vector or as parameters of
their own (model/scalars.py).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig
from model.layers import linear
from model.plan import LayerSpec
from model.scalars import scalar

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


def build_sublayer_scales(owner: nn.Module, cfg: ModelConfig) -> None:
    """`resid_lambdas` and `post_lambdas`, (n_layer, 2) fp32 each, on `owner` (the record's
    names); nothing when model.residual.sublayer_scales is off. Initialised by
    `reset_sublayer_scales`."""
    if not cfg.residual.sublayer_scales:
        return
    for name in ("resid_lambdas", "post_lambdas"):
        p = nn.Parameter(torch.empty(cfg.n_layer, 2))
        p.role = "scalar"  # type: ignore[attr-defined]  # Adam's scalar group, not Muon's
        setattr(owner, name, p)


@torch.no_grad()
def reset_sublayer_scales(owner: nn.Module, cfg: ModelConfig) -> None:
    if cfg.residual.sublayer_scales:
        owner.resid_lambdas.fill_(cfg.residual.resid_init)
        owner.post_lambdas.fill_(cfg.residual.post_init)


def build_x0_injection(owner: nn.Module, cfg: ModelConfig) -> None:
    """`x0_lambdas` (n_layer,) fp32 on `owner`, the record's name; nothing when
    model.residual.x0_after_attention is off. Zero at initialisation (`reset_x0_injection`)."""
    if cfg.residual.x0_after_attention:
        owner.x0_lambdas = nn.Parameter(torch.zeros(cfg.n_layer))


@torch.no_grad()
def reset_x0_injection(owner: nn.Module) -> None:
    if hasattr(owner, "x0_lambdas"):
        owner.x0_lambdas.zero_()


def inject_x0(x: Tensor, x0: Tensor, lambdas: Tensor | None, layer: int) -> Tensor:
    """x + λ^x0_ℓ·x0 with λ in x's dtype; x as it is without the injection."""
    return x if lambdas is None else x + lambdas[layer].to(x.dtype) * x0


def inject_bigram(x: Tensor, b: Tensor, coef: Tensor) -> Tensor:
    """x with coef·b added to its first k channels, b (B, T, k); `coef` (λ^bg_ℓ, or MUDD's
    per-token coefficient) broadcasts against b and enters in x's dtype. Out of place: the
    record adds in place, which autograd would refuse on a tensor it still needs."""
    term = coef.to(x.dtype) * b.to(x.dtype)
    return x + F.pad(term, (0, x.size(-1) - b.size(-1)))


def sublayer_scales(owner: nn.Module) -> tuple[Tensor, Tensor] | None:
    """(r, p) for the forward's context, or None when off."""
    if not hasattr(owner, "resid_lambdas"):
        return None
    return owner.resid_lambdas, owner.post_lambdas


@dataclass(frozen=True)
class Skips:
    """Which earlier layer's output each layer's input adds (U-net, or the one gated skip),
    and the backout after the last layer."""

    unet: dict[int, int]  # decoder layer -> its index into `skip_weights`
    plan: tuple[LayerSpec, ...]
    gated: tuple[int, int] | None  # (from, to)
    backout: int | None
    per_token: int = 0  # k, the channels of x0 the per-token gate reads; 0 = one weight

    @classmethod
    def build(cls, owner: nn.Module, cfg: ModelConfig, plan: list[LayerSpec]) -> "Skips":
        """The skips of `plan`, with the U-net weights (`skip_weights`, from 1) on `owner`."""
        decoders = [i for i, s in enumerate(plan) if s.skip_from is not None]
        if decoders:
            owner.skip_weights = nn.Parameter(torch.ones(len(decoders)))
        r = cfg.residual
        if r.skip_per_token:  # an nn.Linear as the record's (bf16 in a bf16 model)
            owner.skip_token_gate = linear(cfg, cfg.gate_channels, 1)
        return cls(
            {layer: j for j, layer in enumerate(decoders)},
            tuple(plan),
            (r.skip_from, r.skip_to) if r.skip_from >= 0 else None,
            r.backout_layer if r.backout_layer >= 0 else None,
            cfg.gate_channels if r.skip_per_token else 0,
        )

    def into(
        self, owner: nn.Module, layer: int, x: Tensor, outputs: list[Tensor], x0: Tensor
    ) -> Tensor:
        """Layer `layer`'s input: x plus the skips that end there."""
        if layer in self.unet:
            source = self.plan[layer].skip_from
            x = x + owner.skip_weights[self.unet[layer]] * outputs[source]
        if self.gated is not None and layer == self.gated[1]:
            gate = torch.sigmoid(scalar(owner, "skip"))
            if self.per_token:
                gate = gate * 2 * torch.sigmoid(owner.skip_token_gate(x0[..., : self.per_token]))
            x = x + gate * outputs[self.gated[0]]
        return x

    def out(self, owner: nn.Module, x: Tensor, outputs: list[Tensor]) -> Tensor:
        """The stream after the last layer: x less λ·(the backout layer's output)."""
        if self.backout is None:
            return x
        return x - scalar(owner, "backout") * outputs[self.backout]
