"""Check that training still computes what it computed: losses against a recorded curve.

    python scripts/check_baseline.py                        # run both recorded runs, compare
    python scripts/check_baseline.py --only "1 rank"        # just `python train.py`
    python scripts/check_baseline.py --run-dir outputs/x --only "1 rank"   # an existing run

`scripts/baselines/default_run.json` holds the losses of the default run (`python train.py`,
200 steps) and of the same run on 2 ranks (`dist.nproc=2`), with the machine they were
recorded on. A refactor that must not change the numbers is checked by running them again:
every train and val loss of every step must be bit for bit the recorded one. Floating-point
results depend on the CPU, the torch build and the thread count, so on another machine the
script reports the largest difference instead and passes within `--tolerance`.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "scripts" / "baselines" / "default_run.json"
Curve = list[list]  # [step, train loss or None, val loss or None] per record


def machine() -> dict:
    """What floating-point results depend on, beyond the code: torch, CPU, threads."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    ) if Path("/proc/cpuinfo").exists() else "unknown"  # fmt: skip
    return {
        "torch": torch.__version__,
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "native_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def curve(run_dir: Path) -> Curve:
    """(step, train loss, val loss) of every record in a run's metrics.jsonl."""
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [[r["step"], r.get("train_loss"), r.get("val_loss")] for r in records]


def compare(got: Curve, want: Curve) -> tuple[bool, float]:
    """(bitwise equal, largest absolute difference) of two curves with the same steps."""
    if [r[0] for r in got] != [r[0] for r in want]:
        raise ValueError(f"steps differ: {[r[0] for r in got]} vs {[r[0] for r in want]}")
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        for x, y in zip(a[1:], b[1:], strict=True):
            if (x is None) != (y is None):
                return False, float("inf")
            if x is not None:
                worst = max(worst, abs(x - y))
    return got == want, worst


def run(overrides: list[str], run_dir: Path) -> None:
    cmd = [sys.executable, "train.py", *overrides, f"hydra.run.dir={run_dir}"]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, default=BASELINE)
    p.add_argument("--only", help="one recorded run by name (default: all)")
    p.add_argument("--run-dir", type=Path, help="compare this finished run instead of running")
    p.add_argument("--tolerance", type=float, default=1e-3, help="on another machine")
    args = p.parse_args()
    baseline = json.loads(args.baseline.read_text())
    same_machine = baseline["machine"] == machine()
    names = [args.only] if args.only else list(baseline["runs"])
    ok = True
    for name in names:
        want = baseline["runs"][name]
        if args.run_dir:
            got = curve(args.run_dir)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                run(want["overrides"], Path(tmp))
                got = curve(Path(tmp))
        equal, worst = compare(got, want["losses"])
        good = equal if same_machine else worst <= args.tolerance
        ok &= good
        verdict = "bitwise equal" if equal else f"max |diff| {worst:.3g}"
        print(f"{name}: {len(got)} records, {verdict} ({'ok' if good else 'FAILED'})")
    if not same_machine:
        print(f"(recorded on {baseline['machine']}; this is {machine()}: tolerance applies)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
