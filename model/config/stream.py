"""`model.embed`, `model.residual` and `model.mlp`: what enters the residual stream, how the
layers add to it, and the MLP sublayer."""

import math
from dataclasses import dataclass, field

from model.config.moved import refuse_reshaped

MLP_FP8 = ("off", "up", "up_down")
VALUE_GATE_INPUTS = ("stream_and_value", "stream")


@dataclass
class EmbedConfig:
    """The `model.embed` group: the token and value embedding tables and the smear."""

    rows: int = 0
    """Rows of the token and value embedding tables; 0 = model.vocab_size."""
    value_embeds: str = ""
    """Per-layer pattern: a digit = the value-embedding table added to that layer's values
    (v ← α·v + β·ve), "." = none; "" = no tables. The 2025-01 record: "012......012"."""
    value_gate: bool = False
    """Each layer with a table adds its lookup gated per head, v_h ← v_h + 2σ([u[:k/2],
    ve[:k/2]]·G[h]ᵀ)·ve_h, G zero (record_2026_07_17); without it v ← α·v + β·ve
    (model/values.py)."""
    value_std: float = 1.0
    """The value tables' initial std: N(0, value_std²) (record_2026_07_17: 0.01); 0 = zero tables
    (record_medium_2025_12_31)."""
    tied_init: bool = False
    """The token table starts as the LM head's transpose, E = W_headᵀ (record_2026_07_17, #51; the
    optimizer keeps them tied until it splits them); needs model.embed.rows = 0."""
    smear: bool = False
    """e'_t = e_t + λ·σ(e_t[:k]·wᵀ)·e_(t−1) on the token embeddings (w 1 × k zero, λ from 0,
    k = model.gate_channels)."""
    value_gate_input: str = field(
        default="stream_and_value", metadata={"choices": VALUE_GATE_INPUTS}
    )
    """What the per-head value gate reads (model.embed.value_gate): stream_and_value [u[:k/2],
    ve[:k/2]] (record_2026_07_17, #70) | stream u[:k] (record_medium_2025_12_31, #55), u the
    attention's input, k = model.gate_channels."""
    second_table: bool = False
    """A second token table E2 (`embed2`, N(0, 1); record_medium_2025_12_31, M10): x02 =
    RMSNorm(E2[tokens]) joins the x0 shortcut before every layer with a weight of its own, Λ[ℓ, 1]
    (model.residual.x0_lambdas)."""

    def validate(self, vocab_size: int) -> None:
        if self.rows and not 50257 <= self.rows <= vocab_size:
            raise ValueError(
                f"model.embed.rows ({self.rows}) must be 0 or between the GPT-2 vocabulary "
                f"(50257) and model.vocab_size ({vocab_size})"
            )
        if self.value_gate and not self.value_embeds:
            raise ValueError(
                "model.embed.value_gate gates the value tables: set model.embed.value_embeds"
            )
        if self.tied_init and self.rows:
            raise ValueError(
                "model.embed.tied_init copies the head (model.vocab_size rows) into the token "
                f"table: model.embed.rows must be 0, got {self.rows}"
            )
        if not self.value_std >= 0:
            raise ValueError(f"model.embed.value_std must be >= 0, got {self.value_std}")
        if self.value_gate_input not in VALUE_GATE_INPUTS:
            raise ValueError(
                f"model.embed.value_gate_input must be one of {' | '.join(VALUE_GATE_INPUTS)}, "
                f"got {self.value_gate_input!r}"
            )
        bad = set(self.value_embeds) - set("0123456789.")
        if bad:
            raise ValueError(
                f"model.embed.value_embeds={self.value_embeds!r}: each layer is a table's digit "
                f"or '.', got {sorted(bad)}"
            )


@refuse_reshaped
@dataclass
class ResidualConfig:
    """The `model.residual` group: what the stream carries between and around the layers."""

    x0_shortcut: bool = False
    """x ← a·x + b·x0 before each block, (a, b) learned from (x0_mix_a_init, 0)."""
    x0_mix_a_init: float = 1.0
    """The initial a of the x0 shortcut's (a, b); the 2025-11 record 1.1, record_medium_2025_12_31's
    r 1.05."""
    x0_lambdas: bool = False
    """record_medium_2025_12_31's x0 shortcut (#52): x ← r_ℓ·x + Λ[ℓ, 0]·x0 (+ Λ[ℓ, 1]·x02 with
    model.embed.second_table) before each layer, with r_ℓ in the packed vector
    (model.numerics.scalars_layout=residual_weight_lambdas, from x0_mix_a_init) and Λ the
    (n_layer, 1 or 2) fp32 `x0_lambdas.lambdas` from 0, on Adam; layer 0 computes
    (r₀ + Λ[0, 0])·x (+ Λ[0, 1]·x02), the record's form where x = x0. Needs x0_shortcut."""
    unet: bool = False
    """Decoder layers add encoder outputs (last in, first out), weights from 1."""
    skips: list[list[int]] = field(default_factory=list)
    """Gated skips, each a pair [from, to]: the output of layer `from` is added to the input of
    layer `to` with weight σ(w_k), w_k from −1.5 (skip k, in list order where several end at one
    layer); [] = none. The 2025-11 record: [[4, 7]]; record_2026_07_17: [[3, 6]];
    record_medium_2025_12_31: [[6, 9], [4, 10], [2, 11]] (model/residual.py)."""
    skip_per_token: bool = False
    """Each gated skip's weight per token (record_2026_07_17, #55): σ(w_k)·2·σ(x0_t[:k]·g_kᵀ), g_k
    row k of the (skips × k) `skips.token_gate` (an nn.Linear, zero, so each starts at σ(w_k)); k =
    model.gate_channels."""
    attn_input_layer: int = -1
    """The attention of every later layer reads RMSNorm of this layer's output instead of
    its own stream (record_2026_07_17, #77: 7, so layers 8–10 attend from c₇); −1 = off."""
    backout_layer: int = -1
    """Before the final norm x <- x − λ·(output of this layer), λ from 0.5; −1 = off. The
    2025-11 record: 8."""
    x0_after_attention: bool = False
    """x ← … + λ^x0_ℓ·x0 right after each attention sublayer (record_2026_07_17, D.1 step 5),
    λ^x0 the model's (n_layer,) fp32 `x0_injection.lambdas` from 0, cast to the stream's dtype;
    layers without attention add nothing."""
    sublayer_scales: bool = False
    """Per-sublayer residual scales (record_2026_07_17): x ← r^A_ℓ·x + p^A_ℓ·Attn_ℓ(u), then
    x ← r^M_ℓ·x + p^M_ℓ·MLP_ℓ(n), with learned fp32 (r, p) per layer and sublayer
    (model/residual.py)."""
    resid_init: float = math.sqrt(1.1)
    """The initial r of every sublayer (record_2026_07_17: √1.1, so the stream grows by 1.1 per
    layer)."""
    post_init: float = 1.0
    """The initial p of every sublayer."""
    mudd: bool = False
    """MUDD dense connections (record_2026_07_17, #81; model/mudd.py): the last layer's residual
    coefficients, values and value-embedding gate come per token from a coefficient network
    on its input, and a second network mixes c₀ = x0, c₇ = output of attn_input_layer,
    c₉ = the last layer's input, ve₀ = table 0's lookup and c₃ = output of the one skip's
    source into the stream after it (n₁ on c₇ is the backout). Needs attn_input_layer, one
    skip and table 0 in model.embed.value_embeds; excludes backout_layer. Parameters `mudd.w1`
    (2, mudd_hidden, d), `mudd.w2` (2, 14, mudd_hidden), `mudd.b2` (2, 14): 14 outputs per
    network, of which the last layer reads 14 and the one after it 5."""
    mudd_hidden: int = 64
    """The MUDD coefficient networks' hidden width (record_2026_07_17: 64)."""

    def validate(self, n_layer: int) -> None:
        for key in ("backout_layer", "attn_input_layer"):
            if not -1 <= getattr(self, key) < n_layer:
                raise ValueError(
                    f"model.residual.{key} must be −1 (off) or a layer index below "
                    f"model.n_layer ({n_layer}), got {getattr(self, key)}"
                )
        for k, pair in enumerate(self.skips):
            pair = list(pair)
            whole = all(isinstance(i, int) and not isinstance(i, bool) for i in pair)
            if len(pair) != 2 or not whole or not 0 <= pair[0] < pair[1] < n_layer:
                raise ValueError(
                    f"model.residual.skips[{k}] must be a pair [from, to] of layer indices, "
                    f"from an earlier layer, below model.n_layer ({n_layer}), got {pair}"
                )
        if self.skip_per_token and not self.skips:
            raise ValueError(
                "model.residual.skip_per_token gates the skips of model.residual.skips: set them"
            )
        if self.x0_lambdas and not self.x0_shortcut:
            raise ValueError(
                "model.residual.x0_lambdas holds the x0 shortcut's weights: set "
                "model.residual.x0_shortcut=true"
            )
        if self.skips and self.unet:
            raise ValueError(
                "model.residual.skips and model.residual.unet: one kind of skip at a time"
            )
        if self.mudd_hidden <= 0:
            raise ValueError(f"model.residual.mudd_hidden must be positive, got {self.mudd_hidden}")
        if self.mudd:
            self._validate_mudd(n_layer)

    def _validate_mudd(self, n_layer: int) -> None:
        if not 0 <= self.attn_input_layer < n_layer - 1 or len(self.skips) != 1:
            raise ValueError(
                "model.residual.mudd reads c₇ = the output of model.residual.attn_input_layer "
                f"(below the last layer, {n_layer - 1}) and c₃ = the output of the one gated "
                f"skip's source (model.residual.skips=[[from, to]]): set both (got "
                f"{self.attn_input_layer}, {list(self.skips)})"
            )
        if self.backout_layer >= 0:
            raise ValueError(
                "model.residual.mudd replaces the backout (its post-loop coefficient on c₇): "
                "set model.residual.backout_layer=-1"
            )
        if self.x0_shortcut:
            raise ValueError(
                "model.residual.mudd computes the last layer's whole residual, which has no "
                "place for model.residual.x0_shortcut's mix: turn one off"
            )


@dataclass
class MlpConfig:
    """The `model.mlp` group."""

    layers: str = ""
    """Per-layer pattern: "M" MLP, "." none; "" = an MLP everywhere. A layer with neither
    attention nor MLP is skipped whole (no x0 mix). The 2025-11 record: ".MMMMMMMMMMM"."""
    fc_in_out: bool = False
    """Store C_fc as (in, out) = (d, 4d), used as u·C_fc (C_proj stays (out, in))."""
    proj_in_out: bool = False
    """Store C_proj as (in, out) = (4d, d), used as h·C_proj (record_2026_07_17, #48: both MLP
    matrices 3,072 × 768); the stored shape decides NorMuon's axis."""
    fp8: str = field(default="off", metadata={"choices": MLP_FP8})
    """The MLP's projections as FP8 GEMMs in training forwards, backward in bf16 (record_2026_07_17,
    model/mlp_fp8.py): up (the up projection, current scales: #84) | up_down (and the down
    projection, delayed scales: #89) | off; needs model.numerics.dtype=bf16."""
    fp8_kernel: str = field(default="torch", metadata={"choices": ("torch", "triton")})
    """mlp.fp8=up_down's up projection: torch (the FP8 GEMM, then ReLU², the amax and post's
    e4m3 cast as passes of their own) | triton (one kernel writes pre, post, post₈ and the
    tile maxima from the FP8 GEMM's tiles: model/triton_mlp.py; CUDA, or a CPU under
    TRITON_INTERPRET=1)."""
    fp8_act_headroom: float = 1.80
    """The down projection's activation divisor: this × the layer's max ReLU² output of the
    previous training forward / 448 (mlp.fp8=up_down)."""
    fp8_weight_headroom: float = 1.12
    """The down projection's weight divisor: this × max|C_proj| at the previous quantisation /
    448, after the bootstrap (mlp.fp8=up_down)."""
    fp8_bootstrap: int = 16
    """B: the weight quantisations after optimizer updates 0 … B−1 (training steps 0 … B) use
    bf16(max|C_proj|/448) of the current weights, without headroom (mlp.fp8=up_down)."""
    experts: int = 0
    """E ≥ 2: each MLP a mixture of E ReLU² experts (model/moe.py), each token sent to the
    top_k its router scores highest; 0 = the dense MLP (builds no router or expert)."""
    top_k: int = 2
    """The experts each token goes to (1 … experts), their outputs weighted by the router's
    probabilities renormalised over those k (model.mlp.experts)."""
    expert_hidden: int = 0
    """Each expert's hidden width; 0 = 4·n_embd / top_k, so that a token's active MLP
    parameters equal the dense MLP's (model.mlp.experts)."""
    balance: float = 0.01
    """The load-balancing term's weight α: training adds the gradient of α·E·Σₑ fₑ·Pₑ per
    layer (fₑ the share of routed slots, Pₑ the mean router probability of expert e); the
    loss the run reports is the cross-entropy alone (model.mlp.experts)."""

    def validate(self) -> None:
        if self.fp8 not in MLP_FP8:
            raise ValueError(
                f"model.mlp.fp8 must be one of {' | '.join(MLP_FP8)}, got {self.fp8!r}"
            )
        if self.fp8_kernel != "torch" and self.fp8 != "up_down":
            raise ValueError(
                f"model.mlp.fp8_kernel={self.fp8_kernel} fuses the up projection with post's FP8 "
                f"cast for the down projection: it needs model.mlp.fp8=up_down, not {self.fp8}"
            )
        for key in ("fp8_act_headroom", "fp8_weight_headroom"):
            if not getattr(self, key) > 0:
                raise ValueError(f"model.mlp.{key} must be positive, got {getattr(self, key)}")
        if self.fp8_bootstrap < 0:
            raise ValueError(
                f"model.mlp.fp8_bootstrap must be >= 0 (steps), got {self.fp8_bootstrap}"
            )
        self._validate_experts()
        bad = set(self.layers) - set("M.")
        if bad:
            raise ValueError(
                f"model.mlp.layers={self.layers!r}: each layer is one of ['M', '.'], got "
                f"{sorted(bad)}"
            )

    def _validate_experts(self) -> None:
        if self.experts == 0:
            return
        if self.experts < 2:
            raise ValueError(
                f"model.mlp.experts must be 0 (a dense MLP) or >= 2, got {self.experts}"
            )
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(
                f"model.mlp.top_k must be 1 … model.mlp.experts ({self.experts}), got {self.top_k}"
            )
        if self.expert_hidden < 0:
            raise ValueError(f"model.mlp.expert_hidden must be >= 0, got {self.expert_hidden}")
        if self.balance < 0:
            raise ValueError(f"model.mlp.balance must be >= 0, got {self.balance}")
        dense = [k for k in ("fc_in_out", "proj_in_out") if getattr(self, k)]
        dense += ["fp8"] if self.fp8 != "off" else []
        if dense:
            raise ValueError(
                f"model.mlp.experts={self.experts}: the experts are (E, out, in) stacks in "
                f"bf16 or fp32; model.mlp.{dense[0]} is the dense MLP's, leave it off"
            )
