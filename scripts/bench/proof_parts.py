"""The parts of the GPU proof (`scripts/bench/gpu_proof.py`), each a function that measures one
thing and returns it as plain data. The proof runs each part in a process of its own, under
that part's time cap; `--toy` makes every part tiny, so a CPU runs all of them in seconds.

- a record preset or the dense 124M model: `scripts/bench/gpu.py`'s rows (one GPU's share of
  the global batch, compiled, at the first, middle and last window or batch phase; record #89
  as one GPU of 8, with rank 0's share of its sharded optimizer, and a profile of its steps);
- the optimizer step alone at record #89's shapes, eager against compiled, on one GPU and as
  rank 0 of 8 (`scripts/bench/optim_step.py`);
- the LM head alone, FP8 against bf16;
- ddp, fsdp and ddp with `optim.offload=true`, each a short train.py run on random tokens;
- a real run of the newest preset on the sample corpus, whose held-out validation loss must
  fall by a stated margin and stay near its training loss (a memorising run fails), finite;
- the environment: torch, CUDA, the device, the date, the code's commit.
"""

import json
import math
import os
import statistics
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from scripts.bench.gpu import HEAD_SHAPE, HEAD_TOY_SHAPE, bench_preset, build, compose, hydra_config
from scripts.bench.head import bench_head
from scripts.bench.presets import PARTS
from trainer.launch.compile import reset_compile_state
from trainer.observe.flops import peak_flops
from trainer.observe.provenance import code_version
from trainer.runtime import init_runtime

NEWEST = "record_2026_07_17"
MEDIUM = "record_medium_2025_12_31"
PRESETS = ("record_2024_11_06", "record_2025_01_26", "record_2025_11_29", NEWEST, MEDIUM,
           "dense_124m")  # fmt: skip
# The presets measured as one GPU of a W-GPU run (`--world`: rank 0's share of the sharded
# optimizer), and profiled (a file beside the proof's results)
WORLDS = {NEWEST: 8, MEDIUM: 8}
# The stages (1-based) a preset's rows measure unless --stages says: record_medium_2025_12_31's four
# batch sizes and its last stage (the longest window), not all twelve stages' compiles
STAGES = {MEDIUM: [1, 2, 3, 4, 12]}
PROFILED = (NEWEST,)
OPTIMIZER_WORLDS = (1, 8)  # the optimizer part's rows: one GPU's whole step, rank 0's of 8
TOY_WORLDS = (8,)  # at toy size the plumbing of both: LocalView's, and the modes' turns
# Timed steps and warm-up steps per window of a preset (at toy size: one each)
STEPS, WARMUP = 5, 1
HEAD_STEPS = 10
# At toy size the presets run eagerly: the proof's plumbing, in seconds (the compile's graphs,
# breaks and recompiles at toy size: tests/e2e/test_static_compile.py)
TOY_SETS = ["model.compile=false", "optim.compile_backend=eager"]
# The strategy runs: GPT-2 small on random tokens, eager (the comparison, not the compile)
STRATEGY_RUN = ["experiment=synthetic_throughput", "model.compile=false"]
STRATEGY_STEPS = ["train.steps=12"]  # at toy size (`size=toy`): the toy's 4
STRATEGIES = {
    "ddp": [],
    "fsdp": ["dist.parallelism=fsdp_gather"],
    "ddp + offload": ["optim.offload=true"],
}
UNTIMED = 2  # the strategy runs' first steps, left out of the median (warm-up)
# The real run: the newest preset, one sequence per step (one GPU, no accumulation), 100 steps:
# 90 in the three stages and the 10 extension steps, the split of the head (the record's 921 =
# 2 * 460 + 1) and the momentum warm-up and cooldown (300 and 50 of 1,380) scaled to 90.
# Its stages are 1/16 of the record's lengths and its pieces whole documents (a cap of 65,536
# tokens): the sample corpus's 96 training documents then serve 74 steps before the first
# wrap, 1.6 passes in all, where the record's lengths and caps served 4 distinct batches and
# 52 passes, so the training loss measured memorisation. Validation is one 49,152-token
# sequence (the sample corpus holds ~50k validation tokens).
REAL_RUN = [
    f"experiment={NEWEST}", "data=sample", "train.steps=100", "train.batch_size=1",
    "train.seq_len=3072", "data.max_piece_len=65536",
    "train.stages.rows.0={seq_len:1024,max_piece_len:65536}",
    "train.stages.rows.1={seq_len:2048,max_piece_len:65536}",
    "train.stages.rows.2={seq_len:3072,max_piece_len:65536}",
    "train.val_every=50", "train.val_tokens=49152", "train.log_every=10",
    "optim.tie_embed_head_until=61", "optim.muon.momentum_warmup_steps=20",
    "optim.muon.momentum_cooldown_steps=3",
]  # fmt: skip
REAL_TOY = [f"experiment={NEWEST}", "size=toy"]  # its 11 layers at width 48: 6 + 2 steps
# What the real run must show on held-out text (nats): the validation loss falls by at least
# VAL_DROP from its first evaluation, and ends at most GAP above the training loss (the mean of
# the last tenth of the steps). A run that memorises repeated batches drives the training loss
# far below the validation loss: the gap catches it even where validation falls a little.
# At toy size (8 steps at width 48) both are smaller: there the toy falls 0.46 with a gap of
# -0.02, and the same toy on pieces of 8 tokens (6 passes) falls 0.29 with a gap of 0.94.
VAL_DROP, GAP = 1.0, 1.0
VAL_DROP_TOY, GAP_TOY = 0.2, 0.5
QUIET = ["train.checkpoint_every=0", "train.checkpoint_at_end=false"]


def preset(
    name: str, device: str, toy: bool, partial: Path | None = None,
    stages: list[int] | None = None, evaluation: bool = True, sets: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """A preset's compiled step at its representative windows and batch phases (`stages`,
    1-based: some of them), with the Hydra overrides `sets`; the rows so far go to `partial`
    (JSON) as each is measured, for a proof that stops the part; `evaluation`: its graph
    compiled last. The result names the overrides beside the rows."""
    reset_compile_state()
    stages = stages or STAGES.get(name)
    b = build(
        compose(name, device, "toy" if toy else "full", [*(TOY_SETS if toy else []), *sets]),
        WORLDS.get(name),
    )
    where = None
    if partial is not None and name in PROFILED:
        where = partial.parent / f"profile_{name}.txt"

    def keep(rows: list[dict]) -> None:
        if partial is not None:  # whole or not at all: the proof may stop this process
            tmp = partial.with_name(partial.name + ".tmp")
            tmp.write_text(json.dumps({"rows": rows}))
            os.replace(tmp, partial)

    rows = bench_preset(name, b, 1 if toy else STEPS, WARMUP, peak_flops(b.rt.device), keep,
                        where, stages, evaluation)  # fmt: skip
    return {"rows": rows, "sets": list(sets)} if sets else {"rows": rows}


def optimizer(device: str, toy: bool) -> dict[str, Any]:
    """The optimizer step alone at the newest preset's shapes: eager and compiled, normal
    and Adam steps, on one GPU and as rank 0 of 8."""
    from scripts.bench.optim_step import bench

    conf = compose(NEWEST, device, "toy" if toy else "full", TOY_SETS if toy else [])
    rt = init_runtime(device, "none")
    rows = []
    for world in TOY_WORLDS if toy else OPTIMIZER_WORLDS:
        reset_compile_state()
        backend = "eager" if toy else "inductor"  # the toy traces only: the plumbing
        out = bench(conf, rt, 2 if toy else 10, 2 if toy else 4, world, backend)
        rows += [{"world": world, "mode": mode, **s} for mode, s in out.items()]
    return {"rows": rows}


def head(device: str, toy: bool) -> dict[str, Any]:
    """The LM head's forward and backward, compiled, FP8 against bf16."""
    rt = init_runtime(device, "none")
    backend = "inductor" if rt.device.type == "cuda" else "eager"
    shape, steps = (HEAD_TOY_SHAPE, 1) if toy else (HEAD_SHAPE, HEAD_STEPS)
    r = bench_head(shape, steps, rt, backend, warmup=1 if toy else 3)
    tokens, d, vocab = r["shape"]
    return {"rows": [{"shape": f"{tokens:,} × {d} → {vocab:,}", "fp8_ms": r["fp8"] * 1e3,
                      "bf16_ms": r["bf16"] * 1e3, "ratio": r["fp8"] / r["bf16"]}]}  # fmt: skip


def strategies(device: str, toy: bool, data_dir: Path) -> dict[str, Any]:
    """ddp, fsdp and ddp with offloaded optimizer state on one device: median ms per step."""
    rows, base = [], None
    for label, overrides in STRATEGIES.items():
        records = _train(
            [*STRATEGY_RUN, *(["size=toy"] if toy else STRATEGY_STEPS), *overrides],
            device,
            data_dir,
        )
        steps = [r for r in records if r.get("step", 0) > UNTIMED and "step_ms" in r]
        ms = statistics.median(r["step_ms"] for r in steps)
        base = base or ms
        tokens = statistics.median(r["tokens_per_s"] for r in steps)
        rows.append({"run": label, "step_ms": ms, "tokens_per_s": tokens, "vs_ddp": ms / base})
    return {"rows": rows}


def real_run(device: str, toy: bool, data_dir: Path, extra: tuple[str, ...] = ()) -> dict:
    """The newest preset on the sample corpus (`extra`: overrides after the run's own): its
    held-out validation loss must fall by the stated margin, stay near the training loss, and
    every loss must be finite. The row gives the passes over the training data it made."""
    records = _train([*(REAL_TOY if toy else REAL_RUN), *extra], device, data_dir)
    row = learning_row(records, *((VAL_DROP_TOY, GAP_TOY) if toy else (VAL_DROP, GAP)))
    return {"rows": [row], "ok": row["ok"]}


def learning_row(records: list[dict], drop: float, gap_allowed: float) -> dict[str, Any]:
    """The real run's row from its metrics records; `ok` is the held-out check (real_run)."""
    steps = [r for r in records if "train_loss" in r]
    train = [r["train_loss"] for r in steps]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    finite = all(x is not None and math.isfinite(x) for x in train + [v for _, v in val])
    k = max(1, len(train) // 10)
    first, last = statistics.mean(train[:k]), statistics.mean(train[-k:])
    fell, gap = val[0][1] - val[-1][1], val[-1][1] - last
    epochs = [r.get("epoch", 0) for r in steps]
    wraps = [r["step"] for r, e in zip(steps[1:], epochs[1:], strict=True) if e != epochs[0]]
    return {
        "experiment": NEWEST, "steps": len(train), "train_loss_first": first,
        "train_loss_last": last, "val_first": val[0], "val_last": val[-1], "finite": finite,
        "val_drop": fell, "gap": gap, "drop_needed": drop, "gap_allowed": gap_allowed,
        "passes": max(epochs) + 1, "first_wrap": wraps[0] if wraps else None,
        "ok": finite and fell >= drop and gap <= gap_allowed,
        "step_ms": statistics.median(r["step_ms"] for r in records if "step_ms" in r),
    }  # fmt: skip


def environment(device: str) -> dict[str, Any]:
    dev = init_runtime(device, "none").device
    env = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "code": code_version(),
    }
    return {"env": env}


def _train(overrides: list[str], device: str, data_dir: Path) -> list[dict]:
    """train.py's run of `overrides` in a scratch run directory: its metrics records."""
    from trainer.session import run

    with tempfile.TemporaryDirectory() as run_dir:
        conf = hydra_config([
            *overrides, *QUIET, f"train.device={device}", f"run_dir={run_dir}",
            f"data.cache_dir={data_dir}",
        ])  # fmt: skip
        run(conf, PARTS)  # what train.py runs
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]
