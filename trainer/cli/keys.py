"""What a dotted config key names in the schema, and the keys meant by one it does not.

A key typed in the wrong group (`train.lr`) has no near spelling there, so the nearest names
alone would say nothing: the error names the keys of that name elsewhere in the schema
(optim.muon.lr, optim.adamw.head_lr, ...) and lists the group's own keys. The schema is the
OmegaConf tree of the config dataclasses (`OmegaConf.structured`), so a free-form mapping such
as optim.lr_mul takes any key, as Hydra lets it. A list of rows (train.stages.rows) is keyed
by index: train.stages.rows.0.seq_len names a column of its first row, checked against the
row's dataclass (the schema's list is empty; which rows exist is the preset's).
"""

import difflib
import typing
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from model.config.moved import moved_key, moved_message
from optim.parallelism import replaced_message, replaced_within
from stages.moved import moved_message as stage_moved_message
from stages.moved import moved_within


def known_key(root: DictConfig, key: str, conf_dir: Path) -> bool:
    """Whether the schema types dotted `key` (False below a free-form mapping such as
    optim.lr_mul, where any key goes); ValueError naming its first unknown part and the keys
    meant."""
    parts = key.split(".")
    if old := moved_within(key):
        raise ValueError(stage_moved_message(old))
    if old := replaced_within(key):
        raise ValueError(replaced_message(old))
    if len(parts) >= 2 and parts[0] == "model" and moved_key(rest := ".".join(parts[1:])):
        raise ValueError(moved_message(rest))
    node: Any = root
    for depth, part in enumerate(parts):
        is_list = isinstance(node, ListConfig) and depth > 0
        if is_list and (row := row_type(root, parts[: depth - 1], parts[depth - 1])):
            if not part.isdigit():
                raise ValueError(
                    f"unknown config key {key}: {'.'.join(parts[:depth])} is a list of rows, "
                    f"named by index ({'.'.join(parts[:depth])}.0.<column>)"
                )
            node = OmegaConf.structured(row)
            continue
        if not isinstance(node, DictConfig):
            raise ValueError(f"unknown config key {key}: {'.'.join(parts[:depth])} has no keys")
        if depth > 0 and OmegaConf.get_type(node) is dict:
            return False
        if part not in node:
            raise ValueError(_unknown(root, parts, depth, conf_dir, node))
        if depth < len(parts) - 1:  # a value left unset (???) has no keys, and reading it raises
            node = None if OmegaConf.is_missing(node, part) else node[part]
    return True


def row_type(root: DictConfig, above: list[str], name: str) -> type | None:
    """The dataclass of the rows of list field `name` under dotted `above` (train.stages'
    rows: Stage), or None where it is not a list of dataclasses."""
    node = OmegaConf.select(root, ".".join(above)) if above else root
    group = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    found = {f.name: f for f in fields(group)}.get(name) if is_dataclass(group) else None
    args = typing.get_args(found.type) if found is not None else ()
    return args[0] if args and is_dataclass(args[0]) else None


def row_key(root: DictConfig, key: str) -> tuple[type, str] | None:
    """(the row dataclass, the rest of the key) where dotted `key` names a row of a list of
    rows by index (train.stages.rows.0.seq_len: (Stage, "seq_len"); a whole row: ""); None
    otherwise."""
    parts = key.split(".")
    for depth in range(1, len(parts) - 1):
        if parts[depth + 1].isdigit() and (row := row_type(root, parts[:depth], parts[depth])):
            return row, ".".join(parts[depth + 2 :])
    return None


def _unknown(
    root: DictConfig, parts: list[str], depth: int, conf_dir: Path, node: DictConfig
) -> str:
    """The error for `parts[depth]`, a name `node`, the config at `parts[:depth]`, lacks: the
    nearest of its names, else the keys of that name in other groups and all of its names."""
    key, part, above, rest = ".".join(parts), parts[depth], parts[:depth], parts[depth + 1 :]
    names = [str(name) for name in node]
    if depth == 0:  # a top-level name may be a group as well as a key
        groups = sorted(p.name for p in conf_dir.iterdir() if p.is_dir() and p.name != "hydra")
        if part in groups:
            options = ", ".join(sorted(p.stem for p in (conf_dir / part).glob("*.yaml")))
            chosen = f"chosen as {part}=NAME ({options})"
            return f"unknown config key {key}: {part} is a config group with no keys, {chosen}"
        names += [group for group in groups if group not in names]
    if near := difflib.get_close_matches(part, names, n=3):
        meant = [".".join([*above, name, *rest]) for name in near]
        return f"unknown config key {key}; did you mean {listed(meant, 'or')}?"
    alike = _named_alike(root, part, rest)
    hint = f"; did you mean {listed(alike, 'or')}?" if alike else ""
    cls = OmegaConf.get_type(node)
    owner = f", the fields of {cls.__module__}.{cls.__name__}" if is_dataclass(cls) else ""
    whose = f"the keys of {'.'.join(above)}{owner}" if above else "the top-level keys and groups"
    return f"unknown config key {key}{hint} ({whose}: {', '.join(names)})"


def _named_alike(root: DictConfig, part: str, rest: list[str], limit: int = 5) -> list[str]:
    """Up to `limit` keys of the schema whose name is `part` followed by `rest`, or has `part`
    as a word of it, or is a near spelling: where a key put in the wrong group lives (`lr`:
    optim.muon.lr, then optim.adamw.head_lr and the other learning rates, then lr_* ...)."""
    found = []
    for path in _all_keys(root):
        names = path.split(".")
        if len(names) > len(rest) and names[len(names) - len(rest) :] == rest:
            rank = _likeness(names[-1 - len(rest)], part)
            if rank is not None:
                found.append((rank, path))
    return [path for _, path in sorted(found, key=lambda x: x[0])][:limit]


def _likeness(name: str, part: str) -> int | None:
    """How `name` is like `part`, closest first: 0 the same, 1 a kind of it (`head_lr` of
    `lr`), 2 a setting of it (`lr_scale`), 3 a word of it (`min_lr_frac`), 4 a near spelling;
    None: not alike."""
    near = bool(difflib.get_close_matches(part, [name], cutoff=0.8))
    word = f"_{part}_" in name
    alike = [name == part, name.endswith(f"_{part}"), name.startswith(f"{part}_"), word, near]
    return alike.index(True) if any(alike) else None


def _all_keys(node: DictConfig, above: str = "") -> Iterator[str]:
    """Every dotted key of the schema that holds a value (a group's keys, not the group; a
    free-form mapping such as optim.lr_mul as one value)."""
    for name in node:
        path = f"{above}{name}"
        child = None
        if not (OmegaConf.is_missing(node, name) or OmegaConf.is_interpolation(node, name)):
            child = node[name]
        if isinstance(child, DictConfig) and OmegaConf.get_type(child) is not dict:
            yield from _all_keys(child, f"{path}.")
        else:
            yield path


def listed(names: list[str], last: str = "and") -> str:
    """`a`, `a and b`, `a, b and c` (or `last` for and)."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"
