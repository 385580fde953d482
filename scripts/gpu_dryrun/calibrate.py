"""The estimate's constants, fitted to the steps measured on GPUs (docs/ledger.md).

    python -m scripts.gpu_dryrun.calibrate measure [ROW ...]   # each row's ledger, on its commit
    python -m scripts.gpu_dryrun.calibrate fit                 # the constants, and every row

`measure` counts each measured step the way it ran: on the commit it ran on (a git worktree in
a temporary folder, with this tree's ledger copied into its scripts/gpu_dryrun), at its size,
one GPU's share of the records' 8 (the whole optimizer, as scripts/bench/gpu.py measured then),
and the kind of step the measurement's median was. Each ledger goes to
scripts/gpu_dryrun/calibration/<row>.json (a few minutes to an hour each: inductor compiles the
preset for sm_90). `fit` reads those there, fits f, b and L (scripts/gpu_dryrun/estimate.py) to
all of them, prints every row's estimate beside its measurement and its leave-one-out estimate,
and writes the constants to scripts/gpu_dryrun/calibration.json, which `--ledger` uses.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FITTED = HERE / "calibration.json"
LEDGERS = HERE / "calibration"
# What the ledger needs in an older tree: these files of this one
CARRIED = ("fake_gpu.py", "host_cuda.cpp", "ledger.py", "measure.py")


@dataclass(frozen=True)
class Measured:
    """A step measured on a GPU (docs/gpu-proof.md): what ran, where, and its ms."""

    name: str
    commit: str
    gpu: str  # H100 | H200
    preset: str
    stage: int  # the stage (or window) index among scripts/bench/gpu.py's window_steps
    kind: str  # normal | adam: the kind of step the 5-step median landed on
    ms: float


MEASURED = [
    Measured("#89 stage 1", "8f07ec5", "H200", "record_2026_07_17", 0, "normal", 56.6),
    Measured("#89 stage 2", "8f07ec5", "H200", "record_2026_07_17", 1, "adam", 113.0),
    Measured("#89 stage 3", "8f07ec5", "H200", "record_2026_07_17", 2, "normal", 112.3),
    Measured("#21 window 1", "8f07ec5", "H200", "record_2025_01_26", 0, "adam", 87.3),
    Measured("#21 window 7", "8f07ec5", "H200", "record_2025_01_26", 1, "adam", 92.7),
    Measured("#21 window 14", "8f07ec5", "H200", "record_2025_01_26", 2, "adam", 98.2),
    Measured("dense 124M", "8f07ec5", "H200", "dense_124m", 0, "adam", 128.9),
    Measured("#9", "6d3f659", "H100", "record_2024_11_06", 0, "adam", 147.8),
]

DRIVER = """
import json, sys
from scripts.gpu_dryrun import fake_gpu
fake_gpu.install()
from scripts.bench import gpu
from scripts.gpu_dryrun.ledger import load_shim
from scripts.gpu_dryrun.measure import preset_ledgers
preset, stages, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
conf = gpu.compose(preset, "cuda", "full", [])
steps = preset_ledgers(gpu, conf, 1, stages, load_shim())
with open(out, "w") as f:
    json.dump([s.to_json() for s in steps], f)
"""


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def measure(rows: list[Measured]) -> None:
    """Each row's ledger on its commit (rows of one commit and preset share one run)."""
    from scripts.gpu_dryrun import fake_gpu

    shim = fake_gpu.build_shim()
    LEDGERS.mkdir(exist_ok=True)
    by_run: dict[tuple[str, str], list[Measured]] = {}
    for r in rows:
        by_run.setdefault((r.commit, r.preset), []).append(r)
    for (commit, preset), group in by_run.items():
        with tempfile.TemporaryDirectory(prefix=f"ledger-{commit}-") as tmp:
            tree = Path(tmp) / "tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                            commit], check=True, capture_output=True)  # fmt: skip
            try:
                carried = tree / "scripts" / "gpu_dryrun"  # not there before the dry run
                carried.mkdir(exist_ok=True)
                (carried / "__init__.py").touch()
                for name in CARRIED:
                    shutil.copy(HERE / name, carried / name)
                out = Path(tmp) / "steps.json"
                env = {**os.environ, "LD_PRELOAD": str(shim), "PYTHONPATH": str(tree)}
                stages = max(r.stage for r in group) + 1
                print(f"{commit} {preset}: {stages} stage(s) ...", flush=True)
                subprocess.run([sys.executable, "-c", DRIVER, preset, str(stages), str(out)],
                               cwd=tree, env=env, check=True)  # fmt: skip
                steps = json.loads(out.read_text())
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(tree)], check=False)  # fmt: skip
        starts = sorted({s["step"] for s in steps})
        for r in group:
            found = [s for s in steps if s["step"] == starts[r.stage] and s["kind"] == r.kind]
            if not found:
                kinds = sorted({(s["step"], s["kind"]) for s in steps})
                raise SystemExit(f"calibrate: {r.name}: no {r.kind} step at step "
                                 f"{starts[r.stage]} among those counted: {kinds}")  # fmt: skip
            step = found[0]
            path = LEDGERS / f"{slug(r.name)}.json"
            tmp_path = path.with_suffix(".tmp")
            tmp_path.write_text(json.dumps({"measured": r.__dict__, **step}))
            tmp_path.replace(path)
            print(f"  {r.name}: {path.relative_to(ROOT)}", flush=True)


def measured_rows(names: list[str] | None = None) -> list:
    """The calibration rows whose ledgers are here (those named, or all), as estimate.Row."""
    from scripts.gpu_dryrun.estimate import GPUS, Row, Terms
    from scripts.gpu_dryrun.ledger import Ledger

    rows = []
    for r in MEASURED:
        path = LEDGERS / f"{slug(r.name)}.json"
        if path.exists() and (not names or r.name in names):
            ledger = Ledger.from_json(json.loads(path.read_text())["launches"])
            rows.append(Row(r.name, Terms.of(ledger, GPUS[r.gpu]), r.ms))
    return rows


def fit_and_report(args_rows: list[str]) -> int:
    from scripts.gpu_dryrun.estimate import fit, leave_one_out

    rows = measured_rows(args_rows)
    if len(rows) < 4:
        raise SystemExit(
            f"calibrate fit: {len(rows)} of {len(MEASURED)} rows have a ledger in "
            f"{LEDGERS.relative_to(ROOT)}; measure at least 4 first "
            "(python -m scripts.gpu_dryrun.calibrate measure)"
        )
    c = fit(rows)
    loo = dict((r.name, ms) for r, ms in leave_one_out(rows))
    where = {m.name: m for m in MEASURED}
    print("| row | GPU, commit | step | launches | measured ms | estimate ms | ratio | "
          "leave-one-out ms | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        est, m = r.terms.seconds(c) * 1e3, where[r.name]
        print(f"| {r.name} | {m.gpu}, {m.commit} | {m.kind} | {r.terms.launches:,} | "
              f"{r.measured_ms:.1f} | {est:.1f} | {est / r.measured_ms:.2f} | "
              f"{loo[r.name]:.1f} | {loo[r.name] / r.measured_ms:.2f} |")  # fmt: skip
    worst = max(abs(loo[r.name] / r.measured_ms - 1) for r in rows)
    print(f"\nLeave-one-out: every row within {worst:.0%} of its measurement.")
    print(f"\nConstants: {c}")
    tmp = FITTED.with_suffix(".tmp")  # whole or not at all: a fit cut short keeps the last one
    tmp.write_text(json.dumps({"constants": c.__dict__, "rows": [r.name for r in rows]},
                              indent=1) + "\n")  # fmt: skip
    tmp.replace(FITTED)
    return 0


def constants() -> "object":
    """The fitted constants (calibration.json), else a first guess (f 0.6, b 0.7, L 4 µs)."""
    from scripts.gpu_dryrun.estimate import Constants

    if FITTED.exists():
        c = json.loads(FITTED.read_text())["constants"]
        return Constants(c["flop_share"], c["bandwidth_share"], c["launch_us"])
    return Constants(0.6, 0.7, 4.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["measure", "fit"])
    p.add_argument("rows", nargs="*", help="rows to measure or fit to, by name (default: all)")
    args = p.parse_args()
    names = {r.name for r in MEASURED}
    if unknown := [n for n in args.rows if n not in names]:
        raise SystemExit(f"calibrate: no row {unknown[0]!r}; rows: {', '.join(sorted(names))}")
    if args.what == "fit":
        return fit_and_report(args.rows)
    measure([r for r in MEASURED if not args.rows or r.name in args.rows])
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
