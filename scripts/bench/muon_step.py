"""Benchmark one Muon step: optim.Muon against torch.optim.Muon on GPT-shaped matrices.

Both run the same math on identical parameters and gradients (classic coefficients, 5
Newton–Schulz steps, Nesterov, lr scale "original"); the reported ratio is torch's time over
ours, measured in the same process. Repetitions of the two optimizers are interleaved and the
medians compared, so drifting clocks or background load hit both alike.

    python scripts/bench/muon_step.py                      # tiny model on CPU, all shapes on CUDA
    python scripts/bench/muon_step.py --shapes 124m --device cuda --steps 20
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from optim.muon.newton_schulz import ns_flops
from optim.muon.optimizer import Muon


def gpt_shapes(n_layer: int, d: int) -> list[tuple[int, int]]:
    """The hidden matrices of a GPT block stack: q, k, v, o (d×d), fc (4d×d), proj (d×4d)."""
    return [(d, d)] * 4 * n_layer + [(4 * d, d), (d, 4 * d)] * n_layer


# "tiny" is the default model preset (conf/model/tiny.yaml), "124m" GPT-2 small.
SHAPE_SETS = {"tiny": gpt_shapes(4, 128), "124m": gpt_shapes(12, 768)}


def timed_step(opt: torch.optim.Optimizer, device: torch.device) -> float:
    """Milliseconds of one `opt.step()`, the device synchronised on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1000


def bench(shapes: list[tuple[int, int]], steps: int, warmup: int, device: torch.device) -> dict:
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=gen) for s in shapes]
    grads = [torch.randn(s, generator=gen).to(device) for s in shapes]
    ours_params = [p.clone().to(device).requires_grad_() for p in start]
    fp32_params = [p.clone().to(device).requires_grad_() for p in start]
    torch_params = [p.clone().to(device).requires_grad_() for p in start]
    for ps in (ours_params, fp32_params, torch_params):
        for p, g in zip(ps, grads, strict=True):
            p.grad = g  # the same gradient every step: only the optimizer is timed
    kw = {"lr": 0.02, "momentum": 0.95, "nesterov": True, "weight_decay": 0.0, "ns_steps": 5}
    # torch's arrangement of the iteration; scripts/bench/ns.py compares the forms
    ours_kw = {"ns_form": "factored"}
    ours = Muon(ours_params, lr_scale="original", ns_coefficients="classic", **ours_kw, **kw)
    # What optim.muon.ns_dtype=auto picks on a CPU without native bf16 (not the same rounding).
    ours_fp32 = Muon(fp32_params, ns_dtype=torch.float32, **ours_kw, **kw)
    ref = torch.optim.Muon(torch_params, adjust_lr_fn="original", **kw)
    opts = {"ours": ours, "ours_fp32": ours_fp32, "torch": ref}
    for _ in range(warmup):
        for opt in opts.values():
            opt.step()
    times: dict[str, list[float]] = {name: [] for name in opts}
    for rep in range(steps):
        order = list(opts.items())
        for name, opt in order if rep % 2 == 0 else order[::-1]:
            times[name].append(timed_step(opt, device))
    # Same math: after the same number of steps the two agree up to bf16 rounding.
    diff = max(
        ((a - b).norm() / (b - p0.to(device)).norm()).item()
        for a, b, p0 in zip(ours_params, torch_params, start, strict=True)
    )
    return {
        "torch_ms": statistics.median(times["torch"]),
        "ours_ms": statistics.median(times["ours"]),
        "fp32_ms": statistics.median(times["ours_fp32"]),
        "gflop": sum(ns_flops(s, 5) for s in shapes) / 1e9,
        "rel_diff": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per optimizer")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument(
        "--shapes",
        choices=["tiny", "124m", "all"],
        help="default: all on CUDA, tiny on CPU (a torch.optim.Muon step of the 124M shapes "
        "takes minutes there)",
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shapes = args.shapes or ("all" if device.type == "cuda" else "tiny")
    names = list(SHAPE_SETS) if shapes == "all" else [shapes]

    print(f"device {device}, threads {torch.get_num_threads()}, torch {torch.__version__}")
    print(f"{args.steps} timed steps after {args.warmup} warmup; medians in ms per step")
    print("torch = torch.optim.Muon (bf16, one matrix at a time); ours = optim.Muon, bf16,")
    print("batched by shape (same math); ours fp32 = optim.Muon with ns_dtype=fp32")
    header = f"{'shapes':<6} {'matrices':>8} {'NS GFLOP':>9} {'torch ms':>10} {'ours ms':>9}"
    print(f"{header} {'torch/ours':>10} {'rel diff':>9} {'ours fp32 ms':>13} {'torch/fp32':>10}")
    for name in names:
        r = bench(SHAPE_SETS[name], args.steps, args.warmup, device)
        print(
            f"{name:<6} {len(SHAPE_SETS[name]):>8} {r['gflop']:>9.1f} {r['torch_ms']:>10.1f} "
            f"{r['ours_ms']:>9.1f} {r['torch_ms'] / r['ours_ms']:>9.2f}x {r['rel_diff']:>9.4f} "
            f"{r['fp32_ms']:>13.1f} {r['torch_ms'] / r['fp32_ms']:>9.2f}x"
        )


if __name__ == "__main__":
    main()
