"""The LM head alone, FP8 against bf16: `python scripts/bench/gpu.py --head` (the rows it
prints come from here)."""

import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from model import ModelConfig
from model.config import update
from model.head import head_logits
from model.layers import linear
from trainer.launch.compile import compile_model
from trainer.runtime import Runtime


def timed(rt: Runtime, fn: Callable[..., object], *args: object) -> float:
    """Seconds `fn(*args)` takes, queued device work included."""
    rt.synchronize()
    t0 = time.perf_counter()
    fn(*args)
    rt.synchronize()
    return time.perf_counter() - t0


class Head(nn.Module):
    """The GPT's LM head alone (a bf16-casting linear), FP8 or bf16 as `head_logits` runs it."""

    def __init__(self, d: int, vocab: int, fp8: bool) -> None:
        super().__init__()
        self.head = linear(update(ModelConfig(n_embd=d), {"numerics.dtype": "bf16"}), d, vocab)
        nn.init.normal_(self.head.weight, std=d**-0.5)
        self.fp8 = fp8

    def forward(self, x: Tensor) -> Tensor:
        return head_logits(self.head, x, self.fp8)


def head_step(head: Head, fn: nn.Module, x: Tensor, grad: Tensor) -> None:
    fn(x).backward(grad)
    x.grad = head.head.weight.grad = None


def bench_head(
    shape: tuple[int, int, int], steps: int, rt: Runtime, backend: str, warmup: int = 3
) -> dict:
    """Median ms of the head's compiled forward and backward, FP8 and bf16, after `warmup`
    calls of each."""
    tokens, d, vocab = shape
    torch.manual_seed(0)
    x = torch.randn(tokens, d, device=rt.device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(tokens, vocab, device=rt.device, dtype=torch.bfloat16) / tokens
    out = {"shape": shape}
    for fp8 in (True, False):
        head = Head(d, vocab, fp8).to(rt.device)
        fn = compile_model(head, backend)

        for _ in range(warmup):
            head_step(head, fn, x, grad)
        times = [timed(rt, head_step, head, fn, x, grad) for _ in range(steps)]
        out["fp8" if fp8 else "bf16"] = statistics.median(times)
    return out


def print_head(r: dict) -> None:
    tokens, d, vocab = r["shape"]
    print("\n| LM head fwd+bwd | FP8 ms | bf16 ms | FP8 / bf16 |\n|---|---|---|---|")
    print(
        f"| {tokens:,} × {d} → {vocab:,} | {r['fp8'] * 1e3:.2f} | {r['bf16'] * 1e3:.2f} "
        f"| {r['fp8'] / r['bf16']:.2f} |",
        flush=True,
    )
