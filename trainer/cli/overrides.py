"""The command line's overrides, checked before Hydra composes them.

Hydra reports a mistyped key (`train.step=10`), a missing group option (`model=tiny2`) or a
value of the wrong type (`train.steps=abc`) in a block of lines that, for the first, suggests
the wrong fix (`+train.step=10`, a key the schema would then reject). This module checks every
override against the config schema and the option files under `conf/` first, and raises one
ValueError naming the key or option and the names meant: the nearest in the same group, else
a key of that name in another group (`train.lr`: optim.muon.lr, optim.adamw.head_lr, ...) and
the group's own keys. Two of Hydra's commands at once (`-m ... --cfg hydra`) fail the same way,
where Hydra would show a traceback. It imports no torch, so a typo fails in well under a
second. What it cannot judge (Hydra's own `hydra.*` keys, a package-qualified override, a
config from another directory) it leaves to Hydra.
"""

import argparse
import difflib
import re
import shlex
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from trainer.cli.keys import known_key, listed, row_key

# Hydra's command-line flags that point it at other configs: their overrides mean something
# this module cannot see.
ELSEWHERE = ("config_path", "config_name", "config_dir", "experimental_rerun")

# Hydra's flags that each say what a launch does (attribute: flag, what it does). Hydra does
# one per launch and answers two with a bare ValueError and its traceback.
COMMANDS = {
    "multirun": ("-m", "run a sweep"),
    "run": ("--run", "run one job"),
    "cfg": ("--cfg", "print a run's config"),
    "info": ("--info", "describe a run's config"),
    "shell_completion": ("--shell-completion", "shell completion"),
}


def check_command_line(argv: list[str], conf_dir: Path, schema: Any) -> None:
    """Raise ValueError for the first override in `argv` (train.py's arguments) that names an
    unknown key or group option, or gives a value the key's type rejects, for flags Hydra
    would refuse with a traceback, and for a single run's config that does not compose (or,
    for a run, does not validate)."""
    # Private, as Hydra 1.3 has no public parser for its flags: hydra.main parses sys.argv with
    # this one (hydra/main.py), so `-m`, `--cfg hydra`, an abbreviated `--multi` and the
    # overrides read here exactly as the run reads them; a copy of its 15 flags would drift.
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)  # a bad flag: argparse's usage line, exit 2
    if any(getattr(args, name, None) for name in ELSEWHERE):
        return
    check_overrides(args.overrides, conf_dir, schema)
    _check_commands(args, argv)
    if not (args.multirun or args.cfg or args.info or args.help or args.hydra_help):
        compose_and_validate(args.overrides, conf_dir)
    elif args.cfg or args.info:  # they show one run's config as composed, valid or not
        compose_run(args.overrides, conf_dir)


def _check_commands(args: argparse.Namespace, argv: list[str]) -> None:
    """Raise ValueError, naming the flags and the fix, where Hydra would raise a bare error
    and its traceback: --help or --hydra-help with a sweep (Hydra composes one run's config
    for the help), --resolve without --cfg, two commands at once (`-m ... --cfg hydra`: --cfg
    and --info show one run's config, as a sweep's first job has)."""
    if args.help or args.hydra_help:
        flag = "--help" if args.help else "--hydra-help"
        if swept := [w for w in args.overrides if _first_value(w) != w]:
            job = _first_job(argv, args.overrides)
            fix = f"for the sweep's first job: {job}" if job else "give each swept key one value"
            raise ValueError(f"{flag} describes one run's config, and {swept[0]} is a sweep; {fix}")
    if args.resolve and args.cfg is None:  # with --help too: run_dir's ${hydra:...} is unset
        raise ValueError("--resolve resolves what --cfg prints: add --cfg job, or drop --resolve")
    given = [name for name in COMMANDS if getattr(args, name) not in (None, False)]
    if args.help or args.hydra_help or len(given) < 2:
        return
    flags = [COMMANDS[n][0] + (f" {args.cfg}" if n == "cfg" else "") for n in given]
    named = listed([f"{flag} ({COMMANDS[n][1]})" for flag, n in zip(flags, given, strict=True)])
    problem = f"{named} are separate commands, and Hydra does one per launch"
    if not (args.multirun and (args.cfg or args.info)):
        raise ValueError(f"{problem}: give one")
    job = _first_job(argv, args.overrides)
    if job is None:
        raise ValueError(f"{problem}; drop -m and give each swept key one value")
    swept = any(_first_value(w) != w for w in args.overrides)
    which = "for the sweep's first job" if swept else "without -m"
    raise ValueError(f"{problem}; {which}: {job}")


def _first_job(argv: list[str], overrides: list[str]) -> str | None:
    """The command line `argv` without -m, each sweep at its first value: its first job's
    (None where a sweep has no first value: a glob, an interval)."""
    words = [w for w in argv if not (w == "-m" or (len(w) > 2 and "--multirun".startswith(w)))]
    first = [_first_value(w) if w in overrides else w for w in words]
    return None if None in first else shlex.join(["python", "train.py", *first])


def _first_value(word: str) -> str | None:
    """The override `word` with a discrete sweep's first value (`seed=0,1`: `seed=0`); None
    for a sweep with no first value (a glob, an interval)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    (override,) = OverridesParser.create().parse_overrides([word])
    if not override.is_sweep_override():
        return word
    if not override.is_discrete_sweep() or isinstance(override.value(), Glob):
        return None
    return f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}"


def compose_and_validate(overrides: list[str], conf_dir: Path) -> None:
    """Compose the config of a single run (no -m) as Hydra will, refuse what only a multirun
    does, and validate every value, before Hydra makes the run directory: a config that can
    never start leaves nothing behind, and Hydra's or OmegaConf's error composing it is one
    line. (A sweep's jobs are each validated when they start.)

    The composition is one of three per launch, and the only one that can come first:
    hydra.main composes twice itself (for hydra.mode, then the run's config), takes no config
    composed before, and calls a callback's on_run_start only after both compositions, whose
    errors it prints as blocks of lines. It costs about 0.4 s in a fresh process (0.2 s warm)."""
    from trainer.config import to_config

    cfg = compose_run(overrides, conf_dir)
    with open_dict(cfg):
        hydra_cfg = cfg.pop("hydra")
    refuse_multirun_only(hydra_cfg, overrides, conf_dir)
    cfg.run_dir = "."  # Hydra's output directory does not exist yet
    try:
        to_config(cfg)
    except OmegaConfBaseException as e:  # an interpolation that does not resolve
        raise ValueError(_one_line(e)) from e


def compose_run(overrides: list[str], conf_dir: Path) -> DictConfig:
    """The config of a single run as Hydra composes it, its `hydra` node included; Hydra's or
    OmegaConf's error composing it as a one-line ValueError."""
    from hydra.errors import HydraException

    from trainer.config import Config

    try:
        return _compose(overrides, conf_dir)
    except (HydraException, OmegaConfBaseException) as e:
        root = OmegaConf.structured(Config)
        raise ValueError(_composition_error(e, root, conf_dir, overrides)) from e


def compose_config(overrides: list[str], conf_dir: Path) -> DictConfig:
    """The config `python train.py <overrides>` runs, without its `hydra` node: how the tools
    and the tests compose a run (Hydra's errors as Hydra raises them)."""
    cfg = _compose(overrides, conf_dir)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def _compose(overrides: list[str], conf_dir: Path) -> DictConfig:
    from hydra import compose, initialize_config_dir

    from stages.table import refuse_rows_under_columns
    from trainer.config import register_configs

    register_configs()  # the schema Hydra checks the YAML against (idempotent)
    # On exit Hydra's global state is as before, as hydra.main needs it.
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    refuse_rows_under_columns(overrides, cfg.train.stages.columns)
    return cfg


def _composition_error(e: Exception, root: DictConfig, conf_dir: Path, overrides: list[str]) -> str:
    """Hydra's error composing the config as one line. A key that a config file (an
    experiment of one's own) sets and the schema lacks is named as on the command line, with
    the keys meant; a row past the end of a list of rows, with the rows there are."""
    cause = e.__cause__ or e.__context__  # OmegaConf's error, which Hydra raised its own from
    key = getattr(cause, "full_key", None)
    if isinstance(cause, ConfigKeyError) and key and not key.startswith("hydra."):
        source = re.match(r"In '([^']+)'", str(e))  # Hydra names the file it was merging
        path = conf_dir / f"{source.group(1)}.yaml" if source else None
        try:
            known_key(root, key, conf_dir)
        except ValueError as unknown:
            where = f"the config file {path}" if path and path.is_file() else "a config file"
            return f"{unknown}, in {where}"
    override = re.match(r"Error merging override (.+)", str(e))  # its whole first line
    row = re.search(r"full_key: (\S+)\[(\d+)\]", str(cause))
    if override and row and row_key(root, f"{row.group(1)}.{row.group(2)}"):
        return _no_such_row(override.group(1), row.group(1), int(row.group(2)), overrides, conf_dir)
    return _one_line(e)


def _no_such_row(override: str, rows: str, index: int, overrides: list[str], conf_dir: Path) -> str:
    """The error for `override`, which sets row `index` of the list of rows `rows` past its
    end: how many rows the list has and how to add one (OmegaConf grows no list by index)."""
    count = _row_count(rows, overrides, conf_dir)
    if count is None:  # the other overrides do not compose either: that error comes next
        has = f"has no row {index} (rows count from 0)"
    else:
        shown = {0: "no rows", 1: "1 row (0)"}.get(count, f"{count} rows (0..{count - 1})")
        has = f"has {shown}"
    add = f"to add rows, give the whole list: '{rows}=[{{...}}, ...]'"
    return f"cannot set {override}: {rows} {has}; {add}"


def _row_count(rows: str, overrides: list[str], conf_dir: Path) -> int | None:
    """How many rows the list `rows` holds once `overrides` are applied, composed without the
    ones that set a row by index (they cannot change the count, and one of them failed); None
    where that does not compose."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parsed = OverridesParser.create().parse_overrides(overrides)
    others = [
        line
        for line, o in zip(overrides, parsed, strict=True)
        if o.is_delete() or not o.key_or_group.startswith(f"{rows}.")
    ]
    try:
        found = OmegaConf.select(_compose(others, conf_dir), rows)
    except (HydraException, OmegaConfBaseException):
        return None
    return len(found) if isinstance(found, ListConfig) else None


def _one_line(e: Exception) -> str:
    """An OmegaConf or Hydra message on one line: its own lines, less OmegaConf's indented
    details, and the key it concerns where they named it."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip() and not x.startswith("    ")]
    key = getattr(e, "full_key", None) or getattr(e.__cause__, "full_key", None)
    text = " ".join(lines)
    return f"{text} ({key})" if key and key not in text else text


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
        elif known_key(root, key, conf_dir):
            if override.is_add() or override.is_force_add():
                continue  # `+key=value` of a known key: Hydra says it exists
            for value in _values(override):
                _check_value(root, key, value, override.input_line or key)


def _values(override: Any) -> list[Any]:
    """The values an override sets: each of a discrete sweep's, or its one value. A glob
    (Hydra matches it against the options) or an interval (an Optuna search space) is left to
    Hydra and the sweeper."""
    from hydra.core.override_parser.types import Glob

    if isinstance(override.value(), Glob) or (
        override.is_sweep_override() and not override.is_discrete_sweep()
    ):
        return []
    if override.is_discrete_sweep():
        return list(override.sweep_iterator())
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


def _check_value(root: DictConfig, key: str, value: Any, shown: str) -> None:
    trial = root.copy()
    if row := row_key(root, key):  # a row of a list (train.stages.rows.0...): its dataclass's
        trial, key = OmegaConf.structured(row[0]), row[1]
    try:
        if not key:
            trial = OmegaConf.merge(trial, value)
        else:
            OmegaConf.update(trial, key, value, merge=True)
    except OmegaConfBaseException as e:
        reason = str(e).splitlines()[0]
        raise ValueError(f"bad value in {shown}: {reason}") from None


def _quoted(e: Exception) -> str:
    line = str(e).splitlines()[0]
    return line.removeprefix("Error parsing override ").strip()
