"""Benchmark record_2026_07_17's loss and logit gradient: torch's ops against the one Triton kernel.

`record_loss_rows` (model/record_loss.py: torch ops, eager and under torch.compile) against
`record_loss_rows_triton` (model/triton_loss.py: one launch, the loss and G₈ together) on the
same bf16 logits, in the same process, repetitions interleaved, medians reported: --rows rows
(default 16,384 a call) of V = 50,304 logits, N(0, 3²) with 1% at ±60 and 1% uniform in ±60,
K = 3 targets a row (weights 1, 0.5, 0.2; the last two positions of every 1,024-token
sequence drop terms), g_s of fp8_scales=fixed_over_448. Prints each one's milliseconds, the
ratio triton/torch, and whether they agree: the share of G₈ bytes that differ from eager
torch's, by how many e5m2 steps, and the loss's relative difference (the bound of
tests/unit/test_triton_loss.py; exit status 1 past it). On a GPU torch divides by C as a
product with fp32(1/C) and computes tanh and exp with CUDA's functions, so its own σ can differ
from the CPU's in a few bf16 steps: the bound is checked against that.

    python scripts/bench/loss_kernel.py                     # 16,384 × 50,304, K = 3
    python scripts/bench/loss_kernel.py --rows 4096 --reps 20 --block 2048

Needs a CUDA GPU. `--device cpu` under TRITON_INTERPRET=1 runs the same code at a toy size
(`--rows 8 --vocab 512 --reps 1 --no-compile`): the script's own check before a GPU session,
whose times mean nothing (the kernel's correctness on a CPU is tests/unit/test_triton_loss.py's).
"""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from model.config import HeadConfig
from model.mtp import shifted_targets
from model.record_loss import record_loss_rows
from model.triton_loss import record_loss_rows_triton
from scripts.bench.kernel_timing import device_name, interleaved_ms, kernel_device

RECORD = HeadConfig(
    softcap=23.0, softcap_form="sigmoid", softcap_shift=5.0, softcap_divisor=7.5,
    loss="sigmoid_e5m2_grad", reduction="sum", fp8=True, mtp=True,
)  # fmt: skip
G_S = 0.75 / 448  # fp8_scales=fixed_over_448's gradient divisor
WEIGHTS = [1.0, 0.5, 0.2]
SEQ_LEN = 1024
MAX_DIFFERING = 1e-4  # as tests/unit/test_triton_loss.py: the share of G₈ bytes that may differ
LOSS_RTOL = 1e-5  # looser than the test's 1e-6: 49,152 terms summed in two orders


def inputs(rows: int, vocab: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator(device).manual_seed(0)
    z = torch.randn(rows, vocab, generator=gen, device=device) * 3
    spots = torch.rand(rows, vocab, generator=gen, device=device)
    z = torch.where(spots < 0.01, 60.0, z)
    z = torch.where((spots >= 0.01) & (spots < 0.02), -60.0, z)
    wide = torch.rand(rows, vocab, generator=gen, device=device) * 120 - 60
    z = torch.where(spots >= 0.99, wide, z).bfloat16()
    del spots, wide
    length = min(SEQ_LEN, rows)
    y = torch.randint(0, vocab, (rows // length, length), generator=gen, device=device)
    weights = torch.tensor(WEIGHTS, device=device)
    return z, shifted_targets(y, len(WEIGHTS)), weights


def e5m2_order(g8: Tensor) -> Tensor:
    """Each e5m2 value's place on the line of e5m2 values (±0 both 0): one step apart = 1."""
    b = g8.view(torch.uint8).int()
    return torch.where(b >= 0x80, -(b & 0x7F), b)


def agreement(name: str, got: tuple[Tensor, Tensor], want: tuple[Tensor, Tensor]) -> bool:
    """Prints how `got` (loss, G₈) differs from `want`; whether within the bound."""
    (loss, g8), (want_loss, want_g8) = got, want
    differs = int((g8.float() != want_g8.float()).sum())
    steps = int((e5m2_order(g8) - e5m2_order(want_g8)).abs().max())
    rel = abs(loss.item() / want_loss.item() - 1)
    ok = differs <= MAX_DIFFERING * g8.numel() and steps <= 1 and rel <= LOSS_RTOL
    print(
        f"{name} vs eager torch: G₈ bytes differing {differs:,} of {g8.numel():,} "
        f"({differs / g8.numel():.1e}), at most {steps} e5m2 step(s); loss relative "
        f"difference {rel:.1e} | {'agree' if ok else 'DISAGREE'}"
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16384, help="rows a call (the chunk)")
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--block", type=int, default=None, help="the kernel's logits a step")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile's form")
    parser.add_argument("--device", default="cuda", help="cpu: a toy check, interpreted")
    args = parser.parse_args()
    device = kernel_device("loss_kernel.py", args.device, "tests/unit/test_triton_loss.py")
    z, shifted, weights = inputs(args.rows, args.vocab, device)
    fns: dict[str, Callable[[], tuple[Tensor, Tensor]]] = {
        "torch eager": lambda: record_loss_rows(z, shifted, weights, RECORD, G_S),
        "triton": lambda: record_loss_rows_triton(
            z, shifted, weights, RECORD, G_S, block=args.block
        ),
    }
    if not args.no_compile:
        compiled = torch.compile(record_loss_rows)
        fns["torch compiled"] = lambda: compiled(z, shifted, weights, RECORD, G_S)
    results = {name: fn() for name, fn in fns.items()}  # compiles, warms caches
    ms = interleaved_ms(fns, args.reps, 1, device)
    gpu = device_name(device)
    print(f"{gpu}: {args.rows:,} rows × {args.vocab:,} logits, K = {len(WEIGHTS)}, medians of "
          f"{args.reps}")  # fmt: skip
    print(" | ".join(f"{name} {t:.2f} ms" for name, t in ms.items()))
    for name in fns:
        if name != "triton":
            print(f"triton / {name}: {ms['triton'] / ms[name]:.2f}")
    ok = agreement("triton", results["triton"], results["torch eager"])
    if "torch compiled" in results:
        agreement("torch compiled", results["torch compiled"], results["torch eager"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
