"""Overlay validation (and optionally training) loss curves of runs and reference records.

    python scripts/plot_curves.py multirun/2026-11-23/10-00-00            # every job of a sweep
    python scripts/plot_curves.py outputs/a outputs/b --train --out ab.png
    python scripts/plot_curves.py outputs/fineweb --reference all --x tokens

Each path is a run directory (with metrics.jsonl) or a directory of runs (a multirun). Runs
are labelled by the overrides whose values differ between them (their directory name when
none do). `--reference` adds public records' curves from scripts/reference/ ("all" for
every one). The x axis is the step, the training tokens, or the train time in seconds.
"""

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from scripts.runs import (
    Run,
    differing_overrides,
    find_runs,
    label,
    load_reference,
    reference_names,
)

X_AXES = {"step": "step", "tokens": "tokens", "time": "train time (s)"}


def _x(record: dict, axis: str) -> float | None:
    if axis == "time":
        ms = record.get("train_time_ms")
        return None if ms is None else ms / 1000
    return record.get(axis)


def plot(
    runs: list[Run],
    references: list[Run] = (),
    x: str = "step",
    train: bool = False,
    title: str | None = None,
) -> Figure:
    """The figure: one val line per run and reference, plus a train line per run if asked."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    fig, ax = plt.subplots(figsize=(8, 5))
    keys = differing_overrides(runs)
    for run in runs:
        name = label(run, keys)
        points = [(_x(r, x), r["val_loss"]) for r in run.val_points() if _x(r, x) is not None]
        (line,) = ax.plot(*zip(*points, strict=True), marker="o", ms=3, label=f"{name} val")
        if train:
            pts = [
                (_x(r, x), r["train_loss"])
                for r in run.records
                if r.get("train_loss") is not None and _x(r, x) is not None
            ]
            ax.plot(*zip(*pts, strict=True), color=line.get_color(), alpha=0.3, lw=0.8,
                    label=f"{name} train")  # fmt: skip
    for ref in references:
        points = [(_x(r, x), r["val_loss"]) for r in ref.records if _x(r, x) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), ls="--", lw=1.2, label=f"{ref.name} (reference)")
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="run or multirun directories")
    refs = ", ".join(reference_names())
    parser.add_argument("--reference", action="append", default=[], help=f"{refs} or all")
    parser.add_argument("--x", choices=sorted(X_AXES), default="step")
    parser.add_argument("--train", action="store_true", help="also plot the training loss")
    parser.add_argument("--ylim", type=float, nargs=2, default=None, help="y range, e.g. 3 5")
    parser.add_argument("--title", default=None)
    parser.add_argument("--out", default="curves.png", help="PNG to write (curves.png)")
    args = parser.parse_args(argv)
    names = reference_names() if "all" in args.reference else args.reference
    if not args.paths and not names:
        parser.error("give run directories and/or --reference")
    runs = find_runs(args.paths) if args.paths else []
    fig = plot(runs, [load_reference(n) for n in names], args.x, args.train, args.title)
    if args.ylim:
        fig.axes[0].set_ylim(*args.ylim)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}: {len(runs)} run(s), {len(names)} reference curve(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
