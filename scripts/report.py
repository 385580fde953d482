"""Group runs by config (ignoring the seed) and report final validation losses against a target.

    python scripts/report.py multirun/2026-11-23/10-00-00
    python scripts/report.py multirun/seeds --target 3.28 --format csv

For each group of runs whose overrides differ only in `seed`: n, mean, standard deviation
(n - 1) and minimum of the final val loss, how many reached the target and their mean train
time to it (evaluation excluded, as records time it), and, for n >= 2, the statistics a
speedrun record claim needs: the one-sided p-value of a one-sample t-test that the mean is
below the target (scipy's `ttest_1samp`, alternative="less") and (target - mean) * sqrt(n).
"""

import argparse
import csv
import io
import math
import statistics
import sys
from pathlib import Path

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from scripts.runs import Run, differing_overrides, find_runs, label

COLUMNS = [
    "group", "n", "mean", "std", "min", "reached", "time_to_target_s", "p_value", "margin_sqrt_n",
]  # fmt: skip


def target_stats(losses: list[float], target: float) -> tuple[float | None, float]:
    """(one-sided p-value that the mean is below `target`, (target - mean) * sqrt(n))."""
    n = len(losses)
    margin = (target - statistics.fmean(losses)) * math.sqrt(n)
    if n < 2:
        return None, margin
    if statistics.pstdev(losses) == 0:  # t is infinite; scipy warns and returns nan
        return (0.0 if margin > 0 else 1.0), margin
    return float(stats.ttest_1samp(losses, target, alternative="less").pvalue), margin


def summarize(runs: list[Run], target: float) -> list[dict]:
    """One row per group of runs that differ only in their seed."""
    keys = differing_overrides(runs, ignore=("seed",))
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(label(run, keys) if keys else "all runs", []).append(run)
    rows = []
    for name, members in groups.items():
        losses = [r.final_val_loss() for r in members if r.final_val_loss() is not None]
        if not losses:
            continue
        times = [t for t in (r.time_to(target) for r in members) if t is not None]
        p, margin = target_stats(losses, target)
        rows.append(
            {
                "group": name,
                "n": len(losses),
                "mean": statistics.fmean(losses),
                "std": statistics.stdev(losses) if len(losses) > 1 else None,
                "min": min(losses),
                "reached": len(times),
                "time_to_target_s": statistics.fmean(times) if times else None,
                "p_value": p,
                "margin_sqrt_n": margin,
            }
        )
    return rows


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-3 and value else f"{value:.4f}"
    return str(value)


def render(rows: list[dict], fmt: str = "markdown") -> str:
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join("| " + " | ".join(_fmt(r[c]) for c in COLUMNS) + " |\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="run or multirun directories")
    parser.add_argument("--target", type=float, default=3.28, help="val loss target (3.28)")
    parser.add_argument("--format", choices=["markdown", "csv"], default="markdown")
    args = parser.parse_args(argv)
    print(render(summarize(find_runs(args.paths), args.target), args.format), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
