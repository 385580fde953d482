"""Compile a preset's CUDA training step and evaluation on a machine without a GPU.

    pip install "triton>=3.5,<4"                     # Triton's compiler and its ptxas
    python -m scripts.gpu_dryrun                      # record #89 at GPU toy size, stage 1
    python -m scripts.gpu_dryrun --stages all         # every stage, then evaluation
    python -m scripts.gpu_dryrun --experiment record_2025_11_29 --full

What it does (scripts/gpu_dryrun/__init__.py says how): the preset is built as
scripts/bench/gpu.py builds it, on "cuda", and one training step runs at the first step of
each chosen stage (forward, backward, optimizer), then one evaluation pass. Dynamo traces the
CUDA code paths (FlexAttention, `torch._scaled_mm`), inductor lowers them to Triton kernels and
Triton compiles every kernel to an sm_90 cubin. An error anywhere in that chain, which a GPU
would raise at its first step, is raised here, with the same traceback.

Exit 0: every graph compiled; the line printed says how many kernels, graphs and graph breaks.
The step's numbers are meaningless (kernels do not run) and nothing is timed.

--full: the preset at its real size (default: its GPU toy, `size=gpu_toy`: conf/size/gpu_toy.yaml
and conf/preset_size/gpu_toy/). Both compile in about the same time, which is inductor's own
(~2 to 5 min per graph on a laptop-class CPU core). Record #89's toy is the shape that
FlexAttention and the FP8 products accept at toy size: heads of 16 (their minimum), windows of
128-token blocks, sequences of whole blocks.
"""

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from scripts.gpu_dryrun import fake_gpu

REPO = Path(__file__).resolve().parents[2]

log = logging.getLogger("gpu_dryrun")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", default="record_2026_07_17", help="the preset")
    p.add_argument("--stages", default="1", help="how many stages to step through, or 'all'")
    p.add_argument("--full", action="store_true", help="the real size, not the GPU toy")
    p.add_argument("--no-eval", action="store_true", help="skip the evaluation graph")
    p.add_argument(
        "--optimizer",
        action="store_true",
        help="the optimizer step alone: kernel launches, eager against compiled",
    )
    p.add_argument("--world", type=int, default=1,
                   help="with --optimizer or --ledger: rank 0's share of this many ranks",
                   )  # fmt: skip
    p.add_argument(
        "--ledger",
        action="store_true",
        help="count a normal and an Adam step per stage (FLOPs, bytes, launches, collectives) "
        "and estimate their ms on an H100 and an H200 (docs/ledger.md)",
    )
    p.add_argument("--json", type=Path, help="with --ledger: every launch counted, into this file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a Hydra override (repeatable)")  # fmt: skip
    return p.parse_args()


def check_triton() -> None:
    try:
        import triton  # noqa: F401
        from triton.backends.nvidia.driver import CudaDriver  # noqa: F401
    except ImportError:
        raise SystemExit('gpu_dryrun: needs Triton: pip install "triton>=3.5,<4"') from None


def main() -> int:
    args = parse_args()
    presets = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
    if args.experiment not in presets:
        raise SystemExit(f"gpu_dryrun: no preset {args.experiment!r} (have: {', '.join(presets)})")
    if args.json is not None and not args.ledger:
        raise SystemExit("gpu_dryrun: --json writes the ledger's launches; add --ledger")
    if args.stages != "all" and not (args.stages.isdigit() and int(args.stages) >= 1):
        raise SystemExit(
            f"gpu_dryrun: --stages takes a count of 1 or more, or 'all'; got {args.stages!r}"
        )
    check_triton()
    shim = fake_gpu.build_shim()
    if not fake_gpu.preloaded(shim):
        fake_gpu.reexec_with(shim)  # does not return
    fake_gpu.install()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import numpy as np

    from scripts.bench import gpu
    from trainer.launch.compile import CompileCounts

    size = "full" if args.full else "gpu_toy"
    if args.optimizer:
        return optimizer(args, gpu.compose(args.experiment, "cuda", size, args.set))
    if args.ledger:
        return ledger(args, gpu, gpu.compose(args.experiment, "cuda", size, args.set))
    b = gpu.build(gpu.compose(args.experiment, "cuda", size, args.set))
    steps = gpu.window_steps(b)
    if args.stages != "all":
        steps = steps[: int(args.stages)]
    rng, start, t0 = np.random.default_rng(0), CompileCounts.now(), time.perf_counter()
    for s in steps:
        gpu.warm_up(b, [s], 1, rng)  # one step: the stage's graphs compile
        log.info("stage at step %d: compiled (%d Triton compiles so far)", s, compiles())
    if not args.no_eval:
        gpu.warm_up_eval(b, steps[-1], rng)
    seen = CompileCounts.now() - start
    print(
        f"gpu_dryrun {args.experiment} ({'full' if args.full else 'GPU toy'}, sm_90): "
        f"{len(steps)} stage(s){'' if args.no_eval else ' and evaluation'} compiled in "
        f"{time.perf_counter() - t0:.0f} s; {compiles()} Triton compiles, "
        f"{seen.graphs} graphs, {seen.graph_breaks} graph breaks",
        flush=True,
    )
    return 0


def optimizer(args: argparse.Namespace, conf: object) -> int:
    """--optimizer: kernel launches of a normal and an Adam step, eager and compiled."""
    from scripts.gpu_dryrun.launches import optimizer_rows

    t0 = time.perf_counter()
    rows = optimizer_rows(conf, args.world)
    size = "full" if args.full else "GPU toy"
    print(f"| {args.experiment} ({size}), world {args.world} | normal step | Adam step |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r.get('normal', '-')} | {r.get('adam', '-')} |")
    print(f"({time.perf_counter() - t0:.0f} s, {compiles()} Triton compiles)", flush=True)
    return 0


def ledger(args: argparse.Namespace, gpu: object, conf: object) -> int:
    """--ledger: each stage's normal and Adam step counted, with their estimates."""
    from scripts.bench.presets import record_step_ms
    from scripts.gpu_dryrun.calibrate import constants
    from scripts.gpu_dryrun.ledger import load_shim
    from scripts.gpu_dryrun.measure import preset_ledgers
    from scripts.gpu_dryrun.report import ledger_table, write_json

    t0 = time.perf_counter()
    stages = None if args.stages == "all" else int(args.stages)
    steps = preset_ledgers(gpu, conf, args.world, stages, load_shim())
    size = "full" if args.full else "GPU toy"
    print(f"{args.experiment} ({size}), rank 0 of {args.world}:")
    print(ledger_table(steps, constants(),
                       lambda step: record_step_ms(args.experiment, conf, step)))  # fmt: skip
    if args.json is not None:
        meta = {"experiment": args.experiment, "full": args.full, "world": args.world,
                "set": args.set}  # fmt: skip
        write_json(args.json, meta, steps)
        print(f"every launch: {args.json}")
    print(f"({time.perf_counter() - t0:.0f} s, {compiles()} Triton compiles)", flush=True)
    return 0


def compiles() -> int:
    """Triton kernels compiled (or found in Triton's cache) so far in this process."""
    return fake_gpu.COMPILES[0]


if __name__ == "__main__":
    sys.exit(main())
