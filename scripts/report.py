"""Group runs by config (ignoring the seed) and report final validation losses against a target.

    python scripts/report.py multirun/2026-11-23/10-00-00
    python scripts/report.py multirun/seeds --target 3.28 --format csv

For each group of runs whose overrides differ only in `seed`: n, mean, standard deviation
(n - 1) and minimum of the final val loss, how many reached the target and their mean train
time to it (evaluation excluded, as records time it), and, for n >= 2, the statistics a
speedrun record claim needs: the one-sided p-value of a one-sample t-test that the mean is
below the target (scipy's `ttest_1samp`, alternative="less") and (target - mean) * sqrt(n).

Only finished runs count: their last validation loss is at the planned `train.steps` of the
run's own `.hydra/config.yaml`, or reached `train.target_val_loss`. The rest are listed as
skipped, each with why (e.g. "last validation at step 0 of 2; step 2 ran but its validation
did not finish"). The record target (3.28; 2.92 for the GPT-2 Medium track, each run's
train.reference.target) is a FineWeb val loss, so it is the default only when every run
trains on FineWeb and they agree on it; otherwise give `--target` or get the table without
the target test. Notes go to stderr, so the table on stdout stays clean for `--format csv`.
"""

import argparse
import csv
import io
import math
import statistics
import sys
from pathlib import Path

from omegaconf import DictConfig
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from scripts.runs import HYDRA_CONFIG, METRICS, Run, differing_overrides, find_runs, label

COLUMNS = [
    "group", "n", "mean", "std", "min", "reached", "time_to_target_s", "p_value", "margin_sqrt_n",
]  # fmt: skip
RECORD_TARGET = 3.28  # the FineWeb val loss that GPT-2 (124M) speedrun records must reach


def _log_says_done(run: Run) -> bool:
    """The trainer's last log line starts with "done:" only when the training loop ended."""
    log = Path(run.name) / "train.log"
    lines = log.read_text().splitlines() if log.is_file() else []
    return bool(lines) and "done:" in lines[-1]


def unfinished_reason(run: Run) -> str | None:
    """Why `run` does not count as finished, e.g. "last validation at step 3 of 8" (None: it
    is finished). Finished means a validation loss at the planned last step, `train.steps` of
    the run's own config, or one that reached `train.target_val_loss`: the last record's step
    alone is not enough, since a run stopped during its final evaluation logs that step's
    record without a validation loss."""
    if run.unreadable:
        return run.unreadable
    if not run.records:
        return f"{METRICS} is empty"
    reached = run.records[-1].get("step")
    points = run.val_points()
    if not points:
        return f"no validation loss (the records reach step {reached})"
    last = points[-1]
    if last.get("target_reached"):
        return None
    planned, step = run.planned_steps(), last.get("step")
    if planned is None and run.config is not None:
        return f"planned steps unknown: {HYDRA_CONFIG} has no integer train.steps"
    if planned is None:
        # Without a config the planned length is unknown; the log is the only other witness.
        if _log_says_done(run) and last is run.records[-1]:
            return None
        return (
            f"planned steps unknown: no {HYDRA_CONFIG} and train.log does not end in 'done:' "
            f"(last validation at step {step}, records reach step {reached})"
        )
    if step == planned:
        return None
    why = f"last validation at step {step} of {planned}"
    if reached == planned:
        return f"{why}; step {planned} ran but its validation did not finish"
    return f"{why}; the records stop at step {reached}" if reached != step else why


def split_finished(runs: list[Run]) -> tuple[list[Run], list[tuple[Run, str]]]:
    """(finished runs, [(unfinished run, why)]) in the given order."""
    finished, unfinished = [], []
    for run in runs:
        why = unfinished_reason(run)
        if why is None:
            finished.append(run)
        else:
            unfinished.append((run, why))
    return finished, unfinished


def skipped_note(unfinished: list[tuple[Run, str]]) -> str:
    """A heading line, then one line per skipped run: where it is and why it does not count."""
    n = len(unfinished)
    head = f"skipped {n} unfinished run{'s' if n != 1 else ''}, not in the statistics:"
    return "\n".join([head, *(f"  {run.name}: {why}" for run, why in unfinished)])


def data_source(config: DictConfig | None) -> str:
    """ "fineweb", or what else the run trained on ("sample", "synthetic", "shards at DIR")."""
    if config is None:
        return "unknown (no .hydra/config.yaml)"
    data = config.get("data") or {}
    source = data.get("source", "sample")  # the schema's default corpus
    if source != "shards":
        return str(source)
    where = f"{data.get('dir', '')} {data.get('train_files', '')}"
    return "fineweb" if "fineweb" in where.lower() else f"shards at {data.get('dir')}"


def run_target(config: DictConfig | None) -> float:
    """The target a run's own config names (train.reference.target: 2.92 for the GPT-2
    Medium track's preset), else the short track's 3.28."""
    reference = ((config or {}).get("train") or {}).get("reference") or {}
    return float(reference.get("target", RECORD_TARGET))


def default_target(runs: list[Run]) -> tuple[float | None, str | None]:
    """(the record target, or None when it would mean nothing, and why in one line): the runs'
    own train.reference.target where they train on FineWeb and agree on one."""
    others = sorted({s for s in (data_source(r.config) for r in runs) if s != "fineweb"})
    targets = sorted({run_target(r.config) for r in runs})
    if not others and len(targets) == 1:
        return targets[0], None
    if not others:
        return None, (
            f"no target test: these runs aim at different targets ({targets}, "
            "train.reference.target); give --target to test against one"
        )
    return None, (
        f"no target test: {', '.join(f'{t:g}' for t in targets)} is a FineWeb val loss and "
        f"these runs train on {', '.join(others)}; give --target to test against one"
    )


def target_stats(losses: list[float], target: float) -> tuple[float | None, float]:
    """(one-sided p-value that the mean is below `target`, (target - mean) * sqrt(n))."""
    n = len(losses)
    margin = (target - statistics.fmean(losses)) * math.sqrt(n)
    if n < 2:
        return None, margin
    if statistics.pstdev(losses) == 0:  # t is infinite; scipy warns and returns nan
        return (0.0 if margin > 0 else 1.0), margin
    return float(stats.ttest_1samp(losses, target, alternative="less").pvalue), margin


def summarize(runs: list[Run], target: float | None) -> list[dict]:
    """One row per group of runs that differ only in their seed; give finished runs only
    (see `split_finished`). With no target the target columns stay empty."""
    keys = differing_overrides(runs, ignore=("seed",))
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(label(run, keys) if keys else "all runs", []).append(run)
    rows = []
    for name, members in groups.items():
        losses = [r.final_val_loss() for r in members if r.final_val_loss() is not None]
        if not losses:
            continue
        row = {
            "group": name,
            "n": len(losses),
            "mean": statistics.fmean(losses),
            "std": statistics.stdev(losses) if len(losses) > 1 else None,
            "min": min(losses),
            **dict.fromkeys(COLUMNS[5:]),
        }
        if target is not None:
            times = [t for t in (r.time_to(target) for r in members) if t is not None]
            p, margin = target_stats(losses, target)
            row |= {
                "reached": len(times),
                "time_to_target_s": statistics.fmean(times) if times else None,
                "p_value": p,
                "margin_sqrt_n": margin,
            }
        rows.append(row)
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
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help=f"val loss target (default {RECORD_TARGET} when every run trains on FineWeb)",
    )
    parser.add_argument("--format", choices=["markdown", "csv"], default="markdown")
    args = parser.parse_args(argv)
    finished, unfinished = split_finished(find_runs(args.paths))
    if unfinished:
        print(skipped_note(unfinished), file=sys.stderr)
    if not finished:
        print("no finished runs to report: every run stopped early", file=sys.stderr)
        return 1
    target = args.target
    if target is None:
        target, why = default_target(finished)
        if why:
            print(why, file=sys.stderr)
    print(render(summarize(finished, target), args.format), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
