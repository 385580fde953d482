"""The `optim` option values that were named after the record that brought them, and the
names of what each computes today.

A saved config (a checkpoint's) reads under today's values through this table (trainer/
checkpoint's resume rules); a command line, a config file or a Python caller that gives an
old value gets one line naming the new one, where the choices are checked (`check_choices`).
"""

# Dotted key under `optim` -> {old value: today's}
RENAMED_VALUES: dict[str, dict[str, str]] = {
    "muon.normuon_form": {"record_2025_11": "o_dtype", "record_2026_07": "fp32_mean_squares"},
}


def renamed_message(key: str, old: str) -> str:
    """The one line for `optim.<key>=<old>`, an old value of that option."""
    new = RENAMED_VALUES[key][old]
    return f"optim.{key}={old} is now optim.{key}={new} (options are named by what they compute)"
