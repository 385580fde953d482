"""Benchmark a checkpoint save: milliseconds, megabytes, and its share of training time.

For each model (the default `tiny` and `gpt2_124m`) this builds the model and its optimizers
as `train.py` does, takes a few training steps on synthetic tokens (so every optimizer has its
state), and then, in the same process, times:

    step   one training step at the default batch (train.batch_size x train.seq_len)
    save   `Checkpointer.save`: state dicts, rank-0 write with fsync, atomic rename, keep-K
    load   `Checkpointer.resume` from that checkpoint

The share is save / (train.checkpoint_every x step): the cost of checkpointing at the default
interval, relative to the training time between two saves. Saves go to a temporary directory
on the filesystem holding --dir (default: the system's temporary directory).

    python scripts/bench/checkpoint.py                       # tiny and 124M, 3 saves each
    python scripts/bench/checkpoint.py --models tiny --saves 5
"""

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from scripts.bench.presets import PARTS
from trainer.build import build_run
from trainer.config import Config, to_config
from trainer.forward import forward_backward
from trainer.observe.progress import Progress
from trainer.runtime import init_runtime

CONF = Path(__file__).resolve().parents[2] / "conf"


def config(model: str, run_dir: Path) -> Config:
    merged = OmegaConf.merge(
        OmegaConf.structured(Config),
        {"train": OmegaConf.load(CONF / "train" / "default.yaml")},
        {"model": OmegaConf.load(CONF / "model" / f"{model}.yaml")},
        {"run_dir": str(run_dir), "data": {"source": "synthetic"}},
    )
    return to_config(merged)


def bench(model_name: str, root: Path, saves: int, steps: int) -> dict:
    conf = config(model_name, root / model_name)
    t = conf.train
    run = build_run(conf, PARTS, init_runtime(t.device, t.autocast))  # as train.py builds it
    rt, model, optimizer, schedule = run.rt, run.model, run.optimizer, run.schedule
    step_s = []
    for step in range(steps):
        t0 = time.perf_counter()
        optimizer.set_step(schedule.at(step).optim)
        forward_backward(run.fwd, run.loader.next_batch(), rt)
        optimizer.step()
        optimizer.zero_grad()
        rt.synchronize()
        step_s.append(time.perf_counter() - t0)
    checkpoints = run.checkpoints
    save_s, load_s = [], []
    for i in range(saves):
        t0 = time.perf_counter()
        path = checkpoints.save(Progress(step=steps + i))
        save_s.append(time.perf_counter() - t0)
    size = sum(f.stat().st_size for f in path.iterdir())
    for _ in range(saves):
        t0 = time.perf_counter()
        checkpoints.resume()
        load_s.append(time.perf_counter() - t0)
    step_ms = statistics.median(step_s[1:]) * 1000  # the first step warms up
    save_ms = statistics.median(save_s) * 1000
    return {
        "model": model_name,
        "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
        "MB": size / 1e6,
        "save_ms": save_ms,
        "load_ms": statistics.median(load_s) * 1000,
        "step_ms": step_ms,
        "every": t.checkpoint_every,
        "share": save_ms / (t.checkpoint_every * step_ms),
        "device": f"{rt.device.type}, {'bf16' if rt.autocast_dtype else 'fp32'}",
        "tokens": t.batch_size * t.seq_len,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "gpt2_124m"])
    parser.add_argument("--saves", type=int, default=3, help="saves (and loads) timed, median")
    parser.add_argument("--steps", type=int, default=4, help="training steps timed, median")
    parser.add_argument("--dir", default=None, help="where to write (default: system temp)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = [bench(m, Path(tmp), args.saves, args.steps) for m in args.models]
    print(
        "| model | params | checkpoint | save | load | step (tokens, device) | every "
        "| save / steps between saves |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['params_M']:.1f}M | {r['MB']:.0f} MB | {r['save_ms']:.0f} ms "
            f"| {r['load_ms']:.0f} ms | {r['step_ms']:.0f} ms ({r['tokens']}, {r['device']}) "
            f"| {r['every']} | {r['share']:.2%} |"
        )


if __name__ == "__main__":
    main()
