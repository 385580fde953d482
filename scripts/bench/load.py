"""How much other work on a machine moves this trainer's times: each command timed alone and
with busy processes beside it (each keeping a core busy with products), in turns (alone,
loaded, alone, loaded, ...) so that a drift of the machine's speed falls on both; the medians
and the median of the rounds' ratios.

    python scripts/bench/load.py                       # smoke and the #21 toy, 2 busy, 3 rounds
    python scripts/bench/load.py --busy 1 --rounds 5 --only toy

The numbers for each CPU kind are in docs/benchmarks.md ("How much load moves them").
"""

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a file: the repository's packages come first
    sys.path.insert(0, str(REPO))

from scripts.bench.busy import busy_processes  # noqa: E402
from scripts.bench.cpu_kinds import TOYS  # noqa: E402

COMMANDS = {
    "smoke": ["experiment=smoke"],
    "toy": shlex.split(TOYS["record #21 toy (s)"]),  # record #21 at toy size (size=toy)
}


def seconds(overrides: list[str], busy: int) -> float:
    """Wall seconds of `python train.py <overrides>` with `busy` busy processes beside it."""
    with tempfile.TemporaryDirectory(prefix="load-") as tmp, busy_processes(busy):
        cmd = [sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={tmp}"]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
        took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"load: {shlex.join(overrides)} failed:\n{done.stderr[-3000:]}")
    return took


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--busy", type=int, default=2, help="busy processes (default 2: 2 cores)")
    p.add_argument("--rounds", type=int, default=3, help="alone/loaded pairs (default 3)")
    p.add_argument("--only", choices=sorted(COMMANDS), action="append", help="one command")
    args = p.parse_args(argv)
    print(f"| command | alone (s) | with {args.busy} busy (s) | loaded ÷ alone |")
    print("|---|---:|---:|---:|")
    for name in args.only or list(COMMANDS):
        alone, loaded = [], []
        for _ in range(args.rounds):
            alone.append(seconds(COMMANDS[name], 0))
            loaded.append(seconds(COMMANDS[name], args.busy))
        ratio = statistics.median(b / a for a, b in zip(alone, loaded, strict=True))
        print(
            f"| {name} | {statistics.median(alone):.1f} | {statistics.median(loaded):.1f} | "
            f"{ratio:.2f}× |",
            flush=True,
        )


if __name__ == "__main__":
    main()
