"""Reading runs for the curve tools: metrics, Hydra config and overrides, reference curves.

A run is a directory holding `metrics.jsonl` or, under Hydra, `.hydra/config.yaml`. A
directory that is neither is searched one level down, so a multirun directory stands for its
numbered jobs, including a job that stopped before its first record. Reference curves are
the CSV files in `scripts/reference/`.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from omegaconf import DictConfig, OmegaConf

from trainer.reference import curve_names, load_curve

METRICS = "metrics.jsonl"
HYDRA_CONFIG = Path(".hydra") / "config.yaml"
HYDRA_OVERRIDES = Path(".hydra") / "overrides.yaml"


@dataclass
class Run:
    name: str
    records: list[dict]
    overrides: dict[str, str] = field(default_factory=dict)
    tokens_per_step: int | None = None  # known for reference curves only
    config: DictConfig | None = None  # the job's composed config; None outside Hydra
    unreadable: str | None = None  # why metrics.jsonl is missing or cut short (None: read)

    def val_points(self) -> list[dict]:
        return [r for r in self.records if r.get("val_loss") is not None]

    def final_val_loss(self) -> float | None:
        points = self.val_points()
        return points[-1]["val_loss"] if points else None

    def planned_steps(self) -> int | None:
        """`train.steps` of the run's own config (None: no config, or no such key)."""
        if self.config is None:
            return None
        steps = OmegaConf.select(self.config, "train.steps", throw_on_resolution_failure=False)
        return steps if isinstance(steps, int) else None

    def time_to(self, target: float) -> float | None:
        """Train time in seconds at the first evaluation at or below `target` (None: never)."""
        for r in self.val_points():
            if r["val_loss"] <= target and r.get("train_time_ms") is not None:
                return r["train_time_ms"] / 1000
        return None


def _read_metrics(path: Path) -> tuple[list[dict], str | None]:
    """The records of `path`, and why they are incomplete (None: all of them read)."""
    if not path.is_file():
        return [], f"no {METRICS}"
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            # A process killed mid-write leaves a partial last line; the records before it
            # still draw a curve, and the report lists the run as unfinished.
            return records, f"{METRICS} line {number} is not JSON ({err.msg})"
    return records, None


def parse_overrides(lines: list[str]) -> dict[str, str]:
    """Hydra's own parser, so that `lr=1e-2` and `lr=0.01` are one value and `+k=v`, `~k`,
    `k@pkg=v` and quoted values read as Hydra read them. Values are Hydra's text for them."""
    parsed = {}
    for o in OverridesParser.create().parse_overrides([str(line) for line in lines]):
        key = o.key_or_group + (f"@{o.package}" if o.package else "")
        deleted = o.type == OverrideType.DEL
        parsed[key] = "(deleted)" if deleted else o.get_value_element_as_str()
    return parsed


def load_run(run_dir: Path) -> Run:
    records, unreadable = _read_metrics(run_dir / METRICS)
    config = OmegaConf.load(run_dir / HYDRA_CONFIG) if (run_dir / HYDRA_CONFIG).is_file() else None
    overrides_file = run_dir / HYDRA_OVERRIDES
    overrides = (
        parse_overrides(list(OmegaConf.load(overrides_file))) if overrides_file.is_file() else {}
    )
    return Run(str(run_dir), records, overrides, config=config, unreadable=unreadable)


def is_run(path: Path) -> bool:
    return (path / METRICS).is_file() or (path / HYDRA_CONFIG).is_file()


def _job_order(d: Path) -> tuple[bool, int, str]:
    """Numbered multirun jobs in numeric order (10 after 9), then other names."""
    return (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name)


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Every run under `paths`: a run directory itself, or the runs one level below it."""
    runs = []
    for p in map(Path, paths):
        if is_run(p):
            runs.append(load_run(p))
            continue
        jobs = sorted((d for d in p.iterdir() if is_run(d)), key=_job_order) if p.is_dir() else []
        if not jobs:
            raise FileNotFoundError(
                f"{p} holds no run: neither it nor its subdirectories have {METRICS} or "
                f"{HYDRA_CONFIG}; give a run or multirun directory"
            )
        runs.extend(load_run(d) for d in jobs)
    return runs


def reference_names() -> list[str]:
    return curve_names()


def load_reference(name: str) -> Run:
    """A reference curve by file stem (see scripts/reference/README.md) or CSV path."""
    try:
        curve = load_curve(name)
    except ValueError as e:
        raise FileNotFoundError(f"no reference curve {name!r}; known: {reference_names()}") from e
    records = []
    for step, tokens, loss, ms in zip(
        curve.steps, curve.tokens, curve.val_loss, curve.train_time_ms, strict=True
    ):
        rec = {"step": step, "val_loss": loss, "tokens": tokens}
        if ms is not None:
            rec["train_time_ms"] = ms
        records.append(rec)
    return Run(name=curve.name, records=records, tokens_per_step=curve.tokens_per_step)


def differing_overrides(runs: list[Run], ignore: tuple[str, ...] = ()) -> list[str]:
    """The override keys whose values are not the same in every run (in first-seen order)."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.overrides if k not in keys and k not in ignore]
    return [k for k in keys if len({run.overrides.get(k) for run in runs}) > 1]


def label(run: Run, keys: list[str]) -> str:
    shown = [f"{k}={run.overrides.get(k, '-')}" for k in keys]
    return " ".join(shown) if shown else Path(run.name).name
