"""The keys a record's stages had before the stage table, and how each reads now.

The stages were once parallel lists in four groups (train.seq_len_phases,
model.attention.window_phases, ...), each splitting the scheduled steps into as many equal
phases as it had entries. Each is now a column of `train.stages.rows` or an entry of the table
(stages/table.py). A command line, a config file or a Python caller that names an old key gets
one line naming the new one (`moved_message`; the config classes take `refuse_moved`); a
checkpoint's saved config is read as the table (`table_from_lists`, through the resume rules'
`upgrade_saved`).
"""

import functools
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from stages.table import COLUMNS, Stage, StageTable

# Old dotted key -> the column of train.stages.rows, or the entry of train.stages, it became.
COLUMN_OF = {
    "train.seq_len_phases": "seq_len",
    "model.attention.window_phases": "window",
    "data.max_piece_len_phases": "max_piece_len",
    "data.max_pieces": "max_pieces",
    "optim.schedule.peaks": "lr_peak",
    "model.head.mtp_weights": "mtp_weights",
}
ENTRY_OF = {
    "model.attention.window_after": "window_after",
    "model.attention.window_final_eval": "window_final_eval",
    "optim.schedule.peak_edges": "peak_edges",
}
# The flat model schema's spellings of the window keys (model/config/moved.py has the rest).
FLAT = {
    "model.window_phases": "model.attention.window_phases",
    "model.window_after": "model.attention.window_after",
    "model.window_final_eval": "model.attention.window_final_eval",
}
MOVED = [*COLUMN_OF, *ENTRY_OF, *FLAT]


def moved_message(old: str) -> str:
    """The one line for the old dotted key `old` (one of MOVED)."""
    key = FLAT.get(old, old)
    if key in COLUMN_OF:
        column = COLUMN_OF[key]
        return (
            f"{old} is now train.stages.rows.N.{column}, a column of the stage table (one row "
            f"per stage: train.stages.rows.0.{column}=...; docs/config.md)"
        )
    entry = ENTRY_OF[key]
    return f"{old} is now train.stages.{entry}, an entry of the stage table (docs/config.md)"


def moved_within(key: str) -> str | None:
    """The old key that dotted `key` is or lies under, or None."""
    return next((old for old in MOVED if key == old or key.startswith(f"{old}.")), None)


def refuse_moved(group: str) -> Callable[[type], type]:
    """A class decorator for the config dataclass of `group` (e.g. "data"): a key of it that
    moved into the stage table fails with `moved_message` (`refuse_keys`)."""
    old = {k.rpartition(".")[2] for k in MOVED if k.rpartition(".")[0] == group}
    return refuse_keys(group, old, moved_message)


def refuse_keys(group: str, old: set[str], message: Callable[[str], str]) -> Callable[[type], type]:
    """A class decorator for the config dataclass of `group`: a key of `old` (names in the
    group) passed to the constructor, read or set fails with `message(group.name)`, where it
    would otherwise be a TypeError without the new name, or a silently ignored attribute."""

    def decorate(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            for name in sorted(kwargs.keys() & old):
                raise TypeError(message(f"{group}.{name}"))
            init(self, *args, **kwargs)

        def __getattr__(self: Any, name: str) -> Any:  # reached only for names it lacks
            if name in old:
                raise AttributeError(message(f"{group}.{name}"))
            raise AttributeError(f"{cls.__name__!r} object has no attribute {name!r}")

        def __setattr__(self: Any, name: str, value: Any) -> None:
            if name in old:
                raise AttributeError(message(f"{group}.{name}"))
            object.__setattr__(self, name, value)

        cls.__init__ = __init__
        cls.__getattr__ = __getattr__
        cls.__setattr__ = __setattr__
        return cls

    return decorate


def table_from_lists(old: dict[str, Any], mtp: bool) -> dict[str, Any]:
    """The stage table, as a nested dict, of a config saved with the parallel lists: `old`
    holds the old keys' saved values by dotted key (COLUMN_OF, ENTRY_OF), `mtp` the saved
    model.head.mtp (its weights only counted where it was on, as only then did they apply).

    The rows are as many as the longest list; a list of one entry was a constant and fills
    every row. The MTP weights [w_0, …, w_{P−1}] were P phases, phase p keeping
    w_0 … w_{P−1−p} with its last weight falling over the phase: row p keeps those, with
    mtp_decay. Raises ValueError for lists no one table holds (of two lengths above one)."""
    lists = {COLUMN_OF[k]: list(v) for k, v in old.items() if k in COLUMN_OF and v}
    if not mtp:
        lists.pop("mtp_weights", None)
    weights = lists.pop("mtp_weights", [])
    if weights:
        lists["mtp_weights"] = [weights[: len(weights) - p] for p in range(len(weights))]
    n = max((len(v) for v in lists.values()), default=0)
    for column, values in lists.items():
        if len(values) == 1:
            lists[column] = values * n
        elif len(values) != n:
            raise ValueError(f"saved stage lists of {len(values)} and {n} entries: {lists}")
    unset = asdict(Stage())  # a column no list gave: every row at its default
    rows = [{c: lists[c][i] if c in lists else unset[c] for c in COLUMNS} for i in range(n)]
    table = {**asdict(StageTable()), "rows": rows, "mtp_decay": bool(weights)}
    return table | {ENTRY_OF[k]: v for k, v in old.items() if k in ENTRY_OF}
