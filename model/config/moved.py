"""The `model` keys of the flat schema, by their place in today's groups.

A saved config (a checkpoint's) is read under today's names through this table
(trainer/checkpoint's resume rules); a command line or a Python caller that names an old key
gets one line naming the new one. The window's keys by phase (`model.window_phases`,
`window_after`, `window_final_eval`) went into the stage table: stages/moved.py.
"""

from stages.moved import refuse_keys

MOVED = {
    "rope_base": "attention.rope_base",
    "logit_softcap": "head.softcap",
    "qk_norm": "attention.qk_norm",
    "embed_rows": "embed.rows",
    "dtype": "numerics.dtype",
    "rope": "attention.rope",
    "rope_bf16": "attention.rope_bf16",
    "rope_reciprocal": "attention.rope_reciprocal",
    "merged_qkv": "attention.merged_qkv",
    "attn_scale": "attention.scale",
    "value_residual": "attention.value_residual",
    "value_residual_lambda": "attention.value_residual_lambda",
    "x0_shortcut": "residual.x0_shortcut",
    "unet": "residual.unet",
    "value_embeds": "embed.value_embeds",
    "attention_layers": "attention.layers",
    "window": "attention.window",
    "window_block": "attention.window_block",
    "window_tokens": "attention.window_tokens",
    "yarn": "attention.yarn",
    "document_mask": "attention.document_mask",
    "attention_impl": "attention.impl",
    "fp8_head": "head.fp8",
    "fp8_scales": "numerics.fp8_scales",
    "softcap_form": "head.softcap_form",
    "loss": "head.loss",
    "mlp_layers": "mlp.layers",
    "merged_qkvo": "attention.merged_qkvo",
    "fc_in_out": "mlp.fc_in_out",
    "attn_gate": "attention.gate",
    "smear": "embed.smear",
    "skip_from": "residual.skip_from",
    "skip_to": "residual.skip_to",
    "backout_layer": "residual.backout_layer",
    "x0_mix_a_init": "residual.x0_mix_a_init",
    "packed_scalars": "numerics.packed_scalars",
    "scalars_multiple": "numerics.scalars_multiple",
    "head_bf16": "head.bf16",
    "window_granularity": "attention.window_granularity",
    "loss_reduction": "head.reduction",
    "loss_dtype": "head.loss_dtype",
}


def moved_message(old: str) -> str:
    """The one line for `model.<old>`, a key of the flat schema or a moved group key."""
    if MOVED.get(old, old) in RESHAPED:
        return (
            f"model.{old} is now model.residual.skips, a list of [from, to] pairs (one per gated "
            "skip): 'model.residual.skips=[[4,7]]'"
        )
    if old in MOVED:
        return f"model.{old} is now model.{MOVED[old]} (the model's keys are grouped)"
    return f"model.{old} is now model.{TO_PARTS[old]} (each mechanism has its own section)"


# Keys of a group that moved to their mechanism's own section, {old: new}, model-relative.
TO_PARTS = {
    "embed.bigram_rows": "bigram.rows",
    "embed.bigram_dim": "bigram.dim",
    "embed.bigram_signs": "bigram.signs",
    "embed.bigram_position1": "bigram.position1",
    "residual.bigram_lambda_init": "bigram.lambda_init",
    "residual.bigram_in_x0": "bigram.in_x0",
}


# Keys whose value took another form, {old: new}, model-relative: the one gated skip's two
# layers became a pair of the list of gated skips (a saved config's are read as that pair:
# trainer/checkpoint/resume_rules.py).
RESHAPED = {"residual.skip_from": "residual.skips", "residual.skip_to": "residual.skips"}


def moved_key(old: str) -> str | None:
    """Today's model-relative key of `old` (a flat key or a moved group key), else None."""
    return MOVED.get(old) or TO_PARTS.get(old) or RESHAPED.get(old)


# `model.residual`'s dataclass takes this: an old key passed, read or set fails with its line.
refuse_reshaped = refuse_keys(
    "residual", {k.partition(".")[2] for k in RESHAPED}, lambda key: moved_message(key)
)
