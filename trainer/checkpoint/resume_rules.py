"""How a checkpoint treats the keys of the config it was saved with.

A field's `resume` metadata (trainer/config.py and each package's config.py) says how a
checkpoint treats it (`resume_rule`): "must_match" (a resumed run must have the saved value:
it decides which tensors exist or what the loader position means), "operational" (how a run
executes or reports, never its numbers: a change passes silently); every other change is
allowed with a warning. A group's rule covers its fields unless a field says otherwise.
Saved configs are read under today's key names and option values (`upgrade_saved`) and
compared key by key (`flatten`, trainer/config_checks.py) with the run's (`check_config`); the
stage table's rows are compared column by column (`by_column`), each column under its own
rule (a window by stage must match, a piece limit may change silently, a sequence length with
a warning).
"""

import logging
import typing
from dataclasses import MISSING, asdict, fields, is_dataclass
from typing import Any

from omegaconf import OmegaConf

from model.config.moved import MOVED, TO_PARTS
from optim.parallelism import REPLACED, from_replaced
from stages.moved import COLUMN_OF, ENTRY_OF, FLAT, table_from_lists
from stages.table import COLUMNS, Stage
from trainer.checkpoint import files
from trainer.checkpoint.files import CheckpointError, Loaded
from trainer.checkpoint.upgrade import upgrade_config
from trainer.config import Config
from trainer.config_checks import RENAMED_VALUES, flatten

log = logging.getLogger("train")


def resume_rule(key: str, schema: Any = Config) -> str | None:
    """How a checkpoint treats dotted `key`: "must_match", "operational" or None (may change,
    with a warning), from the `resume` metadata of the field or of its nearest group."""
    rule, node = None, schema
    for name in key.split("."):
        found = {f.name: f for f in fields(node)}.get(name) if is_dataclass(node) else None
        if found is None:
            return rule  # a key the schema lacks (an older save's) keeps its group's rule
        rule = found.metadata.get("resume", rule)
        node = found.default_factory if found.default_factory is not MISSING else None
        if node is list:  # a list of rows (train.stages.rows): its keys are the row's columns
            node = next(iter(typing.get_args(found.type)), None)
    return rule


# Keys moved since a checkpoint may have been saved: old dotted key -> today's (the window's
# width left optim.schedule for model; then the model's keys went into groups, the window's
# keys by phase among them before they went into the stage table).
RENAMED = {
    "optim.schedule.window_tokens": "model.attention.window_tokens",
    **{f"model.{old}": f"model.{new}" for old, new in MOVED.items()},
    **{f"model.{old}": f"model.{new}" for old, new in TO_PARTS.items()},
    **FLAT,
}


def upgrade_saved(config: dict[str, Any]) -> dict[str, Any]:
    """A saved config (nested dict) with its keys under today's names (RENAMED), the one
    gated skip's layers as the list of skips (model.residual.skips), the
    parallel stage lists of a config saved before the stage table read as train.stages
    (`stages.moved.table_from_lists`), the four keys of how it spread over ranks as the one
    dist.parallelism (`optim.parallelism.from_replaced`), then its option values (an option
    value once named after a record: `RENAMED_VALUES`)."""
    out = OmegaConf.create(config)
    for old, new in RENAMED.items():
        value = _pop(out, old)
        if value is not None:
            OmegaConf.update(out, new, value, force_add=True)
    # The one gated skip's two layers are a pair of the list of skips now
    source, target = (_pop(out, f"model.residual.{k}") for k in ("skip_from", "skip_to"))
    if source is not None:
        skips = [[source, target]] if source >= 0 else []
        OmegaConf.update(out, "model.residual.skips", skips, force_add=True)
    lists = {k: v for k in [*COLUMN_OF, *ENTRY_OF] if (v := _pop(out, k)) is not None}
    if lists:
        mtp = bool(OmegaConf.select(out, "model.head.mtp", default=False))
        try:
            table = table_from_lists(lists, mtp)
        except ValueError as e:
            raise CheckpointError(f"the saved config's stage lists make no stage table: {e}") from e
        OmegaConf.update(out, "train.stages", table, force_add=True)
    spread = {k: v for k in REPLACED if (v := _pop(out, k)) is not None}
    if spread:
        OmegaConf.update(out, "dist.parallelism", from_replaced(spread), force_add=True)
    for key, values in RENAMED_VALUES.items():
        value = OmegaConf.select(out, key)
        if isinstance(value, str) and value in values:
            OmegaConf.update(out, key, values[value])
    return OmegaConf.to_container(out)


def _pop(config: Any, key: str) -> Any:
    """Remove dotted `key` from the OmegaConf tree `config`; its value (plain), or None."""
    value = OmegaConf.select(config, key)
    if value is None:
        return None
    parent, _, leaf = key.rpartition(".")
    (OmegaConf.select(config, parent) if parent else config).pop(leaf)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _with_train(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with a train group (an older save may lack one)."""
    return {"train": {}, **config}


def by_column(config: dict[str, Any]) -> dict[str, Any]:
    """The config dict with train.stages.rows as one list per column (every column, a value
    per row), the form in which `check_config` compares two tables."""
    stages = config.get("train", {}).get("stages", {})
    rows = stages.get("rows", [])
    columns = {c: [row.get(c, getattr(Stage(), c)) for row in rows] for c in COLUMNS}
    return {**config, "train": {**config["train"], "stages": {**stages, "rows": columns}}}


def check_config(loaded: Loaded, conf: Config, warn: bool) -> None:
    """Raise `CheckpointError` if `conf` differs from the config `loaded` was saved with in a
    key that must match; with `warn`, log the keys that differ and may."""
    config = upgrade_config(loaded.meta.get("config", {}), loaded.meta)  # parameter names
    saved = flatten(by_column(_with_train(upgrade_saved(config))))
    current = flatten(by_column(asdict(conf)))
    # A key the saved config lacks is a setting added since that save: the code that wrote
    # it behaved as the setting's default does (every new option is off by default).
    defaults = flatten(by_column(OmegaConf.to_container(OmegaConf.structured(Config))))
    saved |= {k: defaults[k] for k in current.keys() - saved.keys() if k in defaults}
    differ = sorted(k for k in saved.keys() | current.keys() if saved.get(k) != current.get(k))
    # Each key's rule is its field's `resume` metadata (trainer/config.py).
    fatal = [k for k in differ if resume_rule(k) == "must_match"]
    if fatal:
        shown = "; ".join(f"{k}: {saved.get(k)!r} saved, {current.get(k)!r} now" for k in fatal)
        raise CheckpointError(
            f"checkpoint {loaded.path} was saved with an incompatible config ({shown}). "
            f"Resume with the checkpoint's values (all in {loaded.path / files.META}) "
            "or start fresh with train.resume=never"
        )
    changed = [k for k in differ if resume_rule(k) is None]
    if changed and warn:
        log.warning(
            "resuming with values that differ from the checkpoint's; the run continues "
            "under the new ones: %s",
            "; ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in changed),
        )
