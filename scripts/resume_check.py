"""Does a save resume bit for bit on this machine, every time? Resume one checkpoint of a
finished run many times, optionally with busy processes beside it, and compare each resumed
step's training loss with the run's own.

    python train.py hydra.run.dir=outputs/keep train.checkpoint_keep=4   # saves 50-200 kept
    python -m scripts.resume_check outputs/keep --step 50 --times 8 --load 2
    python -m scripts.resume_check outputs/keep --step 50 --steps 3   # 3 steps after the save
    python -m scripts.resume_check outputs/keep --step 50 --with train.threads=1   # 1 thread

The run must have kept the checkpoint (`train.checkpoint_keep`) and run past it. Each resume
is a fresh process in a scratch copy of the run directory (its `.hydra/` overrides, the save
and its metrics up to it), stopped after `--steps` steps by the test-only stop fault
(`train.fault.signal_at_step`), which leaves the schedule the run's own. `--load N` starts N
processes that keep a core busy with matrix products for the whole check, as other work on a
shared machine does. Each line says where a resume first differed, by how much, and what the
process saw (threads, load average); docs/checkpoints.md says what exact resume promises.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file: the repository's packages come first
    sys.path.insert(0, str(REPO))

from scripts.bench.busy import busy_processes  # noqa: E402

CHECKPOINTS = "checkpoints"


def losses(metrics: Path) -> dict[int, float | None]:
    """Each step's training loss in a metrics.jsonl (the last record of a step wins)."""
    out = {}
    for line in metrics.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if "train_loss" in r:
            out[r["step"]] = r["train_loss"]
    return out


def scratch_copy(run_dir: Path, step: int, where: Path) -> None:
    """The run directory as it was when checkpoint `step` was its newest."""
    save = run_dir / CHECKPOINTS / f"step_{step:06d}"
    (where / CHECKPOINTS).mkdir(parents=True)
    shutil.copytree(save, where / CHECKPOINTS / save.name)
    (where / CHECKPOINTS / "latest").write_text(save.name + "\n")
    shutil.copytree(run_dir / ".hydra", where / ".hydra")
    kept = [
        line
        for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if json.loads(line)["step"] <= step
    ]
    (where / "metrics.jsonl").write_text("".join(f"{x}\n" for x in kept), encoding="utf-8")


def overrides(run_dir: Path) -> list[str]:
    """The run's own command-line overrides (Hydra keeps them in .hydra/overrides.yaml)."""
    from omegaconf import OmegaConf

    saved = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
    return [str(x) for x in saved if not str(x).startswith("hydra.run.dir=")]


def resume_once(
    run_dir: Path, step: int, steps: int, where: Path, extra: list[str]
) -> tuple[dict, str]:
    """Resume `run_dir`'s save of `step` in `where` for `steps` steps, with the run's overrides
    and then `extra`; its losses and log."""
    scratch_copy(run_dir, step, where)
    cmd = [sys.executable, str(REPO / "train.py"), *overrides(run_dir), *extra,
           f"hydra.run.dir={where}", f"train.fault.signal_at_step={step + steps}"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    if done.returncode not in (0, 143):  # 143: the stop fault's SIGTERM, as planned
        raise SystemExit(f"resume_check: the resume failed:\n{done.stderr[-3000:]}")
    return losses(where / "metrics.jsonl"), done.stdout + done.stderr


def compare(own: dict, resumed: dict, after: int, steps: int) -> str:
    """Where `resumed` first differs from `own` in the `steps` steps after `after`."""
    for s in range(after + 1, after + steps + 1):
        a, b = own.get(s), resumed.get(s)
        if b is None:
            return f"step {s} missing"
        if a != b:
            return f"differs from step {s}: {b!r} against {a!r} ({abs(b - a):.2e})"
    return "bit for bit"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a run that kept the save and ran past it")
    p.add_argument("--step", type=int, required=True, help="the checkpoint's step")
    p.add_argument("--steps", type=int, default=2, help="steps to take after it (default 2)")
    p.add_argument("--times", type=int, default=8, help="resumes (default 8)")
    p.add_argument("--load", type=int, default=0, help="busy processes beside them (default 0)")
    p.add_argument(
        "--with", dest="extra", action="append", default=[], metavar="KEY=VALUE",
        help="an override for the resumes (e.g. train.threads=1: do its sums match here?)",
    )  # fmt: skip
    args = p.parse_args(argv)
    run_dir = args.run_dir
    save = run_dir / CHECKPOINTS / f"step_{args.step:06d}"
    if not save.is_dir():
        raise SystemExit(f"resume_check: {save} does not exist: give --step of a kept save")
    if not (run_dir / ".hydra" / "overrides.yaml").is_file():
        raise SystemExit(f"resume_check: {run_dir} has no .hydra/overrides.yaml: not a run dir")
    own = losses(run_dir / "metrics.jsonl")
    if max(own, default=0) < args.step + args.steps:
        raise SystemExit(
            f"resume_check: {run_dir} ran to step {max(own, default=0)}: it must pass step "
            f"{args.step + args.steps} (--step + --steps) to compare with"
        )
    exact = 0
    with busy_processes(args.load), tempfile.TemporaryDirectory(prefix="resume_check-") as tmp:
        for i in range(args.times):
            load = os.getloadavg()[0]
            resumed, _ = resume_once(run_dir, args.step, args.steps, Path(tmp) / str(i), args.extra)
            verdict = compare(own, resumed, args.step, args.steps)
            exact += verdict == "bit for bit"
            print(f"resume {i + 1}/{args.times} (load {load:.1f}): {verdict}", flush=True)
    busy = f"{args.load} busy process{'' if args.load == 1 else 'es'}"
    print(f"{exact} of {args.times} resumes bit for bit ({busy} beside)")
    return 0 if exact == args.times else 1


if __name__ == "__main__":
    sys.exit(main())
