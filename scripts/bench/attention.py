"""Record #89's attention on one GPU: the varlen flash kernel (model.attention.impl=varlen,
model/varlen.py) against FlexAttention over the block mask (impl=flex, model/masks.py), in the
same run, forward and backward of one layer's heads at a stage's shape, masks included.

    python scripts/bench/attention.py                       # stage 1: 16,384 tokens, W 384
    python scripts/bench/attention.py --tokens 49152 --window 1408 --paired

The tokens are one packed row whose documents are pieces of at most --piece tokens (the
record's cap: 896 in stage 1, 2,048 after), as the loader cuts them; heads 6 × 128 in bf16,
the record's. Both paths compute the same mask (checked: outputs to bf16 rounding), FlexAttention
compiled as the model compiles it. Each time is the median of --repeats after warm-up; the
line to read is the ratio varlen / flex. It needs CUDA and a torch whose varlen_attn takes
window_size; elsewhere it says so and exits.
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from model.attend import attend
from model.masks import EOT, build_masks
from model.varlen import varlen_masks, varlen_support


def packed_row(tokens: int, piece: int, device: torch.device) -> torch.Tensor:
    """One row of pieces of random length up to `piece`, each opened by an EOT."""
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 50000, (1, tokens), generator=g)
    at = 0
    while at < tokens:
        idx[0, at] = EOT
        at += int(torch.randint(64, piece + 1, (1,), generator=g))
    return idx.to(device)


def timed(fn, repeats: int) -> float:
    """Median ms of fn() (forward and backward) over `repeats`, after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--window", type=int, default=384, help="W in tokens (i − j ≤ W)")
    ap.add_argument("--piece", type=int, default=896)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--paired", action="store_true", help="a paired layer: 2T positions")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if (why := varlen_support(device)) is not None:
        raise SystemExit(f"attention.py needs the varlen kernel: {why}")
    idx = packed_row(args.tokens, args.piece, device)
    window = torch.tensor(args.window, device=device)
    paired = frozenset({"long"}) if args.paired else frozenset()
    kinds = set() if args.paired else {"long"}
    key = "paired_long" if args.paired else "long"
    T = 2 * args.tokens if args.paired else args.tokens
    H = args.heads // 2 if args.paired else args.heads
    q, k, v = (
        torch.randn(1, H, T, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    scale = 0.12

    def flex() -> torch.Tensor:
        masks = build_masks(idx, True, kinds, window, 128, "flex", True, window, paired)
        return attend(q, k, v, masks[key], torch.tensor(scale, device=device))

    def varlen() -> torch.Tensor:
        capacity = args.tokens // 64 + 1
        masks = varlen_masks(
            idx, True, kinds, paired, {"long": args.window}, capacity, 2 * args.piece
            if args.paired else args.piece,
        )  # fmt: skip
        return attend(q, k, v, masks[key], scale)

    a, b = flex(), varlen()
    torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)
    grad = torch.randn_like(a)
    ms = {
        name: timed(lambda fn=fn: fn().backward(grad), args.repeats)
        for name, fn in (("flex", flex), ("varlen", varlen))
    }
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}: {args.tokens} tokens, "
          f"W {args.window}, pieces ≤ {args.piece}{', paired' if args.paired else ''}")  # fmt: skip
    print(f"flex   {ms['flex']:.3f} ms (forward + backward, masks included)")
    print(f"varlen {ms['varlen']:.3f} ms")
    print(f"varlen / flex = {ms['varlen'] / ms['flex']:.3f}")


if __name__ == "__main__":
    main()
