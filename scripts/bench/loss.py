"""Benchmark the fused softcapped cross-entropy against the plain formula, forward + backward.

Both compute the same loss and gradient (tests/unit/test_loss.py checks it); the ratio is the
plain form's time over ours, measured in the same process with interleaved repetitions.

    python scripts/bench/loss.py                    # 2048 tokens x 50304 vocab, as the default run
    python scripts/bench/loss.py --tokens 8192 --device cuda
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from model.loss import softcap_cross_entropy


def plain(logits: torch.Tensor, targets: torch.Tensor, cap: float) -> torch.Tensor:
    return F.cross_entropy(cap * torch.tanh(logits.float() / cap), targets)


def timed(fn, logits: torch.Tensor, targets: torch.Tensor, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn(logits, targets, 30.0).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    logits.grad = None
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(args.tokens, args.vocab, generator=gen) * 10).to(device)
    logits.requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(device)
    fns = {"plain": plain, "fused": softcap_cross_entropy}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for rep in range(args.reps + 1):
        order = list(fns.items()) if rep % 2 == 0 else list(fns.items())[::-1]
        for name, fn in order:
            ms = timed(fn, logits, targets, device)
            if rep > 0:  # the first round warms up allocators and caches
                times[name].append(ms)
    plain_ms, fused_ms = (statistics.median(times[n]) for n in ("plain", "fused"))
    print(f"device {device}, threads {torch.get_num_threads()}, {args.tokens} x {args.vocab}")
    ratio = plain_ms / fused_ms
    print(f"plain {plain_ms:.1f} ms | fused {fused_ms:.1f} ms | plain/fused {ratio:.2f}x")


if __name__ == "__main__":
    main()
