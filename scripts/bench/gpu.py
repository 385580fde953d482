"""What train.py's step costs on one GPU: ms/step, tokens/s, MFU, warm-up, graph breaks.

    python scripts/bench/gpu.py                  # both records, a dense GPT-2 small, the head
    python scripts/bench/gpu.py --experiment record_2025_01_26 --set model.head.fp8=false
    python scripts/bench/gpu.py --head           # the LM head alone: FP8 against bf16
    python scripts/bench/gpu.py --experiment record_2025_01_26 --toy --device cpu --steps 2

Each preset runs one GPU's share of its global batch on the records' 8 GPUs (64 × 1024 tokens
for the 2024-11 record, one packed 49,152-token sequence for the 2025-01 one, micro-batches as
train.micro_batch_size says) the way train.py runs it: the same model, optimizer object,
`compile_model` and FP8-head accumulation, and per step the schedule, `forward_backward`, the
update and zero_grad (no DDP: one GPU). Random tokens carry an EOT every ~1000 tokens, so
document masking has documents to mask. `--set key=value` adds Hydra overrides to every preset.

A preset with a window schedule is measured at its first, middle and last window (steps 0,
S/2 and S−1), one row each (a preset with batch phases, the 2025-11 record's, at the first step
of each phase: its sequence length and window; the record's per-phase times beside them):
the window changes what attention costs, and it reaches the
compiled graph as a tensor, so it should never recompile. Compile state is reset between
presets; each window in the run's order is warmed up (its warm-up includes its compile), then
`--steps` consecutive steps at it are timed (rounded up to whole Adam periods), each with a
device synchronise: the row's ms/step is their mean, what a run's step costs, and the medians
of its normal and Adam steps stand beside it (scripts/bench/step_times.py); then evaluation
runs once (eval mode, the validation shape; a GPU out of memory there is reported in the eval
column, the training rows stand).

`--world W`: each GPU's share at W GPUs (batch / W sequences) with rank 0's share of the
optimizer under dist.parallelism=ddp_row_shards (`LocalView`, no communication): one GPU's step
of a W-GPU run, beside the record's per-GPU ms. `--optimizer`: the optimizer step alone after
the rows, eager against compiled (scripts/bench/optim_step.py). `--profile DIR`: a
torch.profiler table of one normal and one Adam step at the first window, per preset, into DIR.

Graphs and graph breaks count what the preset's compile made and met, evaluation included;
recompiles count graphs compiled during the row's timed steps. Graph breaks and recompiles
0 and 0: one graph per mode (training, evaluation), compiled once during warm-up.

MFU is `model/flops.py`'s count of the timed batches (attention over the context each layer's
mask lets through) over the step time and the GPU's bf16 peak (`trainer/observe/flops.py`): the
number train.py's step line shows. The records' own per-GPU steps are beside them: 154.78 ms
(2024-11) and 100.0 ms (2025-01, the mean over its growing windows), from their logs.

`--head` (part of the default run on CUDA): the LM head alone, forward and backward at 49,152
tokens × 768 → 50,304 logits, compiled, in FP8 (`model.head.FP8Matmul`) and as the bf16 matmul.
"""

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from model.masks import EOT
from optim import CombinedOptimizer
from optim.ddp_rows import LocalView
from scripts.bench.head import bench_head, print_head, timed
from scripts.bench.preset_rows import COLUMNS, format_row
from scripts.bench.presets import (  # noqa: F401  (re-exported: the benchmarks' presets)
    GPUS,
    PARTS,
    PRESETS,
    RECORD_STEP_MS,
    compose,
    hydra_config,
    record_step_ms,
)
from scripts.bench.step_times import profile_steps, time_steps
from trainer.build import Run, build_run
from trainer.config import Config
from trainer.forward import evaluate, forward_backward
from trainer.launch.compile import CompileCounts, reset_compile_state
from trainer.observe.flops import mfu, peak_flops
from trainer.runtime import Runtime, init_runtime
from trainer.schedule import Schedule
from trainer.train_step import filled

log = logging.getLogger(__name__)  # progress, seen when a caller configures logging
HEAD_SHAPE, HEAD_TOY_SHAPE = (49152, 768, 50304), (512, 128, 50304)  # tokens, d, vocab
DOC_TOKENS = 1000  # mean document length of the random tokens
Batch = tuple[Tensor, Tensor]


@dataclass
class Bench:
    """One preset, built as train.py builds it (`trainer/build.py`'s `build_run`)."""

    conf: Config
    run: Run
    rows: int  # sequences per GPU per step
    world: int  # the GPUs whose one's share this is

    @property
    def rt(self) -> Runtime:
        return self.run.rt

    @property
    def fwd(self) -> nn.Module:  # what runs forward: the compiled model
        return self.run.fwd

    @property
    def opt(self) -> CombinedOptimizer:
        return self.run.optimizer

    @property
    def schedule(self) -> Schedule:
        return self.run.schedule

    @property
    def accum(self) -> int:  # micro-steps the rows are split into
        return self.run.accum_steps

    def count(self, *args: Tensor, **kwargs: Tensor) -> Tensor:  # GPT.count_flops
        return self.run.model.count_flops(*args, **kwargs)


def build(conf: Config, world: int | None = None) -> Bench:
    """The preset built as train.py builds it (`build_run`, no loader: random batches), for
    one GPU of `GPUS` (the whole optimizer), or of `world` (rank 0's share of the optimizer,
    dist.parallelism=ddp_row_shards)."""
    gpus = world or GPUS
    comm = LocalView(world) if world and world > 1 else None
    rt = init_runtime(conf.train.device, conf.train.autocast)
    run = build_run(conf, PARTS, rt, world=gpus, comm=comm, data=False)
    return Bench(conf, run, conf.train.batch_size // gpus, gpus)


def random_batch(rows: int, seq_len: int, rng: np.random.Generator) -> Batch:
    """Random tokens with an EOT every ~DOC_TOKENS: (inputs, targets), shifted by one."""
    tokens = rng.integers(0, EOT, rows * seq_len + 1)
    tokens[rng.random(tokens.size) < 1 / DOC_TOKENS] = EOT
    t = torch.from_numpy(tokens)
    return t[:-1].view(rows, seq_len), t[1:].view(rows, seq_len)


def window_steps(b: Bench) -> list[int]:
    """The steps that stand for the schedule: the first of each stage (train.stages), else
    the first, middle and last window (or just one step)."""
    t = b.conf.train
    if t.stages.rows:
        return [t.stages.start(i, t.scheduled_steps) for i in range(len(t.stages.rows))]
    if not b.schedule.model_args(0):
        return [0]
    return sorted({0, t.steps // 2, t.steps - 1})


def seq_len(b: Bench, step: int) -> int:
    """The per-GPU sequence length of `step` (its stage's)."""
    return b.conf.train.seq_len_at(step)


def model_args(b: Bench, step: int) -> dict[str, Tensor]:
    """The forward's step arguments as device tensors, as the training loop gives them."""
    args = b.schedule.model_args(step)
    return {k: filled(v, b.rt.device) for k, v in args.items()}


def train_step(b: Bench, step: int, batch: Batch, args: dict[str, Tensor]) -> None:
    b.opt.set_step(b.schedule.at(step).optim)
    with torch.profiler.record_function("forward_backward"):
        forward_backward(b.fwd, batch, b.rt, b.accum, b.run.no_sync, args)
    with torch.profiler.record_function("optimizer"):
        b.opt.step()
    b.opt.zero_grad(set_to_none=True)


def window_label(b: Bench, step: int) -> str:
    """The window at `step` in blocks, long/short ("-": no window)."""
    args, block = b.schedule.model_args(step), b.conf.model.attention.window_block
    if "window_tokens" not in args:
        return "-"
    long = max(1, int(np.ceil(args["window_tokens"] / block)))
    if "short_window_tokens" in args:  # token windows by phase: both are whole blocks
        return f"{long}/{int(args['short_window_tokens']) // block}"
    return f"{long}/{max(1, long // 2)}"


def warm_up(b: Bench, windows: list[int], steps: int, rng: np.random.Generator) -> dict:
    """Seconds of warm-up: `steps` training steps at each window, rounded up to whole Adam
    periods where the optimizer is compiled (the Adam step compiles a graph of its own)."""
    period = b.opt.period() if b.conf.optim.compile else 1
    warm, steps = {}, steps + -steps % period
    for s in windows:
        batches = [random_batch(b.rows, seq_len(b, s), rng) for _ in range(steps)]
        args = model_args(b, s)
        warm[s] = sum(timed(b.rt, train_step, b, s, batch, args) for batch in batches)
        log.info("warm-up at step %d (%s): %.1f s", s, window_label(b, s), warm[s])
    return warm


def warm_up_eval(b: Bench, step: int, rng: np.random.Generator) -> float | str:
    """Seconds of one evaluation pass (eval mode, the validation shape train.py gives it) at
    `step`'s window, or why it could not run: a GPU that holds the training step may not hold
    the validation batch, and that is a finding, not a reason to lose the training rows."""
    t = b.conf.train
    val = [random_batch(t.val_rows(GPUS), t.val_seq_len or t.seq_len, rng)]  # as train.py
    try:
        seconds = timed(b.rt, evaluate, b.fwd, val, b.rt, model_args(b, step))
    except torch.OutOfMemoryError as e:
        log.info("evaluation at %d tokens: out of memory (%s)", val[0][0].numel(), e)
        return f"out of memory at {val[0][0].numel():,} tokens"
    log.info("warm-up of evaluation: %.1f s", seconds)
    return seconds


def time_window(b: Bench, step: int, steps: int, rng: np.random.Generator) -> tuple[dict, float]:
    """`steps` training steps at `step`'s window (whole Adam periods, `time_steps`): their
    mean and the medians of each kind ("step_s", "normal_s", "adam_s"), how many graphs
    were compiled meanwhile ("recompiles"); and their batches' mean FLOPs."""
    args, before = model_args(b, step), CompileCounts.now()
    batches = [tuple(u.to(b.rt.device) for u in random_batch(b.rows, seq_len(b, step), rng))
               for _ in range(steps + 1)]  # fmt: skip
    flops = torch.stack([b.count(x, **args) for x, _ in batches]).mean().item()
    it = iter(batches)
    times = time_steps(b.rt, b.opt, steps, lambda: train_step(b, step, next(it), args))
    out = {"step_s": times.period_s, "normal_s": times.median_s("normal"),
           "adam_s": times.median_s("adam"),
           "recompiles": (CompileCounts.now() - before).graphs}  # fmt: skip
    return out, flops


def bench_preset(
    name: str, b: Bench, steps: int, warmup: int, peak: float | None,
    on_row: Callable[[list[dict]], None] | None = None, profile: Path | None = None,
    stages: list[int] | None = None, evaluation: bool = True,
) -> list[dict]:  # fmt: skip
    """Each representative window in the run's order: warmed up, then its steps timed; then
    the evaluation (last, so that the training rows stand whatever it costs). `on_row` gets
    the rows so far after each one (a caller under a time cap keeps what was measured);
    `profile`: a file for the profile of the first window's steps; `stages`: which windows
    (1-based; None: all); `evaluation`: False skips it."""
    rng, start, rows = np.random.default_rng(0), CompileCounts.now(), []
    every = window_steps(b)
    if stages is not None and not set(stages) <= set(range(1, len(every) + 1)):
        raise ValueError(f"{name} has stages 1 to {len(every)}; asked for {stages}")
    for s in [x for i, x in enumerate(every, 1) if stages is None or i in stages]:
        warm = warm_up(b, [s], warmup, rng)
        tokens = b.rows * seq_len(b, s)
        t, flops = time_window(b, s, steps, rng)
        seen = CompileCounts.now() - start
        ms = {k.replace("_s", "_ms"): v * 1e3 if v is not None else None
              for k, v in t.items() if k.endswith("_s")}  # fmt: skip
        rows.append({
            "preset": name, "window": window_label(b, s), "tokens": tokens, "world": b.world,
            "warmup_s": warm[s], "eval_warmup_s": None, **ms,
            "tokens_per_s": tokens / t["step_s"],
            "mfu": mfu(flops, t["step_s"], peak) if peak else None, "graphs": seen.graphs,
            "graph_breaks": seen.graph_breaks, "recompiles": t["recompiles"],
            "record_ms": record_step_ms(name, b.conf, s),
        })  # fmt: skip
        if profile is not None and len(rows) == 1:
            profile_window(b, s, rng, profile, f"{name}, window {window_label(b, s)}, "
                           f"{tokens:,} tokens per GPU, world {b.world}")  # fmt: skip
        log.info("%s", format_row(rows[-1]))
        if on_row is not None:
            on_row(rows)
    if evaluation:
        rows[0]["eval_warmup_s"] = warm_up_eval(b, every[-1], rng)
    seen = CompileCounts.now() - start  # the evaluation's graph counted with the training's
    for r in rows:
        r["graphs"], r["graph_breaks"] = seen.graphs, seen.graph_breaks
    return rows


def profile_window(b: Bench, step: int, rng: np.random.Generator, path: Path, title: str) -> None:
    """One normal and one Adam step at `step`'s window under the profiler, into `path`."""
    args, batch = model_args(b, step), random_batch(b.rows, seq_len(b, step), rng)
    profile_steps(b.opt, lambda: train_step(b, step, batch, args), path, title)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", nargs="+", help=f"presets (default: {', '.join(PRESETS)})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a Hydra override for every preset (repeatable)")  # fmt: skip
    p.add_argument("--steps", type=int, default=20, help="timed steps per window")
    p.add_argument("--warmup", type=int, help="warm-up steps per window (default 2, toy 1)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--toy", action="store_true", help="a tiny model (smoke test, e.g. on CPU)")
    p.add_argument("--head", action="store_true", help="the LM head alone (on a CPU too)")
    p.add_argument("--peak-tflops", type=float, help="bf16 dense peak (default: the GPU's)")
    p.add_argument("--world", type=int, help="one GPU's share of this many, rank 0's optimizer")
    p.add_argument("--optimizer", action="store_true", help="then the optimizer step alone")
    p.add_argument("--profile", type=Path, metavar="DIR", help="a profile per preset, into DIR")
    return p.parse_args()


def main() -> None:
    """The presets (default: all, unless --head alone asks for the head), then the head (with
    --head, or by default on a GPU)."""
    args = parse_args()
    if args.world is not None and args.world < 1:
        raise SystemExit(f"gpu.py: --world takes a count of 1 or more GPUs, got {args.world}")
    presets = args.experiment or ([] if args.head else list(PRESETS))
    if presets:
        print(COLUMNS + "\n" + "|---" * COLUMNS.count(" | ") + "|---|", flush=True)
    for name in presets:
        reset_compile_state()
        conf = compose(name, args.device, "toy" if args.toy else "full", args.set)
        b = build(conf, args.world)
        peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops(b.rt.device)
        warmup = args.warmup or (1 if args.toy else 2)
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
        where = args.profile / f"{name}.txt" if args.profile is not None else None
        for row in bench_preset(name, b, args.steps, warmup, peak, profile=where):
            print(format_row(row), flush=True)
        del b
        if args.optimizer:
            from scripts.bench.optim_step import bench, table

            out = bench(conf, init_runtime(args.device, "none"), args.steps, 4, args.world or 1)
            print(table(name, "toy" if args.toy else "real", args.world or 1, out), flush=True)
    rt = init_runtime(args.device, "none")
    if args.head or (rt.device.type == "cuda" and not args.toy):
        reset_compile_state()
        backend = "inductor" if rt.device.type == "cuda" else "eager"
        shape = HEAD_TOY_SHAPE if args.toy else HEAD_SHAPE
        print_head(bench_head(shape, args.steps, rt, backend))


if __name__ == "__main__":
    main()
