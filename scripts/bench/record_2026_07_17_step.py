"""One training step (forward and backward) of record_2026_07_17's model at toy size on this
machine: the preset as it runs (`model=record_2026_07`: bf16, the FP8 MLP with delayed scales, the
FP8 head, the record's loss form, multi-token prediction) against the same model with its FP8 and
its loss form off (bf16 matmuls, the autograd loss), measured in the same run.

    python scripts/bench/record_2026_07_17_step.py       # d 96, 11 layers, 2 × 256 tokens
    python scripts/bench/record_2026_07_17_step.py --width 192 --tokens 1024 --threads 1

The FP8 products run through the CPU emulation (model/fp8.py), so the ratio is what the FP8
parts cost here over plain bf16. Each time is the median of --repeats steps after a warm-up.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from model import GPT, ModelConfig
from model.config import update
from stages import Stage, StageTable

PRESET = Path(__file__).resolve().parents[2] / "conf" / "model" / "record_2026_07.yaml"
PLAIN = {"mlp.fp8": "off", "head.fp8": False, "head.loss": "plain", "head.loss_dtype": "fp32"}
# The experiment's windows by stage (its train.stages), which the model's YaRN stages follow;
# the step runs in the first stage (window 3, weights [1, 0.5, 0.25])
STAGES = StageTable(rows=[Stage(window=w) for w in (3, 7, 11)], window_after=13)


def dotted(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        nested = isinstance(value, dict)
        out |= dotted(value, f"{prefix}{key}.") if nested else {prefix + key: value}
    return out


def step_ms(changes: dict, tokens: int, repeats: int) -> float:
    """Median ms of one forward + backward over 2 rows of tokens/2."""
    torch.manual_seed(0)
    cfg = update(ModelConfig(), changes)
    model = GPT(cfg, STAGES).train()
    idx = torch.randint(0, 50257, (2, tokens // 2))
    args = {"window_tokens": torch.tensor(384.0), "short_window_tokens": torch.tensor(128.0),
            "mtp_weights": torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)}  # fmt: skip
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        model(idx, idx.roll(-1, 1), **args).backward()
        if i:  # the first step warms the allocator and the kernels up
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=96, help="model width (6 heads)")
    p.add_argument("--tokens", type=int, default=512, help="tokens per step (2 rows)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    toy = {"n_embd": args.width, "compile": False, "bigram.rows": 1024,
           "bigram.dim": 16, "residual.mudd_hidden": 8}  # fmt: skip
    preset = dotted(OmegaConf.to_container(OmegaConf.load(PRESET))) | toy
    rows = [("the preset (FP8 MLP, FP8 head, record loss)", preset),
            ("baseline: bf16, no FP8, autograd loss", preset | PLAIN)]  # fmt: skip
    times = [step_ms(changes, args.tokens, args.repeats) for _, changes in rows]
    print(f"record_2026_07_17 at d {args.width}, 11 layers, {args.tokens} tokens/step, "
          f"{torch.get_num_threads()} threads; median of {args.repeats} steps")  # fmt: skip
    print("| model | ms/step | vs baseline |\n|---|---|---|")
    for (name, _), ms in zip(rows, times, strict=True):
        print(f"| {name} | {ms:.0f} | {ms / times[1]:.2f}× |")


if __name__ == "__main__":
    main()
