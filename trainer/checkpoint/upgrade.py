"""Old checkpoints read as this code writes them: parameter names and option values that a
later layout renamed are mapped to today's before anything is loaded.

Each entry says what changed and since which layout; a checkpoint written before it is
rewritten on load, one written after is left alone. The table is the only place that knows
old names, so a resume of any earlier save and `scripts/bitwise.py` read old saves alike.
"""

from typing import Any

# (old key prefix, new key prefix) of the model's state_dict, in the order they were made
MODEL_KEY_RENAMES: tuple[tuple[str, str], ...] = ()


def rename_key(key: str) -> str:
    """`key` under today's names."""
    for old, new in MODEL_KEY_RENAMES:
        if key == old or key.startswith(old + "."):
            key = new + key[len(old) :]
    return key


def upgrade_parts(parts: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The saved parts ("model", "optimizers", …) under today's names; the rest as saved."""
    out = dict(parts)
    if "model" in out:
        out["model"] = {rename_key(k): v for k, v in out["model"].items()}
    return out
