"""The command line's overrides, checked before Hydra composes them.

Hydra reports a mistyped key (`train.step=10`), a missing group option (`model=tiny2`) or a
value of the wrong type (`train.steps=abc`) in a block of lines that, for the first, suggests
the wrong fix (`+train.step=10`, a key the schema would then reject). This module checks every
override against the config schema and the option files under `conf/` first, and raises one
ValueError naming the key or option and the nearest valid names. It imports no torch, so a
typo fails in well under a second. What it cannot judge (Hydra's own `hydra.*` keys, a
package-qualified override, a config from another directory) it leaves to Hydra.
"""

import difflib
import re
import shlex
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from model.config.moved import MOVED, moved_message

# Hydra's command-line flags that point it at other configs: their overrides mean something
# this module cannot see.
ELSEWHERE = ("config_path", "config_name", "config_dir", "experimental_rerun")


def check_command_line(argv: list[str], conf_dir: Path, schema: Any) -> None:
    """Raise ValueError for the first override in `argv` (train.py's arguments) that names an
    unknown key or group option, or gives a value the key's type rejects."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)  # a bad flag: argparse's usage line, exit 2
    if any(getattr(args, name, None) for name in ELSEWHERE):
        return
    check_overrides(args.overrides, conf_dir, schema)
    if not (args.multirun or args.cfg or args.info or args.help or args.hydra_help):
        compose_and_validate(args.overrides, conf_dir)


def compose_and_validate(overrides: list[str], conf_dir: Path) -> None:
    """Compose the config of a single run (no -m) as Hydra will, refuse what only a multirun
    does, and validate every value, before Hydra makes the run directory: a config that can
    never start leaves nothing behind. (A sweep's jobs are each validated when they start.)"""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from trainer.config import register_configs, to_config

    register_configs()  # the schema Hydra checks the YAML against (idempotent)
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    except Exception as e:  # a YAML file (an experiment of one's own) with a flat model key
        moved = re.search(r"Key '(\w+)' not in 'ModelConfig'", f"{e} {e.__cause__}")
        if moved and moved.group(1) in MOVED:
            raise ValueError(f"{moved_message(moved.group(1))}, in a config file") from None
        raise
    finally:
        GlobalHydra.instance().clear()  # hydra.main initialises its own
    with open_dict(cfg):
        hydra_cfg = cfg.pop("hydra")
    refuse_multirun_only(hydra_cfg, overrides, conf_dir)
    cfg.run_dir = "."  # Hydra's output directory does not exist yet
    to_config(cfg)


def refuse_multirun_only(hydra_cfg: DictConfig, overrides: list[str], conf_dir: Path) -> None:
    """Raise ValueError, naming the fix, where a single run's config asks for what only a
    multirun (-m) does: a Hydra launcher (launcher=slurm) or a sweep (a preset's
    hydra.sweeper.params). Without -m Hydra ignores both and runs one job here: launcher=slurm's
    dist.nproc=8 ranks on this machine, or one of a sweep preset's configs."""
    choices = hydra_cfg.runtime.choices
    fix = f"add -m: {shlex.join(['python', 'train.py', '-m', *overrides])}"
    if choices.get("hydra/launcher") != "basic":
        source = _chosen_by(choices, conf_dir, "hydra.launcher")
        raise ValueError(
            f"{source or 'hydra/launcher=' + choices['hydra/launcher']} sets Hydra's launcher, "
            f"which only a multirun uses (without -m the run would start here instead): {fix}"
        )
    if swept := list(hydra_cfg.sweeper.get("params") or {}):
        source = _chosen_by(choices, conf_dir, "hydra.sweeper.params")
        raise ValueError(
            f"{source or 'hydra.sweeper.params'} is a sweep over {', '.join(swept)}, which only "
            f"a multirun runs (without -m one of its configs would run): {fix}"
        )


def _chosen_by(choices: DictConfig, conf_dir: Path, key: str) -> str | None:
    """The `group=option` whose file under `conf_dir` sets `key` (or overrides its group in
    its defaults list), among the options `choices` (Hydra's runtime.choices) names."""
    for group, option in choices.items():
        path = conf_dir / str(group) / f"{option}.yaml"
        if str(group).startswith("hydra/") or option is None or not path.is_file():
            continue
        node = OmegaConf.load(path)
        defaults = [k for d in node.get("defaults", []) if isinstance(d, DictConfig) for k in d]
        if OmegaConf.select(node, key) is not None or any(
            str(k).endswith(key.replace(".", "/")) for k in defaults
        ):
            return f"{group}={option}"
    return None


def check_overrides(overrides: list[str], conf_dir: Path, schema: Any) -> None:
    """Raise ValueError for the first of `overrides` (Hydra's override strings) that Hydra
    would reject or that names a key `schema` (a dataclass) lacks."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as e:
        first = str(e).splitlines()
        raise ValueError(
            f"cannot read the override {_quoted(e)}: {first[1] if len(first) > 1 else first[0]}"
            " (overrides are key=value or group=option)"
        ) from None
    root = OmegaConf.structured(schema)
    for override in parsed:
        key = override.key_or_group
        if key.split("/")[0].split(".")[0] == "hydra" or override.package is not None:
            continue  # Hydra's own settings, or a package placement: Hydra checks those
        if override.is_delete():
            continue
        if (conf_dir / key).is_dir():
            _check_option(conf_dir, key, _values(override))
        else:
            node = _known_node(root, key, schema, conf_dir)
            if override.is_add() or override.is_force_add():
                continue  # `+key=value` of a known key: Hydra says it exists
            if node is not None:
                for value in _values(override):
                    _check_value(root, key, value, override.input_line or key)


def _values(override: Any) -> list[Any]:
    """The values an override sets: each of a discrete sweep's, or its one value. A range
    or interval sweep (an Optuna search space) is left to the sweeper."""
    if override.is_discrete_sweep():
        return list(override.sweep_iterator())
    if override.is_sweep_override():
        return []
    return [override.value()]


def _check_option(conf_dir: Path, group: str, values: list[Any]) -> None:
    options = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
    for value in values:
        if value is None or (isinstance(value, str) and value in options):
            continue
        near = difflib.get_close_matches(str(value), options, n=1)
        hint = f"did you mean {group}={near[0]}? " if near else ""
        raise ValueError(
            f"unknown option {group}={value}; {hint}({group} is one of: {', '.join(options)}; "
            f"the files in conf/{group}/)"
        )


def _known_node(root: DictConfig, key: str, schema: Any, conf_dir: Path) -> Any:
    """The schema node at dotted `key` (None below a free-form dict field, where any key
    goes); ValueError naming the first unknown part, with the nearest real names."""
    node: Any = root
    parts = key.split(".")
    if len(parts) == 2 and parts[0] == "model" and parts[1] in MOVED:
        raise ValueError(moved_message(parts[1]))
    for depth, part in enumerate(parts):
        if not isinstance(node, DictConfig):
            raise ValueError(f"unknown config key {key}: {'.'.join(parts[:depth])} has no keys")
        if OmegaConf.is_struct(node) is False and depth > 0:
            return None  # a free-form mapping (e.g. a launcher's extra settings)
        if part not in node:
            prefix = ".".join(parts[:depth])
            names = list(node.keys())
            if depth == 0:  # a top-level typo may mean a group as well as a key
                names += [p.name for p in conf_dir.iterdir() if p.is_dir() and p.name != "hydra"]
            near = difflib.get_close_matches(part, sorted(set(names)), n=1)
            guess = ".".join([*parts[:depth], near[0], *parts[depth + 1 :]]) if near else ""
            hint = f"; did you mean {guess}?" if near else ""
            where = f" (the keys of {prefix}: {_schema_name(schema, parts[:depth])})"
            raise ValueError(f"unknown config key {key}{hint}{where if not near else ''}")
        node = node._get_node(part)
    return node


def _schema_name(schema: Any, parts: list[str]) -> str:
    """The dataclass behind `parts` of `schema`, for an error naming where keys are defined."""
    cls = schema
    for part in parts:
        found = next((f for f in fields(cls) if f.name == part), None)
        factory = getattr(found, "default_factory", None)
        if found is None or not is_dataclass(factory):
            return "see --cfg job"
        cls = factory
    return f"the fields of {cls.__module__}.{cls.__name__}"


def _check_value(root: DictConfig, key: str, value: Any, shown: str) -> None:
    trial = root.copy()
    try:
        OmegaConf.update(trial, key, value, merge=True)
    except OmegaConfBaseException as e:
        reason = str(e).splitlines()[0]
        raise ValueError(f"bad value in {shown}: {reason}") from None


def _quoted(e: Exception) -> str:
    line = str(e).splitlines()[0]
    return line.removeprefix("Error parsing override ").strip()
