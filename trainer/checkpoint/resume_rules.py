"""How a checkpoint treats the keys of the config it was saved with.

A field's `resume` metadata (trainer/config.py and each package's config.py) says how a
checkpoint treats it (`resume_rule`): "must_match" (a resumed run must have the saved value:
it decides which tensors exist or what the loader position means), "operational" (how a run
executes or reports, never its numbers: a change passes silently); every other change is
allowed with a warning. A group's rule covers its fields unless a field says otherwise.
Saved configs are read under today's key names (`upgrade_saved`) and compared key by key
(`flatten`, trainer/config_checks.py).
"""

from dataclasses import MISSING, fields, is_dataclass
from typing import Any

from omegaconf import OmegaConf

from trainer.config import Config


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
    return rule


# Keys moved since a checkpoint may have been saved: old dotted key -> today's.
RENAMED = {"optim.schedule.window_tokens": "model.window_tokens"}


def upgrade_saved(config: dict[str, Any]) -> dict[str, Any]:
    """A saved config (nested dict) with its keys under today's names (RENAMED)."""
    out = OmegaConf.create(config)
    for old, new in RENAMED.items():
        value = OmegaConf.select(out, old)
        if value is None:
            continue
        parent, _, leaf = old.rpartition(".")
        node = OmegaConf.select(out, parent) if parent else out
        node.pop(leaf)
        OmegaConf.update(out, new, value, force_add=True)
    return OmegaConf.to_container(out)
