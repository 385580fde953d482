"""Old checkpoints read as this code writes them: the parameter names that a later layout
renamed are mapped to today's before anything is loaded.

meta.json's "names" says which naming a save uses (absent: 1). Naming 2 made each mechanism
a part of the model with its parameters under it (docs/architecture.md, "Parts"): the
bigram table `bigram_embed` became `bigram.embed`, and so on (`RENAMED`). A save of an
older naming is rewritten on load, in the model's state, in the optimizers' `param_names`
and in a sharded save's flat keys; a save of today's is left alone. This table is the only
place that knows old names, so a resume of an earlier save and `scripts/bitwise.py` read
old saves alike.
"""

import copy
from typing import Any

NAMES = 2  # the naming this code writes

# Naming 1 -> 2: {old name: new name} of a parameter or buffer, or of the module holding it
RENAMED = {
    "skip_weights": "skips.weights",
    "skip_token_gate": "skips.token_gate",
    "scalars": "scalars.packed",
    "skip_gate": "scalars.skip_gate",
    "smear_lambda": "scalars.smear_lambda",
    "backout_lambda": "scalars.backout_lambda",
    "resid_lambdas": "sublayer_scales.resid_lambdas",
    "post_lambdas": "sublayer_scales.post_lambdas",
    "xsa_alphas": "xsa.alphas",
    "value_gates": "value_gates.weight",
    "x0_lambdas": "x0_injection.lambdas",
    "mudd_w1": "mudd.w1",
    "mudd_w2": "mudd.w2",
    "mudd_b2": "mudd.b2",
    "bigram_embed": "bigram.embed",
    "bigram_signs": "bigram.signs",
    "bigram_lambdas": "bigram.lambdas",
}
_OLD = {new: old for old, new in RENAMED.items()}
# Name patterns of a saved optim.roles / optim.adamw.table / optim.lr_mul that no name maps
PATTERNS = {"mudd_w[12]": "mudd.w[12]"}
# record_2026_07_17's table rows that naming 2 made its parts' own settings: {old row: where they
# went}
TO_PART_SETTINGS = {
    "bigram_embed.weight": ("model", "bigram", "optim", "embed"),
    "bigram_lambdas": ("model", "bigram", "optim", "lambdas"),
}


def _map(name: str, table: dict[str, str]) -> str:
    """`name` with its first component (or the whole name) looked up in `table`."""
    if name in table:
        return table[name]
    head, dot, rest = name.partition(".")
    return table[head] + dot + rest if dot and head in table else name


def is_old(meta: dict[str, Any]) -> bool:
    """Whether a save with this meta.json uses an older naming than this code's."""
    return meta.get("names", 1) < NAMES


def rename_key(key: str) -> str:
    """A naming-1 parameter or buffer name under today's."""
    return _map(key, RENAMED)


def old_key(key: str) -> str:
    """Today's name as naming 1 wrote it (a sharded save is read by its own keys)."""
    for new, old in sorted(_OLD.items(), key=lambda kv: -len(kv[0])):
        if key == new or key.startswith(new + "."):
            return old + key[len(new) :]
    return key


def rename_flat(key: str, rename: Any) -> str:
    """A flat optimizer key ("<optimizer>/<parameter>/<state>") with its parameter renamed."""
    parts = key.split("/")
    if len(parts) < 3:
        return key
    return "/".join([parts[0], rename("/".join(parts[1:-1])), parts[-1]])


def upgrade_config(config: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """A saved config (a checkpoint's, nested) whose optimizer tables name parameters, under
    today's names: the patterns of optim.roles, optim.lr_mul and optim.adamw.table renamed,
    and the table rows that became a part's own settings moved to its section."""
    if not is_old(meta):
        return config
    out = copy.deepcopy(config)
    optim = out.get("optim") or {}
    for key in ("roles", "lr_mul"):
        if isinstance(optim.get(key), dict):
            optim[key] = {_pattern(k): v for k, v in optim[key].items()}
    adamw = optim.get("adamw") or {}
    table = adamw.get("table")
    if isinstance(table, dict):
        for old, where in TO_PART_SETTINGS.items():
            if old in table:
                node = out
                for part in where[:-1]:
                    node = node.setdefault(part, {})
                node[where[-1]] = table.pop(old)
        adamw["table"] = {_pattern(k): v for k, v in table.items()}
    return out


def _pattern(pattern: str) -> str:
    """A name pattern of naming 1 under today's names."""
    return PATTERNS.get(pattern) or rename_key(pattern)


def upgrade_parts(parts: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """A torch_save checkpoint's parts ("model", "optimizers", …) under today's names."""
    if not is_old(meta):
        return parts
    out = dict(parts)
    if "model" in out:
        out["model"] = {rename_key(k): v for k, v in out["model"].items()}
    if "optimizers" in out:
        out["optimizers"] = [_rename_groups(sd) for sd in out["optimizers"]]
    return out


def upgrade_flat(state: dict[str, Any], meta: dict[str, Any], flat: bool) -> dict[str, Any]:
    """A sharded save's model state (`flat` False) or flat optimizer state (True) as read,
    under today's names."""
    if not is_old(meta):
        return state
    if flat:
        return {rename_flat(k, rename_key): v for k, v in state.items()}
    return {rename_key(k): v for k, v in state.items()}


def saved_keys(target: dict[str, Any], meta: dict[str, Any], model: str, optim: str) -> dict:
    """A sharded load's target (today's "<model>/<name>" and "<optim>/<flat key>" keys)
    under the names the save holds."""
    if not is_old(meta):
        return target
    out = {}
    for key, value in target.items():
        if key.startswith(model):
            out[model + old_key(key[len(model) :])] = value
        elif key.startswith(optim):
            out[optim + rename_flat(key[len(optim) :], old_key)] = value
        else:
            out[key] = value
    return out


def _rename_groups(state: Any) -> Any:
    """An optimizer's state_dict with the `param_names` of its groups renamed."""
    if not isinstance(state, dict) or "param_groups" not in state:
        return state
    groups = []
    for group in state["param_groups"]:
        group = dict(group)
        if "param_names" in group:
            group["param_names"] = [rename_key(n) for n in group["param_names"]]
        groups.append(group)
    return {**state, "param_groups": groups}
