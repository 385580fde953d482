"""Benchmark building one forward's FlexAttention masks: token-level vs block-level.

(a) `create_block_mask` evaluating the rule of `model/masks.py` at every (query, key) pair,
    once per window kind, as the model built its masks before; (a') the same call compiled
    (`torch.compile(create_block_mask)`, which evaluates the rule tile by tile without
    materialising it; its first call, the compile, is not timed); (b) `build_masks(impl=
    "flex")`, which derives both masks from per-block document bounds. All build the long (N)
    and short (⌊N/2⌋) masks one forward needs, from token ids with an EOT every
    ~`--doc-length` tokens; times include the document ids. (a) materialises T² mask values
    (10.8 GB of host memory at 32,768 tokens, growing as T²), so `--reference-max-tokens`
    skips it above a length (default 32,768 on a CPU). `--token-window`: the 2025-11 record's
    token-granular windows (i − j ≤ W with W = block·N tokens) instead of whole blocks.

    python scripts/bench/block_mask.py                          # 49,152 tokens, window 14
    python scripts/bench/block_mask.py --tokens 8192 16384 32768 --reference-max-tokens 32768
    python scripts/bench/block_mask.py --device cuda
    python scripts/bench/block_mask.py --token-window --window 13
"""

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from model.masks import EOT, build_masks, document_ids, window_lengths

KINDS = ("long", "short")


def token_ids(tokens: int, doc_length: int, device: torch.device) -> Tensor:
    """One packed row with EOTs at random positions, on average every `doc_length` tokens."""
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, EOT, (1, tokens), generator=gen)
    idx[0, torch.randint(0, tokens, (max(1, tokens // doc_length),), generator=gen)] = EOT
    return idx.to(device)


def token_level(
    idx: Tensor, window: Tensor, block: int, compiled: bool = False, tokens: bool = False
) -> dict[str, object]:
    """The masks as `create_block_mask` builds them from the per-element rule (`tokens`: the
    token-granular window)."""
    from torch.nn.attention.flex_attention import create_block_mask

    if compiled:
        create_block_mask = _compiled_create_block_mask()
    docs, lengths = document_ids(idx), window_lengths(window)

    def rule(n: Tensor) -> Callable:
        def allowed(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            near = q - kv <= n * block if tokens else q // block - kv // block <= n - 1
            return (q >= kv) & near & (docs[b, q] == docs[b, kv])

        return allowed

    B, T = idx.shape
    return {
        kind: create_block_mask(rule(lengths[kind]), B, None, T, T, idx.device, BLOCK_SIZE=block)
        for kind in KINDS
    }


@functools.cache
def _compiled_create_block_mask() -> Callable:
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


def block_level(idx: Tensor, window: Tensor, block: int, tokens: bool = False) -> dict[str, object]:
    if tokens:  # the forward's arguments: the long and short windows in tokens
        n = window_lengths(window)
        return build_masks(idx, True, set(KINDS), n["long"] * block, block, "flex", True,
                           n["short"] * block)  # fmt: skip
    return build_masks(idx, True, set(KINDS), window, block, "flex")


def median_ms(build: Callable, idx: Tensor, window: Tensor, block: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        if idx.device.type == "cuda":
            torch.cuda.synchronize(idx.device)
        t0 = time.perf_counter()
        build(idx, window, block)
        if idx.device.type == "cuda":
            torch.cuda.synchronize(idx.device)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[49152])
    parser.add_argument("--window", type=int, default=14, help="N in blocks (long layers)")
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--doc-length", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=20, help="repetitions of (b)")
    parser.add_argument("--reference-reps", type=int, default=3, help="repetitions of (a)")
    parser.add_argument(
        "--reference-max-tokens", type=int, default=None,
        help="skip (a) above this length (default: 32,768 on a CPU, none on CUDA)",
    )  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--token-window", action="store_true", help="token-granular windows of block·N tokens"
    )
    args = parser.parse_args()
    reference = functools.partial(token_level, tokens=args.token_window)
    compiled = functools.partial(token_level, compiled=True, tokens=args.token_window)
    blockwise = functools.partial(block_level, tokens=args.token_window)
    device = torch.device(args.device)
    window = torch.tensor(args.window, device=device)
    for build in (reference, blockwise):  # load lazily imported code before timing
        build(token_ids(1024, args.doc_length, device), window, args.block)
    kind = "token-granular" if args.token_window else "whole blocks"
    print(f"device {device}, threads {torch.get_num_threads()}, window {args.window} blocks "
          f"of {args.block} ({kind}), an EOT every ~{args.doc_length} tokens\n")  # fmt: skip
    limit = args.reference_max_tokens
    if limit is None and device.type == "cpu":
        limit = 32768
    print("| tokens | (a) create_block_mask, ms | (a') compiled, ms | (b) block-level, ms "
          "| (a)/(b) | (a')/(b) |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    for tokens in args.tokens:
        idx = token_ids(tokens, args.doc_length, device)
        ours = median_ms(blockwise, idx, window, args.block, args.reps)
        compiled(idx, window, args.block)  # compile for this length: untimed
        comp = median_ms(compiled, idx, window, args.block, args.reference_reps)
        if limit is not None and tokens > limit:
            ref_ms, ref_ratio = f"skipped (> {limit:,} tokens)", "—"
        else:
            ref = median_ms(reference, idx, window, args.block, args.reference_reps)
            ref_ms, ref_ratio = f"{ref:,.0f}", f"{ref / ours:,.0f}×"
        print(f"| {tokens:,} | {ref_ms} | {comp:,.0f} | {ours:.2f} | {ref_ratio} "
              f"| {comp / ours:,.0f}× |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
