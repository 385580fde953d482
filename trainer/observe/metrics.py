"""Rank-0 output: one console line per step and the curve as data in `metrics.jsonl`.

Console lines go through `logging`, so under Hydra they also land in the run's log file.
Non-main ranks get a sink that does nothing, which keeps `if rank == 0` out of the loop.
"""

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.config import Config
from trainer.observe.progress import Progress
from trainer.observe.wandb_log import WandbRun
from trainer.runtime import Runtime, resolve_param_dtype

log = logging.getLogger("train")

METRICS_FILE = "metrics.jsonl"


class MetricsSink:
    """Appends one JSON object per record to `<run_dir>/metrics.jsonl` and logs a summary."""

    def __init__(
        self,
        run_dir: Path,
        enabled: bool = True,
        resume_step: int = 0,
        history: Path | None = None,
        wandb: WandbRun | None = None,
    ) -> None:
        """`resume_step` > 0: the run continues from a checkpoint of that step, so the file
        keeps only the records up to it (later ones belong to the attempt that was lost).
        They come from `history`, the metrics file of the run that saved the checkpoint,
        when that is another run directory. `wandb`: a run that gets every record too."""
        self.enabled = enabled
        self.wandb = wandb
        self.path = Path(run_dir) / METRICS_FILE
        self._file = None
        if enabled and resume_step:
            _keep_until(self.path, resume_step, history or self.path)
        if enabled:
            # Line-buffered so a killed run keeps every completed line.
            self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    @classmethod
    def for_run(
        cls, conf: Config, rt: Runtime, start: Progress, resumed_from: Path | None
    ) -> "MetricsSink":
        """The sink of a run starting at `start`, resumed from checkpoint `resumed_from` (whose
        run directory's metrics hold the records before it); wandb when enabled."""
        run_dir = Path(conf.run_dir)
        history = resumed_from.parents[1] / METRICS_FILE if resumed_from else None
        wandb = None
        if rt.is_main and conf.logging.wandb.enabled:
            wandb = WandbRun(conf.logging.wandb, run_dir, asdict(conf), start.run_id)
        return cls(run_dir, rt.is_main, start.step, history, wandb)

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log(record)

    def info(self, msg: str, *args: Any) -> None:
        if self.enabled:
            log.info(msg, *args)

    def warning(self, msg: str, *args: Any) -> None:
        if self.enabled:
            log.warning(msg, *args)

    def __enter__(self) -> "MetricsSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.wandb is not None:
            self.wandb.finish()  # each multirun job ends its own wandb run
            self.wandb = None


class EvalProgress:
    """Progress lines for a long evaluation, at most one per `every_s` seconds: a default run's
    first evaluation takes minutes on a CPU, and silence would look like a hang."""

    def __init__(self, sink: MetricsSink, step: int, batches: int, every_s: float = 10.0) -> None:
        self.sink, self.step, self.batches, self.every_s = sink, step, batches, every_s
        self.start = self.last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s and done < self.batches:
            self.last = now
            self.sink.info(
                "step %d validation: batch %d of %d (%.0fs)", self.step, done, self.batches,
                now - self.start,
            )  # fmt: skip


def _keep_until(path: Path, step: int, source: Path) -> None:
    """Rewrite `path` (atomically) with `source`'s records of steps <= `step`."""
    if not source.is_file():
        return
    kept = [
        line
        for line in source.read_text(encoding="utf-8").splitlines()
        if line.strip() and _step_of(line) <= step
    ]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62  # a line cut short by a kill: drop it


def format_step(rec: dict[str, Any], total_steps: int) -> str:
    """The console line for one step: loss, LR, speed, and the val loss when evaluated."""
    parts = [f"step {rec['step']:>{len(str(total_steps))}}/{total_steps}"]
    if "train_loss" in rec:
        loss = rec["train_loss"]
        parts.append("loss non-finite (skipped)" if loss is None else f"loss {loss:.4f}")
    if "val_loss" in rec:
        parts.append(f"val {rec['val_loss']:.4f}")
    if "lr_mult" in rec:
        parts.append(f"lr x{rec['lr_mult']:.3g}")
    if "step_ms" in rec:
        parts.append(f"{rec['step_ms']:.0f} ms/step")
    if "tokens_per_s" in rec:
        parts.append(f"{rec['tokens_per_s']:,.0f} tok/s")
    if "mfu" in rec:
        parts.append(f"mfu {rec['mfu']:.1%}")
    if "peak_mem_gib" in rec:
        parts.append(f"mem {rec['peak_mem_gib']:.1f} GiB")
    parts.append(f"train {rec['train_time_ms'] / 1000:.1f}s")
    if rec.get("eta_s"):
        parts.append(f"eta {_duration(rec['eta_s'])}")
    return " | ".join(parts)


def _duration(seconds: float) -> str:
    """3m05s, 1h02m, 42s: the ETA at a glance."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def describe_run(
    conf: Config, rt: Runtime, model: nn.Module, optimizer: str, accum_steps: int
) -> str:
    """The startup line: model, optimizer, ranks, precision and how a step's tokens split."""
    m, t = conf.model, conf.train
    n_params = sum(p.numel() for p in model.parameters())
    micro = t.micro_batch(rt.world_size)
    precision = "bf16 autocast" if rt.autocast_dtype else "fp32"
    if m.dtype == "bf16":
        precision = f"bf16 model ({precision} for the rest)"
    ranks = count = f"{rt.world_size} rank" + ("s" if rt.world_size > 1 else "")
    where = rt.device.type
    if where == "cpu":  # what a bitwise comparison must match (README, "Exact resume")
        threads = torch.get_num_threads()
        where += f" ({threads} thread{'s' if threads > 1 else ''}/rank)"
    if conf.dist.strategy == "fsdp":
        dtype = resolve_param_dtype(conf.dist.fsdp_param_dtype, rt.device)
        ranks += f" (fsdp, parameters in {str(dtype).removeprefix('torch.')})"
    return (
        (
            f"model {m.n_layer} layers, d {m.n_embd}, {m.n_head} heads: {n_params:,} "
            f"parameters | {optimizer} | {ranks} on {where}, {precision} | "
            f"{t.batch_size * t.seq_len} tokens/step = {count} x {accum_steps} micro-step"
            f"{'s' if accum_steps > 1 else ''} "
            f"x {micro} x {t.seq_len}"
        )
        + (
            f" at the most; by phase {', '.join(str(t.batch_size * n) for n in t.seq_len_phases)}"
            if t.seq_len_phases
            else ""
        )
        + (f"\nlayers: {plan}" if (plan := model.plan_summary()) else "")
    )
