"""Checks of a config tree against its schema: choices named in field metadata (an option value
once named after a record fails with one line naming today's), and keys the schema lacks (an
unknown `+train.step=3` would otherwise be accepted and ignored); and a config tree as dotted
keys, the form in which ranks and checkpoints compare configs (`flatten`)."""

import difflib
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any

from model.config import renamed as model_renamed
from model.config.moved import MOVED, moved_message
from optim import renamed as optim_renamed
from optim.parallelism import replaced_message, replaced_within
from stages.moved import moved_message as stage_moved_message
from stages.moved import moved_within

# The packages' tables of renamed option values (model/config/renamed.py, optim/renamed.py)
# by their top-level group, and all of them as dotted key -> {old value: today's}.
RENAMED_BY_GROUP = {"model": model_renamed, "optim": optim_renamed}
RENAMED_VALUES = {
    f"{group}.{key}": table
    for group, module in RENAMED_BY_GROUP.items()
    for key, table in module.RENAMED_VALUES.items()
}


def check_choices(node: Any, prefix: str = "") -> None:
    """Every field whose metadata names its `choices` holds one of them, through the whole
    tree of dataclasses: the one "must be one of" check of the config."""
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            check_choices(value, f"{prefix}{f.name}.")
        elif "choices" in f.metadata and value not in f.metadata["choices"]:
            check_renamed(f"{prefix}{f.name}", value)
            allowed = " | ".join(f.metadata["choices"])
            raise ValueError(f"{prefix}{f.name} must be one of {allowed}, got {value!r}")


def check_renamed(key: str, value: Any) -> None:
    """Raise ValueError, in the one line its package gives, where `value` is an old value of
    dotted `key`."""
    if isinstance(value, str) and value in RENAMED_VALUES.get(key, {}):
        group, _, rest = key.partition(".")
        raise ValueError(RENAMED_BY_GROUP[group].renamed_message(rest, value))


def check_known(values: dict[str, Any], schema: Any, prefix: str = "") -> None:
    """Raise ValueError naming the first key of `values` that the dataclass `schema` lacks,
    with the nearest real key: `+train.step=3` would otherwise be accepted and ignored."""
    known = {f.name: f for f in fields(schema)}
    for key, value in values.items():
        if key not in known:
            if old := moved_within(f"{prefix}{key}"):
                raise ValueError(stage_moved_message(old))
            if old := replaced_within(f"{prefix}{key}"):
                raise ValueError(replaced_message(old))
            if prefix == "model." and key in MOVED:
                raise ValueError(moved_message(key))
            near = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"; did you mean {prefix}{near[0]}?" if near else ""
            raise ValueError(f"unknown config key {prefix}{key}{hint}")
        group = known[key].default_factory  # a nested group's dataclass
        if isinstance(value, dict) and group is not MISSING and is_dataclass(group):
            check_known(value, group, f"{prefix}{key}.")
        row = next(iter(typing.get_args(known[key].type)), None)  # a list of rows' dataclass
        if isinstance(value, list) and is_dataclass(row):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    check_known(item, row, f"{prefix}{key}.{i}.")


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as {"train.steps": 200, ...}, for comparing configs key by key."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
