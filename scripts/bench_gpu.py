"""A preset's training step on one GPU, on random tokens: ms/step, tokens/s, MFU, compile time.

    python scripts/bench_gpu.py --experiment record_2024_11_06 record_2025_01_26 [--steps 20]
    python scripts/bench_gpu.py --experiment record_2025_01_26 --toy --device cpu   # smoke test

Each preset runs one GPU's share of its global batch (the records' per-GPU work: 64 × 1024
tokens for the 2024-11 record, one 49,152-token packed sequence for the 2025-01 one) through
the preset's own model, optimizer object and schedules, compiled as the preset says: the
schedule for the step, forward/backward, the update. Random tokens carry an EOT every ~1000
tokens so that document masking has documents to mask. The first step's time is reported
as the compile time; the rest are timed with a device synchronise and their median is the
step. MFU counts 6 FLOPs per parameter per token for the matrices (embedding lookups
excluded) plus the attention scores, 12·layers·d·T per token for causal attention (halved
by the causal mask: 6), against the bf16 dense peak given by --peak-tflops (H100 SXM: 989).
The records' own per-GPU step: 154.8 ms (2024-11, 65,536 tokens) and 100.0 ms (2025-01,
49,152 tokens), from their logs.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from data.tokenizer import EOT
from model import GPT
from optim import build_optimizer
from trainer.config import register_configs, to_config
from trainer.loop import forward_backward
from trainer.runtime import init_runtime

CONF = Path(__file__).resolve().parents[1] / "conf"
RECORD_STEP_MS = {"record_2024_11_06": 154.78, "record_2025_01_26": 100.0}
TOY = ["model.n_layer=2", "model.n_embd=128", "model.n_head=1", "train.seq_len=2048",
       "train.batch_size=1", "train.micro_batch_size=1"]  # fmt: skip


def batch(rows: int, seq_len: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = rng.integers(0, EOT, rows * seq_len + 1)
    tokens[rng.random(tokens.size) < 1e-3] = EOT
    t = torch.from_numpy(tokens)
    return t[:-1].view(rows, seq_len), t[1:].view(rows, seq_len)


def bench(experiment: str, steps: int, device: str, toy: bool, peak: float) -> dict:
    overrides = [f"experiment={experiment}", "run_dir=.", f"train.device={device}"]
    if toy:
        overrides += [*TOY, "model.compile=false"]
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        conf = to_config(compose(config_name="config", overrides=overrides))
    t, m = conf.train, conf.model
    rt = init_runtime(t.device, t.autocast)
    micro = t.micro_batch_size or t.batch_size  # one GPU's share per micro-step
    torch.manual_seed(0)
    model = GPT(m).to(rt.device)
    opt = build_optimizer(model, conf.optim, total_steps=t.steps, device=rt.device)
    fwd = torch.compile(model) if m.compile else model
    rng = np.random.default_rng(0)
    times = []
    for step in range(steps):
        x, y = batch(micro, t.seq_len, rng)
        rt.synchronize()
        t0 = time.perf_counter()
        opt.schedule(step)
        args = {k: torch.tensor(v, dtype=torch.float64, device=rt.device)
                for k, v in opt.schedules.model_args(step).items()}  # fmt: skip
        forward_backward(fwd, (x, y), rt, model_args=args)
        opt.step()
        opt.zero_grad()
        rt.synchronize()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times[1:])
    tokens = micro * t.seq_len
    matrices = sum(
        p.numel() for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n
    )
    attention = 6 * m.n_layer * m.n_embd * t.seq_len  # causal q·k and p·v, fwd + bwd
    flops = (6 * matrices + attention) * tokens
    return {
        "experiment": experiment,
        "tokens": tokens,
        "compile_s": times[0],
        "step_ms": step_s * 1000,
        "tokens_per_s": tokens / step_s,
        "mfu": flops / step_s / (peak * 1e12),
        "record_ms": RECORD_STEP_MS.get(experiment),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", nargs="+", default=list(RECORD_STEP_MS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--toy", action="store_true", help="a tiny model (smoke test, e.g. on CPU)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak")
    args = p.parse_args()
    print("| preset | tokens/step/GPU | 1st step (compile) | ms/step | tokens/s | MFU | record |")
    print("|---|---|---|---|---|---|---|")
    for name in args.experiment:
        r = bench(name, args.steps, args.device, args.toy, args.peak_tflops)
        record = f"{r['record_ms']:.1f}" if r["record_ms"] else "-"
        print(
            f"| {name} | {r['tokens']:,} | {r['compile_s']:.1f} s | {r['step_ms']:.1f} | "
            f"{r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | {record} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
