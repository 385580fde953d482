"""The optimizer step alone, at a preset's shapes, with random gradients: eager
(optim.compile=false) against compiled (optim.compile=true), both measured in the same run.

    python scripts/bench/optim_step.py --toy --device cpu                  # record #89's toy
    python scripts/bench/optim_step.py                                      # real size, a GPU
    python scripts/bench/optim_step.py --world 8                            # rank 0's share of 8

Each mode builds the preset's model and optimizer object as train.py does (optim.compile
set), puts fixed random gradients on every parameter, warms up (the compile included) and
times `--steps` consecutive steps, each with a device synchronise. The two modes take turns,
a period at a time (interleaved, so a drifting clock or background load hits both alike).

A step is "normal" or "Adam": with optim.adamw.update_every = 2 (records #46 and #89) Adam
only adds the gradient to its sum on normal steps and updates on the others. The table gives
the median of each kind and their period mean (what a run's step costs on average), and the
ratios eager / compiled of each.

`--world W` builds the optimizer with `LocalView(W, 0)` (optim/ddp_rows.py): rank 0's share of
dist.parallelism=ddp_row_shards on W ranks (1/W of Muon's banks and of Adam's tables, every small
tensor, the packing the exchange does), with no communication: on one GPU, the optimizer's
part of a W-GPU step.
"""

import argparse
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from optim import CombinedOptimizer
from optim.ddp_rows import LocalView
from scripts.bench.head import timed
from scripts.bench.presets import PARTS, compose
from trainer.build import build_run
from trainer.config import Config
from trainer.runtime import Runtime, init_runtime

MODES = {"eager": False, "compiled": True}


@dataclass
class Mode:
    """One mode's optimizer object and the times of its steps, by kind."""

    name: str
    opt: CombinedOptimizer
    times: dict[str, list[float]]


def build(conf: Config, rt: Runtime, compiled: bool, world: int,
          backend: str = "inductor") -> CombinedOptimizer:  # fmt: skip
    """The preset's optimizer object over a fresh model, built as train.py builds it
    (`build_run`), gradients filled in; `compiled`: optim.compile with `backend`."""
    optim = replace(conf.optim, compile=compiled, compile_backend=backend)
    comm = LocalView(world) if world > 1 else None
    run = build_run(replace(conf, optim=optim), PARTS, rt, world=world, comm=comm, data=False)
    opt = run.optimizer
    opt.set_step(run.schedule.at(0).optim)
    for p in opt.params():  # from the device's default generator, seeded by build_run
        p.grad = torch.randn(p.shape, device=rt.device).to(p.dtype) * 1e-3
    return opt


def kind(opt: CombinedOptimizer) -> str:
    return "adam" if opt.full_next() else "normal"


def run_steps(mode: Mode, rt: Runtime, steps: int) -> None:
    for _ in range(steps):
        k = kind(mode.opt)
        mode.times.setdefault(k, []).append(timed(rt, mode.opt.step))


def summary(mode: Mode) -> dict[str, float | None]:
    """Median ms of each kind and their period mean (the mean of one of each where steps
    alternate; the median of all where every step is full)."""
    ms = {k: statistics.median(v) * 1e3 for k, v in mode.times.items()}
    normal, adam = ms.get("normal"), ms.get("adam")
    period = (normal + adam) / 2 if normal is not None and adam is not None else adam or normal
    return {"normal_ms": normal, "adam_ms": adam, "period_ms": period}


def bench(conf: Config, rt: Runtime, steps: int, warmup: int, world: int,
          backend: str = "inductor") -> dict[str, dict]:  # fmt: skip
    """{mode: summary}, every mode built first, then warmed up and timed in turns."""
    modes = [Mode(name, build(conf, rt, on, world, backend), {}) for name, on in MODES.items()]
    for m in modes:
        for _ in range(warmup):
            m.opt.step()
    rounds = max(1, steps // 2)
    for _ in range(rounds):
        for m in modes:
            run_steps(m, rt, 2)  # a whole period (a normal and an Adam step) per turn
    return {m.name: summary(m) for m in modes}


def cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(name: str, shapes: str, world: int, out: dict[str, dict]) -> str:
    lines = ["| preset | shapes | world | mode | normal ms | Adam ms | period mean ms |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for mode, s in out.items():
        lines.append(f"| {name} | {shapes} | {world} | {mode} | {cell(s['normal_ms'])} | "
                     f"{cell(s['adam_ms'])} | {cell(s['period_ms'])} |")  # fmt: skip
    e, c = out["eager"], out["compiled"]
    ratios = [f"{k.removesuffix('_ms')} {e[k] / c[k]:.2f}x" for k in e if e[k] and c[k]]
    lines.append(f"\neager / compiled: {', '.join(ratios)}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", default="record_2026_07_17")
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--toy", action="store_true", help="the preset at scripts/bench/gpu.py's toy size"
    )
    p.add_argument("--world", type=int, default=1, help="rank 0's share of this many ranks")
    p.add_argument("--steps", type=int, default=20, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps per mode (compiles)")
    p.add_argument(
        "--backend", default="inductor", help="the compiled mode's torch.compile backend"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    if args.world < 1:
        p.error(f"--world takes a count of 1 or more ranks, got {args.world}")
    conf = compose(args.experiment, args.device, "toy" if args.toy else "full", args.set)
    rt = init_runtime(args.device, "none")
    out = bench(conf, rt, args.steps, args.warmup, args.world, args.backend)
    print(table(args.experiment, "toy" if args.toy else "real", args.world, out))


if __name__ == "__main__":
    main()
