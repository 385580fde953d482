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
`--steps` steps at it are timed, each with a device synchronise, and their median is the row's
step; then evaluation runs once (eval mode, the validation shape; a GPU out of memory there
is reported in the eval column, the training rows stand). Graphs and graph breaks count what
the preset's compile made and met, evaluation included; recompiles count graphs compiled
during the row's timed steps. Graph breaks and recompiles 0 and 0: one graph per mode
(training, evaluation), compiled once during warm-up.

MFU is `model/flops.py`'s count of the timed batches (attention over the context each layer's
mask lets through) over the step time and the GPU's bf16 peak (`trainer/observe/flops.py`): the
number train.py's step line shows. The records' own per-GPU steps are beside them: 154.78 ms
(2024-11) and 100.0 ms (2025-01, the mean over its growing windows), from their logs.

`--head` (part of the default run on CUDA): the LM head alone, forward and backward at 49,152
tokens × 768 → 50,304 logits, compiled, in FP8 (`model.head.FP8Matmul`) and as the bf16 matmul.
"""

import argparse
import logging
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from model import GPT
from model.masks import EOT
from model.window_schedule import phase_index, phase_start
from optim import CombinedOptimizer, build_optimizer
from scripts.bench.head import bench_head, print_head, timed
from trainer.config import Config, register_configs, to_config
from trainer.forward import evaluate, forward_backward
from trainer.launch.compile import CompileCounts, compile_model, reset_compile_state
from trainer.observe.flops import mfu, peak_flops
from trainer.runtime import Runtime, init_runtime
from trainer.schedule import Schedule
from trainer.step import filled

log = logging.getLogger(__name__)  # progress, seen when a caller configures logging
CONF = Path(__file__).resolve().parents[2] / "conf"
GPUS = 8  # the records' world: each GPU runs batch_size / 8 sequences per step
# The records' own ms per step on one of their 8 GPUs; by batch phase for the 2025-11 record
RECORD_STEP_MS = {
    "record_2024_11_06": 154.78, "record_2025_01_26": 100.0,
    "record_2025_11_29": (33.9, 60.1, 88.1), "record_2026_07_17": (31.50, 56.82, 82.78),
}  # fmt: skip
PRESETS = {
    "record_2024_11_06": ["experiment=record_2024_11_06"],
    "record_2025_01_26": ["experiment=record_2025_01_26"],
    "record_2025_11_29": ["experiment=record_2025_11_29"],
    "record_2026_07_17": ["experiment=record_2026_07_17"],
    "dense_124m": [  # GPT-2 small as it comes, compiled, 64 x 1024 tokens per GPU
        "model=gpt2_124m", "model.compile=true", "train.autocast=bf16", "train.seq_len=1024",
        f"train.batch_size={64 * GPUS}", "train.micro_batch_size=64",
    ],
}  # fmt: skip
TOY = [  # 3 layers (long, short, long windows in the 2025-01 layout), 16 blocks of 16 tokens
    "model.n_layer=3", "model.n_embd=64", "model.n_head=1", "model.attention.window_block=16",
    "train.seq_len=256", f"train.batch_size={GPUS}", "train.micro_batch_size=1",
    "train.val_seq_len=512",
]  # fmt: skip
TOY_WINDOW = "model.attention.window_tokens=192"  # 1 -> 12 of the 16 blocks, where windows grow
# The 2025-11 record at 4 layers (record layers 0, 4, 7, 11: skip 4 -> 7 is 1 -> 2, the backout
# of record layer 8 the nearest, 7) and its three sequence lengths at toy size
TOY_EXTRA = {
    "record_2025_11_29": [
        "model.n_layer=4", "model.n_head=2", "model.residual.skip_from=1",
        "model.residual.skip_to=2",
        "model.residual.backout_layer=2", "train.seq_len_phases=[64,128,256]",
    ],
    # The 2026-07 record with its own 11-layer table, 6 heads of 8 (paired heads need 6).
    "record_2026_07_17": [
        "model.n_layer=11", "model.n_head=6", "model.n_embd=48", "model.embed.bigram_rows=256",
        "model.embed.bigram_dim=8", "model.residual.mudd_hidden=8",
        "train.seq_len_phases=[64,128,256]", "data.max_piece_len=128",
        "data.max_piece_len_phases=[32,128,128]", "optim.tie_embed_head_until=5",
    ],
}  # fmt: skip
# On a CPU: trace (graph breaks and recompiles are counted) without inductor's kernel builds.
# Masks stay dense (attention_impl auto = sdpa here): FlexAttention has no backward on a CPU.
TOY_CPU = ["model.compile=true", "model.compile_backend=eager"]
HEAD_SHAPE, HEAD_TOY_SHAPE = (49152, 768, 50304), (512, 128, 50304)  # tokens, d, vocab
DOC_TOKENS = 1000  # mean document length of the random tokens
Batch = tuple[Tensor, Tensor]


@dataclass
class Bench:
    """One preset, built as train.py builds it."""

    conf: Config
    rt: Runtime
    fwd: nn.Module  # what runs forward: the compiled model
    opt: CombinedOptimizer
    schedule: Schedule
    count: Callable[..., Tensor]  # the model's FLOP count (GPT.count_flops)
    rows: int  # sequences per GPU per step
    accum: int  # micro-steps they are split into


def compose(name: str, device: str, toy: bool, sets: list[str]) -> Config:
    """The preset's config: its overrides, then the toy's, then `--set`'s."""
    overrides = [*PRESETS.get(name, [f"experiment={name}"]), "run_dir=.", f"train.device={device}"]
    if toy:
        overrides += [*TOY, *(TOY_CPU if device == "cpu" else []), *TOY_EXTRA.get(name, [])]
        model = hydra_config([*overrides, *sets]).model
        if model.attention.window and not model.attention.window_phases:
            overrides.append(TOY_WINDOW)
    return hydra_config([*overrides, *sets])


def hydra_config(overrides: list[str]) -> Config:
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=overrides))


def build(conf: Config) -> Bench:
    """Model, optimizer object and compile as in train.py, for one GPU of `GPUS`."""
    t = conf.train
    rt = init_runtime(t.device, t.autocast)
    accum = t.accumulation_steps(GPUS)
    torch.manual_seed(0)
    model = GPT(conf.model).to(rt.device)
    model.micro_steps = accum
    opt = build_optimizer(model, conf.optim, device=rt.device)
    fwd = compile_model(model, conf.model.compile_backend) if conf.model.compile else model
    schedule = Schedule.for_run(t, conf.optim, conf.model)
    return Bench(conf, rt, fwd, opt, schedule, model.count_flops, t.batch_size // GPUS, accum)


def random_batch(rows: int, seq_len: int, rng: np.random.Generator) -> Batch:
    """Random tokens with an EOT every ~DOC_TOKENS: (inputs, targets), shifted by one."""
    tokens = rng.integers(0, EOT, rows * seq_len + 1)
    tokens[rng.random(tokens.size) < 1 / DOC_TOKENS] = EOT
    t = torch.from_numpy(tokens)
    return t[:-1].view(rows, seq_len), t[1:].view(rows, seq_len)


def window_steps(b: Bench) -> list[int]:
    """The steps that stand for the schedule: the first of each batch phase
    (train.seq_len_phases), else the first, middle and last window (or just one step)."""
    t = b.conf.train
    if t.seq_len_phases:
        n = len(t.seq_len_phases)
        return [phase_start(i, t.scheduled_steps, n) for i in range(n)]
    if not b.schedule.model_args(0):
        return [0]
    return sorted({0, t.steps // 2, t.steps - 1})


def seq_len(b: Bench, step: int) -> int:
    """The per-GPU sequence length of `step` (its batch phase's)."""
    return b.conf.train.seq_len_at(step)


def record_ms(name: str, b: Bench, step: int) -> float | None:
    """The record's own ms per step at `step` (its batch phase's, where it has phases)."""
    ms = RECORD_STEP_MS.get(name)
    if isinstance(ms, tuple):
        return ms[phase_index(step, b.conf.train.scheduled_steps, ms)]
    return ms


def model_args(b: Bench, step: int) -> dict[str, Tensor]:
    """The forward's step arguments as device tensors, as the training loop gives them."""
    args = b.schedule.model_args(step)
    return {k: filled(v, b.rt.device) for k, v in args.items()}


def train_step(b: Bench, step: int, batch: Batch, args: dict[str, Tensor]) -> None:
    b.opt.set_step(b.schedule.at(step).optim)
    forward_backward(b.fwd, batch, b.rt, b.accum, None, args)
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
    """Seconds of warm-up: `steps` training steps at each window."""
    warm = {}
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


def time_window(
    b: Bench, step: int, steps: int, rng: np.random.Generator
) -> tuple[float, float, int]:
    """The median seconds of `steps` training steps at `step`'s window, their batches' mean
    FLOPs, and how many graphs were compiled meanwhile."""
    args, before = model_args(b, step), CompileCounts.now()
    times, flops = [], []
    for _ in range(steps):
        x, y = (u.to(b.rt.device) for u in random_batch(b.rows, seq_len(b, step), rng))
        flops.append(b.count(x, **args))
        times.append(timed(b.rt, train_step, b, step, (x, y), args))
    recompiles = (CompileCounts.now() - before).graphs
    return statistics.median(times), torch.stack(flops).mean().item(), recompiles


def bench_preset(
    name: str, b: Bench, steps: int, warmup: int, peak: float | None,
    on_row: Callable[[list[dict]], None] | None = None,
) -> list[dict]:  # fmt: skip
    """Each representative window in the run's order: warmed up, then its steps timed; then
    the evaluation (last, so that the training rows stand whatever it costs). `on_row` gets
    the rows so far after each one (a caller under a time cap keeps what was measured)."""
    rng, start, rows = np.random.default_rng(0), CompileCounts.now(), []
    for s in window_steps(b):
        warm = warm_up(b, [s], warmup, rng)
        tokens = b.rows * seq_len(b, s)
        step_s, flops, recompiles = time_window(b, s, steps, rng)
        seen = CompileCounts.now() - start
        rows.append({
            "preset": name, "window": window_label(b, s), "tokens": tokens,
            "warmup_s": warm[s], "eval_warmup_s": None,
            "step_ms": step_s * 1e3, "tokens_per_s": tokens / step_s,
            "mfu": mfu(flops, step_s, peak) if peak else None, "graphs": seen.graphs,
            "graph_breaks": seen.graph_breaks, "recompiles": recompiles,
            "record_ms": record_ms(name, b, s),
        })  # fmt: skip
        log.info("%s", format_row(rows[-1]))
        if on_row is not None:
            on_row(rows)
    rows[0]["eval_warmup_s"] = warm_up_eval(b, window_steps(b)[-1], rng)
    seen = CompileCounts.now() - start  # the evaluation's graph counted with the training's
    for r in rows:
        r["graphs"], r["graph_breaks"] = seen.graphs, seen.graph_breaks
    return rows


COLUMNS = (
    "| preset | window (blocks, long/short) | tokens/step/GPU | warm-up s (train / eval) "
    "| ms/step | tokens/s | MFU | graphs | graph breaks | recompiles | record ms/step |"
)


def eval_cell(seconds: float | str | None) -> str:
    """ " / s" of the evaluation's warm-up, " / why not", or nothing (not this row's)."""
    if seconds is None:
        return ""
    return f" / {seconds:.1f}" if isinstance(seconds, float) else f" / {seconds}"


def format_row(r: dict) -> str:
    warm = f"{r['warmup_s']:.1f}" + eval_cell(r["eval_warmup_s"])
    cells = [
        r["preset"], r["window"], f"{r['tokens']:,}", warm, f"{r['step_ms']:.1f}",
        f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}" if r["mfu"] is not None else "-",
        str(r["graphs"]), str(r["graph_breaks"]), str(r["recompiles"]),
        f"{r['record_ms']:.2f}" if r["record_ms"] else "-",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


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
    return p.parse_args()


def main() -> None:
    """The presets (default: all, unless --head alone asks for the head), then the head (with
    --head, or by default on a GPU)."""
    args = parse_args()
    presets = args.experiment or ([] if args.head else list(PRESETS))
    if presets:
        print(COLUMNS + "\n" + "|---" * COLUMNS.count(" | ") + "|---|", flush=True)
    for name in presets:
        reset_compile_state()
        b = build(compose(name, args.device, args.toy, args.set))
        peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops(b.rt.device)
        warmup = args.warmup or (1 if args.toy else 2)
        for row in bench_preset(name, b, args.steps, warmup, peak):
            print(format_row(row), flush=True)
        del b
    rt = init_runtime(args.device, "none")
    if args.head or (rt.device.type == "cuda" and not args.toy):
        reset_compile_state()
        backend = "inductor" if rt.device.type == "cuda" else "eager"
        shape = HEAD_TOY_SHAPE if args.toy else HEAD_SHAPE
        print_head(bench_head(shape, args.steps, rt, backend))


if __name__ == "__main__":
    main()
