"""Benchmark optimizer-state offload (`optim.offload=true`): the step-time cost and the device
memory it frees, against the same optimizer without offload, in the same process.

Two copies of the model (GPT-2 small by default) get the same gradients; each round times one
optimizer step of each, alternating which goes first, and reports medians. "Device" memory is
the storage the optimizer-state tensors hold between steps (on a GPU, what offload returns
to the allocator); offload's copies of it live in (pinned, on CUDA) host memory.

    python scripts/bench/offload.py                       # 124M on this CPU, 5 rounds
    python scripts/bench/offload.py --model tiny --rounds 9
    python scripts/bench/offload.py --device cuda         # PCIe copies on a side stream

On a CPU "offload" is a copy from one CPU buffer to another: the ratio measures the
bookkeeping and memcpy, not PCIe. On a GPU the copies cross PCIe and overlap the other
part's update (optim/offload.py).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from optim.fsdp_rows import local
from scripts.bench.presets import PARTS, hydra_config
from trainer.build import build_run
from trainer.runtime import init_runtime

MODELS = {"tiny": "tiny", "124m": "gpt2_124m"}  # conf/model/


def state_bytes(opt) -> int:
    """Bytes the optimizer-state tensors hold on their device right now."""
    return sum(
        local(t).untyped_storage().nbytes()
        for part in opt.parts
        for s in part.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor) and t.ndim > 0
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=list(MODELS), default="124m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    runs = {}
    for name, offload in (("no offload", False), ("offload", True)):
        conf = hydra_config([f"model={MODELS[args.model]}", f"train.device={args.device}",
                             f"optim.offload={offload}", "run_dir=."])  # fmt: skip
        run = build_run(conf, PARTS, init_runtime(args.device, "none"), data=False)
        model, opt = run.model, run.optimizer  # as train.py builds them
        gen = torch.Generator(device="cpu").manual_seed(1)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen).to(device) * 1e-3
        runs[name] = (model, opt)

    def step(opt) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()  # gradients are kept: every step sees the same ones
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _, opt in runs.values():  # warm-up: allocations, first touch, kernels
        step(opt)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        order = list(runs.items()) if r % 2 == 0 else list(runs.items())[::-1]
        for name, (_, opt) in order:
            times[name].append(step(opt))
    base = statistics.median(times["no offload"])
    n = sum(p.numel() for p in runs["offload"][0].parameters())
    print(
        f"torch {torch.__version__}, {args.model} ({n / 1e6:.1f}M parameters) on {device}, "
        f"medians of {args.rounds} rounds"
    )
    print(f"{'':<12} {'step ms':>8} {'ratio':>7} {'state on device':>16}")
    for name, (_, opt) in runs.items():
        t = statistics.median(times[name])
        mb = state_bytes(opt) / 2**20
        print(f"{name:<12} {t * 1000:>8.0f} {t / base:>6.2f}x {mb:>13.0f} MiB")
    mirrors = sum(m.nbytes for m in runs["offload"][1].offload._mirrors.values()) / 2**20
    print(f"offload's host copies: {mirrors:.0f} MiB")


if __name__ == "__main__":
    main()
