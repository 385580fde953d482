"""The mixture of experts against the dense MLP it replaces: one layer's forward and backward.

    python -m scripts.bench.moe_step                       # the tiny model's layer, on a CPU
    python -m scripts.bench.moe_step --d 768 --tokens 16384 --device cuda

Both layers see the same tokens: the dense ReLU² MLP (4·d wide) and `model.mlp.experts` E
experts of 4·d / top_k, top_k per token (each token meets as many weights in both), with
their weights drawn at random (the proj stacks too, so that every expert computes). The two
are timed in alternation, so that a machine's drift reaches both, and the ratio of medians
is the figure (docs/sweeps.md quotes it).
"""

import argparse
import statistics
import time

import torch
from torch import nn

from model import ModelConfig
from model.layers import MLP
from model.moe import MoE


def layer_step(layer: nn.Module, x: torch.Tensor) -> float:
    """Seconds of one forward and backward of `layer` over `x` (a CPU or synchronised GPU)."""
    if x.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    layer(x).square().sum().backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=128, help="model.n_embd")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens a step (B·T)")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    cfg = ModelConfig(n_embd=args.d, n_head=max(1, args.d // 64))
    cfg.mlp.experts, cfg.mlp.top_k = args.experts, args.top_k
    torch.manual_seed(0)
    layers = {"dense": MLP(ModelConfig(n_embd=args.d, n_head=cfg.n_head)), "experts": MoE(cfg)}
    for layer in layers.values():
        layer.to(device).train()
        for p in layer.parameters():
            nn.init.normal_(p, std=args.d**-0.5)
    x = torch.randn(args.tokens, args.d, device=device, requires_grad=True)
    times: dict[str, list[float]] = {name: [] for name in layers}
    for step in range(args.steps + 3):  # 3 warm-up rounds
        for name, layer in layers.items():
            seconds = layer_step(layer, x)
            if step >= 3:
                times[name].append(seconds)
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    print(f"d {args.d}, {args.tokens} tokens, {args.experts} experts of "
          f"{4 * args.d // args.top_k} (top {args.top_k}) against one MLP of {4 * args.d}, "
          f"{device}; median of {args.steps}")  # fmt: skip
    for name, ms in medians.items():
        print(f"  {name:<8} {ms:8.2f} ms")
    print(f"  experts / dense: {medians['experts'] / medians['dense']:.2f}x")


if __name__ == "__main__":
    main()
