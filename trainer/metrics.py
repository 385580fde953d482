"""Rank-0 output: one console line per step and the curve as data in `metrics.jsonl`.

Console lines go through `logging`, so under Hydra they also land in the run's log file.
Non-main ranks get a sink that does nothing, which keeps `if rank == 0` out of the loop.
"""

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.config import Config
from trainer.runtime import Runtime

log = logging.getLogger("train")

METRICS_FILE = "metrics.jsonl"


class MetricsSink:
    """Appends one JSON object per record to `<run_dir>/metrics.jsonl` and logs a summary."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / METRICS_FILE
        self._file = None
        if enabled:
            # Line-buffered so a killed run keeps every completed line.
            self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def info(self, msg: str, *args: Any) -> None:
        if self.enabled:
            log.info(msg, *args)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def format_step(rec: dict[str, Any], total_steps: int) -> str:
    """The console line for one step: loss, LR, speed, and the val loss when evaluated."""
    parts = [f"step {rec['step']:>{len(str(total_steps))}}/{total_steps}"]
    if "train_loss" in rec:
        parts.append(f"loss {rec['train_loss']:.4f}")
    if "val_loss" in rec:
        parts.append(f"val {rec['val_loss']:.4f}")
    if "lr" in rec:
        parts.append(f"lr {rec['lr']:.3g}")
    if "step_ms" in rec:
        parts.append(f"{rec['step_ms']:.0f} ms/step")
    if "tokens_per_s" in rec:
        parts.append(f"{rec['tokens_per_s']:,.0f} tok/s")
    parts.append(f"train {rec['train_time_ms'] / 1000:.1f}s")
    return " | ".join(parts)


def describe_run(
    conf: Config, rt: Runtime, model: nn.Module, ns_dtype: torch.dtype, accum_steps: int
) -> str:
    """The startup line: model, optimizer, ranks, precision and how a step's tokens split."""
    m, t = conf.model, conf.train
    n_params = sum(p.numel() for p in model.parameters())
    micro = t.batch_size // (rt.world_size * accum_steps)
    exchange = f", exchange {conf.optim.muon.exchange}" if rt.world_size > 1 else ""
    precision = "bf16 autocast" if rt.autocast_dtype else "fp32"
    return (
        f"model {m.n_layer} layers, d {m.n_embd}, {m.n_head} heads: {n_params / 1e6:.2f}M "
        f"parameters | {conf.optim.name} (Newton-Schulz in "
        f"{str(ns_dtype).removeprefix('torch.')}{exchange}) | {rt.world_size} rank(s) on "
        f"{rt.device.type}, {precision} | {t.batch_size * t.seq_len} tokens/step = "
        f"{rt.world_size} ranks x {accum_steps} micro-steps x {micro} x {t.seq_len}"
    )
