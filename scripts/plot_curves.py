"""Overlay validation (and optionally training) loss curves of runs and reference records.

    python scripts/plot_curves.py multirun/2026-11-23/10-00-00            # every job of a sweep
    python scripts/plot_curves.py outputs/a outputs/b --train --out ab.png
    python scripts/plot_curves.py outputs/fineweb --reference all --x tokens

Each path is a run directory (with metrics.jsonl) or a directory of runs (a multirun). Runs
whose overrides differ only in `seed` form one group: one colour and one legend entry per
group, one line per seed. Groups are labelled by the overrides whose values differ between
them (their directory name when none do). Unfinished runs (see scripts/report.py) are drawn
dashed with "(unfinished)" in the legend, or left out with `--skip-unfinished`.
`--reference` adds public records' curves from scripts/reference/ ("all" for every one),
dotted. The x axis is the step, the training tokens, or the train time in seconds. The PNG
goes to `--out`, by default curves.png in the runs' common directory (the sweep directory).
"""

import argparse
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from scripts.report import split_finished
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


def common_dir(paths: list[str | Path]) -> Path | None:
    """The deepest directory holding all `paths`: a sweep's, or a lone run's own."""
    return Path(os.path.commonpath([os.path.abspath(p) for p in paths])) if paths else None


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (shorter titles)."""
    try:
        return str(path.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(path)


def group_by_config(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs whose Hydra overrides are equal but for `seed`, keyed by the group's label."""
    keys = differing_overrides(runs, ignore=("seed",))
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        if (Path(run.name) / ".hydra" / "overrides.yaml").is_file():
            key = tuple(sorted((k, v) for k, v in run.overrides.items() if k != "seed"))
        else:  # outside Hydra there is nothing to tell seeds from configs: a group per run
            key = ("run", run.name)
        groups.setdefault(key, []).append(run)
    named = {}
    for members in groups.values():
        name = label(members[0], keys)
        if not keys and len(members) > 1:  # one config, only seeds differ: no directory name
            shared = [f"{k}={v}" for k, v in members[0].overrides.items() if k != "seed"]
            name = " ".join(shared) or "default config"
        named[name] = members
    return named


def _title(runs: list[Run], x: str, train: bool) -> str:
    what = "validation and train loss" if train else "validation loss"
    where = common_dir([r.name for r in runs])
    return f"{what} vs {x}" + (f": {_shown(where)}" if where else "")


def plot(
    runs: list[Run],
    references: list[Run] = (),
    x: str = "step",
    train: bool = False,
    title: str | None = None,
) -> Figure:
    """The figure: per config group one colour, a val line per seed (dashed if the run is
    unfinished), a train line per seed if asked, and a dotted line per reference."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    fig, ax = plt.subplots(figsize=(8, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    unfinished = {run.name for run, _ in split_finished(runs)[1]}
    for g, (name, members) in enumerate(group_by_config(runs).items()):
        colour = colours[g % len(colours)]
        n_done = sum(run.name not in unfinished for run in members)
        first = True
        for run in members:
            seed = f" seed={run.overrides['seed']}" if "seed" in run.overrides else ""
            # Legend: one entry per group and one per unfinished run; a leading "_" hides
            # the other seeds' lines from it (matplotlib's convention).
            if run.name in unfinished:
                base, suffix, ls = f"{name}{seed}", " (unfinished)", "--"
            elif first:
                base, suffix, ls = name, f" ({n_done} seeds)" if n_done > 1 else "", "-"
                first = False
            else:
                base, suffix, ls = f"_{name}{seed}", "", "-"
            pts = [(_x(r, x), r["val_loss"]) for r in run.val_points() if _x(r, x) is not None]
            ax.plot(*zip(*pts, strict=True), marker="o", ms=3, color=colour, ls=ls,
                    label=f"{base} val{suffix}")  # fmt: skip
            if train:
                pts = [
                    (_x(r, x), r["train_loss"])
                    for r in run.records
                    if r.get("train_loss") is not None and _x(r, x) is not None
                ]
                ax.plot(*zip(*pts, strict=True), color=colour, ls=ls, alpha=0.3, lw=0.8,
                        label=f"{base} train{suffix}")  # fmt: skip
    for ref in references:
        points = [(_x(r, x), r["val_loss"]) for r in ref.records if _x(r, x) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), ls=":", lw=1.5, label=f"{ref.name} (reference)")
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel("loss (val: markers, train: faint)" if train else "validation loss")
    if x != "time":  # steps and tokens are counts: no half-step ticks
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or _title(runs, x, train), fontsize=10)
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
    parser.add_argument("--title", default=None, help="(default: what is plotted, and where)")
    parser.add_argument("--skip-unfinished", action="store_true", help="leave unfinished out")
    parser.add_argument("--out", default=None, help="PNG to write (curves.png beside the runs)")
    args = parser.parse_args(argv)
    names = reference_names() if "all" in args.reference else args.reference
    if not args.paths and not names:
        parser.error("give run directories and/or --reference")
    runs = find_runs(args.paths) if args.paths else []
    finished, unfinished = split_finished(runs)
    for run, why in unfinished:
        what = "left out" if args.skip_unfinished else "dashed"
        print(f"unfinished ({what}): {run.name} ({why})")
    if args.skip_unfinished:
        runs = finished
    fig = plot(runs, [load_reference(n) for n in names], args.x, args.train, args.title)
    if args.ylim:
        fig.axes[0].set_ylim(*args.ylim)
    # Beside the inputs (a sweep's plot in the sweep directory), not wherever the shell is.
    out = Path(args.out) if args.out else (common_dir(args.paths) or Path.cwd()) / "curves.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"wrote {out}: {len(runs)} run(s), {len(names)} reference curve(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
