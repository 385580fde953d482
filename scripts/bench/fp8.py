"""The FP8 head's three products on a CPU: the emulation the model runs (model/fp8.py) against
torch's CPU FP8 kernel (`torch._scaled_mm`) and the bf16 and fp32 matmuls, at the record
head's shape (tokens × 768 → 50,304).

    python scripts/bench/fp8.py                   # 1,024 tokens, this machine's threads
    python scripts/bench/fp8.py --tokens 4096 --threads 1

The products: forward X₈·W₈ᵀ (e4m3 × e4m3 → bf16), ∂X = G₈·W₈ (e5m2 × e4m3 → bf16) and
∂W = X₈ᵀ·G₈ (e4m3 × e5m2 → fp32). Each time is the median of --repeats calls. torch's FP8
kernel costs minutes per call on some CPUs (Intel with AMX), so it is timed at growing token
counts (16, 64, 256, ...) until one call passes --cap seconds; a GEMM's cost is linear in the
tokens, so the full shape's time is extrapolated from the most tokens timed, and the table says
so. Ratios are against the emulation, measured in the same run.
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from model.fp8 import emulated_scaled_mm

D, VOCAB = 768, 50304  # the record head's width and padded vocabulary
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def seconds(fn: Callable[[], Tensor], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def products(tokens: int) -> dict[str, tuple[Tensor, Tensor, torch.dtype]]:
    """The head's three FP8 products as (a, b, out dtype), in the layouts the GEMM takes."""
    g = torch.Generator().manual_seed(0)
    x8 = (torch.randn(tokens, D, generator=g) * 8).to(E4M3)
    w8 = (torch.randn(VOCAB, D, generator=g) * 8).to(E4M3)
    g8 = (torch.randn(tokens, VOCAB, generator=g) * 8).to(E5M2)
    return {
        "forward X·Wᵀ": (x8, w8.T, torch.bfloat16),
        "∂X = G·W": (g8, w8.T.contiguous().T, torch.bfloat16),
        "∂W = Xᵀ·G": (x8.T.contiguous(), g8.T.contiguous().T, torch.float32),
    }


def kernel_seconds(name: str, tokens: int, cap: float, repeats: int) -> tuple[float, int]:
    """torch._scaled_mm's seconds for product `name` at `tokens`, and the tokens it was timed
    at (fewer when a call at fewer passed `cap`: then extrapolated, linearly in the tokens)."""
    one = torch.tensor(1.0)
    n = min(16, tokens)
    while True:
        a, b, out = products(n)[name]
        t = seconds(
            lambda a=a, b=b, out=out: torch._scaled_mm(
                a, b, scale_a=one, scale_b=one, out_dtype=out
            ),
            repeats if n == tokens else 1,
        )
        if n == tokens or t > cap:
            return t * tokens / n, n
        n = min(tokens, n * 4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cap", type=float, default=2.0, help="seconds per call of torch's kernel")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads; head {args.tokens:,} × {D} → {VOCAB:,}\n"
    )
    print(
        "| product | emulated ms | torch._scaled_mm ms | bf16 matmul ms | fp32 matmul ms "
        "| _scaled_mm / emulated | emulated / bf16 |\n|---|---|---|---|---|---|---|"
    )
    one = torch.tensor(1.0)
    for name, (a, b, out) in products(args.tokens).items():
        emu = seconds(
            lambda a=a, b=b, out=out: emulated_scaled_mm(a, b, one, one, out), args.repeats
        )
        kernel, timed_at = kernel_seconds(name, args.tokens, args.cap, args.repeats)
        ab, bb = a.bfloat16(), b.bfloat16()
        bf16 = seconds(lambda ab=ab, bb=bb: ab @ bb, args.repeats)
        af, bf = a.float(), b.float()
        fp32 = seconds(lambda af=af, bf=bf: af @ bf, args.repeats)
        note = "" if timed_at == args.tokens else f" (from {timed_at:,} tokens)"
        print(
            f"| {name} | {emu * 1e3:.1f} | {kernel * 1e3:,.1f}{note} | {bf16 * 1e3:.1f} "
            f"| {fp32 * 1e3:.1f} | {kernel / emu:,.1f}× | {emu / bf16:.2f}× |",
            flush=True,
        )


if __name__ == "__main__":
    main()
