"""The `model` option values that were named after the record that brought them, and the
names of what each computes today.

A saved config (a checkpoint's) reads under today's values through this table (trainer/
checkpoint's resume rules); a command line, a config file or a Python caller that gives an
old value gets one line naming the new one, when the config is validated.
"""

# Dotted key under `model` -> {old value: today's}
RENAMED_VALUES: dict[str, dict[str, str]] = {
    "head.loss": {"record_2026_07": "sigmoid_e5m2_grad"},
    "numerics.fp8_scales": {
        "record_2025_01": "pow2",
        "record_2025_11": "sqrt_d_over_448",
        "record_2026_07": "fixed_over_448",
    },
    "numerics.scalars_layout": {"record_2025_11": "mixes", "record_2026_07": "weight_lambdas"},
}


def renamed_message(key: str, old: str) -> str:
    """The one line for `model.<key>=<old>`, an old value of that option."""
    new = RENAMED_VALUES[key][old]
    return f"model.{key}={old} is now model.{key}={new} (options are named by what they compute)"


def check_renamed(group: object, name: str) -> None:
    """Raise ValueError (`renamed_message`) where a field of `group`, the config of
    `model.<name>`, holds an old value."""
    for key, table in RENAMED_VALUES.items():
        owner, _, field = key.rpartition(".")
        value = getattr(group, field) if owner == name else None
        if isinstance(value, str) and value in table:
            raise ValueError(renamed_message(key, value))
