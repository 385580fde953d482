"""`model.numerics`: the model's number formats and the layout of its scalars."""

from dataclasses import dataclass, field

from model.config.renamed import check_renamed

DTYPES = ("fp32", "bf16")
SCALAR_LAYOUTS = ("mixes", "weight_lambdas", "residual_weight_lambdas")
FP8_SCALES = ("pow2", "sqrt_d_over_448", "fixed_over_448")


@dataclass
class NumericsConfig:
    """The `model.numerics` group: number formats and the layout of the scalars."""

    dtype: str = field(default="fp32", metadata={"choices": DTYPES})
    """bf16: bf16 embedding tables, every linear casts its fp32 weight to bf16, a bf16
    residual stream (the 2025-01 record; pair with train.autocast=none) | fp32."""
    fp8_scales: str = field(default="pow2", metadata={"choices": FP8_SCALES})
    """The FP8 head's divisors (x_s, w_s, g_s), model/head.py: pow2 (1/2, 2⁻⁹, 2⁻¹⁹: the
    2025-01 record's) | sqrt_d_over_448 (√d/448, 2⁻⁹, 1/448: the 2025-11 record's) |
    fixed_over_448 (100/448, 1.6/448, 0.75/448: record_2026_07_17's)."""
    packed_scalars: bool = False
    """Every scalar of the model in one fp32 vector, the 2025-11 record's layout
    (model/scalars.py)."""
    scalars_layout: str = field(default="mixes", metadata={"choices": SCALAR_LAYOUTS})
    """Which packed vector (model/scalars.py): mixes (skip logits, x0 and value mixes per layer,
    λ_smear, λ_back: the 2025-11 record's) | weight_lambdas ((λ⁰, λ¹) per layer, λ_smear,
    w_skip: record_2026_07_17's) | residual_weight_lambdas (r_ℓ and (λ⁰, λ¹) per layer, λ_smear,
    λ_back, a logit per gated skip: record_medium_2025_12_31's)."""
    bf16_matrices: bool = False
    """The hidden matrices (attention's and the MLP's) are bf16 parameters, as record_2026_07_17's
    are (its optimizer keeps the fp32 master); needs model.numerics.dtype=bf16."""
    scalars_multiple: int = 8
    """The packed vector is padded (with ones) to a multiple of this: the record's 8 ranks, kept
    whatever the rank count so the parameter count is the same everywhere."""

    def validate(self) -> None:
        check_renamed(self, "numerics")
        if self.scalars_layout != "mixes" and not self.packed_scalars:
            raise ValueError(
                f"model.numerics.scalars_layout={self.scalars_layout} lays out the packed "
                "vector: set model.numerics.packed_scalars=true"
            )
        if self.bf16_matrices and self.dtype != "bf16":
            raise ValueError(
                "model.numerics.bf16_matrices=true needs model.numerics.dtype=bf16 (a bf16 stream)"
            )
        if self.scalars_multiple <= 0:
            raise ValueError(
                f"model.numerics.scalars_multiple must be positive, got {self.scalars_multiple}"
            )
