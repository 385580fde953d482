"""The checks of `ModelConfig.validate` that read two groups at once (a part whose settings
live in one group and its storage or inputs in another): each raises ValueError naming the
keys and the fix. `cfg` is a ModelConfig (model/config/__init__.py), which imports this."""

from typing import Any


def validate_across_groups(cfg: Any) -> None:
    """Raise ValueError naming the `model.*` keys of two groups that do not go together."""
    att, head, num, res = cfg.attention, cfg.head, cfg.numerics, cfg.residual
    if "P" in att.paired and cfg.n_head % 2:
        raise ValueError(
            f"model.attention.paired pairs head h with h + H/2: needs an even model.n_head, "
            f"got {cfg.n_head}"
        )
    gated = att.gate or cfg.embed.smear or res.skip_per_token
    if gated and not 0 < cfg.gate_channels <= cfg.n_embd:
        raise ValueError(
            f"model.gate_channels must be in [1, model.n_embd], got {cfg.gate_channels}"
        )
    bf16 = num.dtype == "bf16"
    for key, on in (("fp8", head.fp8), ("bf16", head.bf16)):
        if on and not bf16:
            raise ValueError(
                f"model.head.{key}=true needs model.numerics.dtype=bf16 (its inputs are bf16)"
            )
    if cfg.mlp.fp8 != "off" and not bf16:
        raise ValueError(
            f"model.mlp.fp8={cfg.mlp.fp8} needs model.numerics.dtype=bf16 (its inputs and "
            "its backward are bf16)"
        )
    if num.packed_scalars and (res.unet or att.value_residual == "learned"):
        raise ValueError(
            "model.numerics.packed_scalars has no place for model.residual.unet's skip "
            "weights or model.attention.value_residual=learned's λ: turn those off"
        )
    _validate_scalars_layout(cfg)
    if res.x0_lambdas and not (
        num.packed_scalars and num.scalars_layout == "residual_weight_lambdas"
    ):
        raise ValueError(
            "model.residual.x0_lambdas reads r_ℓ from the packed vector: set "
            "model.numerics.packed_scalars=true and scalars_layout=residual_weight_lambdas"
        )
    if cfg.embed.second_table and not res.x0_lambdas:
        raise ValueError(
            "model.embed.second_table adds x02 with its weight Λ[ℓ, 1] of "
            "model.residual.x0_lambdas: set model.residual.x0_lambdas=true"
        )
    if num.packed_scalars and num.scalars_layout == "mixes" and res.skips and cfg.n_layer < 2:
        raise ValueError(
            "model.numerics.packed_scalars reads the skip gate at index 1: needs model.n_layer >= 2"
        )
    if res.mudd:
        _validate_mudd(cfg)
    if head.loss == "sigmoid_e5m2_grad" and not head.fp8:
        raise ValueError(
            "model.head.loss=sigmoid_e5m2_grad writes the FP8 head's e5m2 gradient: set "
            "model.head.fp8=true"
        )
    if head.fp8 and head.reduction == "sum" and num.fp8_scales == "pow2":
        raise ValueError(
            "model.head.reduction=sum gives per-token logit gradients of O(1), which the "
            "FP8 head's power-of-two gradient scale (×2¹⁹) overflows in e5m2: set "
            "model.numerics.fp8_scales=sqrt_d_over_448 (×448)"
        )


def _validate_scalars_layout(cfg: Any) -> None:
    num, res = cfg.numerics, cfg.residual
    if not num.packed_scalars:
        return
    if num.scalars_layout == "mixes" and cfg.attention.weight_lambdas:
        raise ValueError(
            "model.attention.weight_lambdas has no place in the packed vector of "
            "model.numerics.scalars_layout=mixes: set scalars_layout=weight_lambdas"
        )
    if num.scalars_layout != "residual_weight_lambdas" and len(res.skips) > 1:
        raise ValueError(
            f"model.numerics.scalars_layout={num.scalars_layout} holds one skip logit, "
            f"model.residual.skips has {len(res.skips)}: use "
            "scalars_layout=residual_weight_lambdas (a logit per skip)"
        )
    if num.scalars_layout == "residual_weight_lambdas":
        _validate_residual_weight_lambdas(cfg)
        return
    if num.scalars_layout != "weight_lambdas":
        return
    for key, on in (
        ("residual.x0_shortcut", res.x0_shortcut),
        ("residual.backout_layer", res.backout_layer >= 0),
        ("embed.value_embeds (ungated, the α, β mix)",
         bool(cfg.embed.value_embeds) and not cfg.embed.value_gate),
    ):  # fmt: skip
        if on:
            raise ValueError(
                f"model.numerics.scalars_layout=weight_lambdas has no place for model.{key}'s "
                "scalars: turn it off, or use scalars_layout=mixes"
            )


def _validate_residual_weight_lambdas(cfg: Any) -> None:
    """The residual_weight_lambdas vector (record_medium_2025_12_31's) holds r_ℓ, not the x0
    mix's (a, b), and no value mix."""
    res = cfg.residual
    if res.x0_shortcut and not res.x0_lambdas:
        raise ValueError(
            "model.numerics.scalars_layout=residual_weight_lambdas holds the x0 shortcut's "
            "a_ℓ (r_ℓ) but not its b_ℓ: set model.residual.x0_lambdas=true"
        )
    if cfg.embed.value_embeds and not cfg.embed.value_gate:
        raise ValueError(
            "model.numerics.scalars_layout=residual_weight_lambdas has no place for the "
            "ungated value tables' (α, β): set model.embed.value_gate=true"
        )


def _validate_mudd(cfg: Any) -> None:
    if "0" not in cfg.embed.value_embeds:
        raise ValueError(
            "model.residual.mudd adds ve₀, the lookup of value table 0, after the last "
            "layer: model.embed.value_embeds must name table 0"
        )
    if cfg.n_head % 2:
        raise ValueError(
            "model.residual.mudd gates the first and the second half of the heads' value "
            f"embeddings apart: model.n_head must be even, got {cfg.n_head}"
        )
    if cfg.attention.value_residual != "off":
        raise ValueError(
            "model.residual.mudd sets the last layer's values itself: turn "
            "model.attention.value_residual off"
        )
