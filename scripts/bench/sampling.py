"""Sampling speed: tokens/s of scripts/sample.py's generation on the default model, three ways
in turns within one run (this machine's noise hits each alike):

    python scripts/bench/sampling.py                       # the default model, 200 tokens
    python scripts/bench/sampling.py --model gpt2_124m --tokens 100

- whole:  each token reruns the cropped context and computes its (B, T, vocab) logits, of
          which it keeps the last row (sampling as it was before the cache);
- last:   the same forward, the logits of the last position only (`last=True`);
- cached: the new token alone beside a KV cache of the others, last position only (the
          default; model/kv_cache.py).

The weights are random (speed does not depend on them), the prompt is empty (one EOT), the
context is the training length (the default run's 256 tokens). Prints a table: the median
tokens/s of each way over the rounds and its ratio to `whole`.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from data.tokenizer import GPT2_VOCAB_SIZE
from model import GPT, ModelConfig
from model.masks import EOT
from scripts.sample import generate

MODELS = {  # the model presets' shapes (conf/model/)
    "tiny": {},
    "gpt2_124m": {"n_layer": 12, "n_head": 6, "n_embd": 768},
}


@torch.no_grad()
def whole_context(
    model: GPT, idx: torch.Tensor, new: int, generator: torch.Generator, context: int
) -> torch.Tensor:
    """Sampling before the cache: every position's logits of the cropped context, per token."""
    for _ in range(new):
        logits = model(idx[:, -context:])[:, -1, :GPT2_VOCAB_SIZE].float()
        probs = torch.softmax(logits / 0.8, dim=-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return idx


def tokens_per_s(way: str, model: GPT, new: int, context: int) -> float:
    prompt, g = torch.tensor([[EOT]]), torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    if way == "whole":
        whole_context(model, prompt, new, g, context)
    else:
        generate(model, prompt, new, 0.8, 0, g, context, {}, cached=way == "cached")
    return new / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=list(MODELS), default="tiny")
    p.add_argument("--tokens", type=int, default=200, help="new tokens per sample (200)")
    p.add_argument("--context", type=int, default=256, help="the training length (256)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    model = GPT(ModelConfig(**MODELS[args.model])).eval()
    ways = ("whole", "last", "cached")
    rates: dict[str, list[float]] = {w: [] for w in ways}
    tokens_per_s("cached", model, 8, args.context)  # warm-up: first-call allocations
    for _ in range(args.rounds):
        for way in ways:
            rates[way].append(tokens_per_s(way, model, args.tokens, args.context))
    base = statistics.median(rates["whole"])
    print(f"{args.model}, {args.tokens} new tokens, context {args.context}, "
          f"{torch.get_num_threads()} threads, median of {args.rounds} rounds")  # fmt: skip
    print("| way | tokens/s | vs whole |\n|---|---:|---:|")
    for way in ways:
        rate = statistics.median(rates[way])
        print(f"| {way} | {rate:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
