"""Reading finished runs for the curve tools: metrics, overrides, reference curves.

A run is a directory holding `metrics.jsonl` (and, under Hydra, `.hydra/overrides.yaml`). A
directory without one is searched one level down, so a multirun directory stands for its
numbered jobs. Reference curves are the CSV files in `scripts/reference/`.
"""

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
REFERENCE_TOKENS_PER_STEP = 524_288  # every reference run: 8 x 64 x 1024


@dataclass
class Run:
    name: str
    records: list[dict]
    overrides: dict[str, str] = field(default_factory=dict)
    tokens_per_step: int | None = None  # known for reference curves only

    def val_points(self) -> list[dict]:
        return [r for r in self.records if r.get("val_loss") is not None]

    def final_val_loss(self) -> float | None:
        points = self.val_points()
        return points[-1]["val_loss"] if points else None

    def time_to(self, target: float) -> float | None:
        """Train time in seconds at the first evaluation at or below `target` (None: never)."""
        for r in self.val_points():
            if r["val_loss"] <= target and r.get("train_time_ms") is not None:
                return r["train_time_ms"] / 1000
        return None


def load_run(run_dir: Path) -> Run:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    overrides = {}
    hydra_overrides = run_dir / ".hydra" / "overrides.yaml"
    if hydra_overrides.is_file():
        for item in yaml.safe_load(hydra_overrides.read_text()) or []:
            key, _, value = str(item).partition("=")
            overrides[key.lstrip("+~")] = value
    return Run(name=str(run_dir), records=records, overrides=overrides)


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Every run under `paths`: a run directory itself, or the runs one level below it."""
    runs = []
    for p in map(Path, paths):
        if (p / "metrics.jsonl").is_file():
            runs.append(load_run(p))
            continue
        jobs = [d for d in p.iterdir() if (d / "metrics.jsonl").is_file()] if p.is_dir() else []
        if not jobs:
            raise FileNotFoundError(f"{p} holds no metrics.jsonl, nor do its subdirectories")
        # Numbered multirun jobs in numeric order (10 after 9).
        jobs.sort(
            key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name)
        )
        runs.extend(load_run(d) for d in jobs)
    return runs


def _job_order(d: Path) -> tuple[bool, int, str]:
    """Numbered multirun jobs in numeric order (10 after 9), then other names."""
    return (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name)


def reference_names() -> list[str]:
    return sorted(p.stem for p in REFERENCE_DIR.glob("*.csv"))


def load_reference(name: str) -> Run:
    """A reference curve by file stem (see scripts/reference/README.md) or CSV path."""
    path = Path(name) if name.endswith(".csv") else REFERENCE_DIR / f"{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no reference curve {name!r}; known: {reference_names()}")
    rows = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    records = []
    per_step = REFERENCE_TOKENS_PER_STEP  # unless the file has a tokens column
    for row in csv.DictReader(rows):
        rec = {"step": int(row["step"]), "val_loss": float(row["val_loss"])}
        if row.get("tokens"):
            rec["tokens"] = int(row["tokens"])
            per_step = rec["tokens"] // rec["step"] if rec["step"] else per_step
        else:
            rec["tokens"] = rec["step"] * REFERENCE_TOKENS_PER_STEP
        if row.get("train_time_ms"):
            rec["train_time_ms"] = float(row["train_time_ms"])
        records.append(rec)
    return Run(name=path.stem, records=records, tokens_per_step=per_step)


def differing_overrides(runs: list[Run], ignore: tuple[str, ...] = ()) -> list[str]:
    """The override keys whose values are not the same in every run (in first-seen order)."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.overrides if k not in keys and k not in ignore]
    return [k for k in keys if len({run.overrides.get(k) for run in runs}) > 1]


def label(run: Run, keys: list[str]) -> str:
    shown = [f"{k}={run.overrides.get(k, '-')}" for k in keys]
    return " ".join(shown) if shown else Path(run.name).name
