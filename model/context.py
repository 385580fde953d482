"""What every layer of one forward shares, computed once before the first layer."""

from torch import Tensor

from model.masks import Mask
from model.scalars import ScalarLayout


class Context:
    """What every layer of one forward shares: x0 (None unless a layer reads it), the
    value-embedding lookups, the masks by window; the packed scalars and their layout
    (model.numerics.packed_scalars), the YaRN stage and its attention scale (0-d tensors),
    the per-sublayer residual scales (model.residual.sublayer_scales), XSA's α
    (model.attention.xsa), the x0 injections' λ (model.residual.x0_after_attention), the MUDD
    networks' (W1, W2, b2) (model.residual.mudd), the value gates (model.embed.value_gate),
    the bigram term b (B, T, k) and its λ^bg (model.embed.bigram_rows, model/bigram.py), the
    micro-steps per update (the FP8 MLP's slots, model/mlp_fp8.py); block 0's raw values,
    once block 0 has run (the value residual)."""

    def __init__(
        self,
        x0: Tensor | None,
        value_embeds: dict[int, Tensor],
        masks: dict[str | None, Mask] | None,
        packed: Tensor | None = None,
        layout: ScalarLayout | None = None,
        yarn_stage: Tensor | None = None,
        attn_scale: Tensor | None = None,
        sublayer_scales: tuple[Tensor, Tensor] | None = None,
        xsa_alphas: Tensor | None = None,
        x0_lambdas: Tensor | None = None,
        mudd: tuple[Tensor, Tensor, Tensor] | None = None,
        value_gates: Tensor | None = None,
        bigram: Tensor | None = None,
        bigram_lambdas: Tensor | None = None,
        micro_steps: int = 1,
    ) -> None:
        self.x0, self.value_embeds, self.masks = x0, value_embeds, masks
        self.packed, self.layout = packed, layout
        self.yarn_stage, self.attn_scale = yarn_stage, attn_scale
        self.sublayer_scales = sublayer_scales
        self.xsa_alphas = xsa_alphas
        self.x0_lambdas = x0_lambdas
        self.mudd = mudd
        self.value_gates = value_gates
        self.bigram, self.bigram_lambdas = bigram, bigram_lambdas
        self.micro_steps = micro_steps
        self.v1: Tensor | None = None
