"""Rank-0 output: the sink every record and console line goes through, and the curve as data in
`metrics.jsonl` (a step's record: `step_record`, `step_rates`; its console line: console.py).

Console lines go through `logging`, so under Hydra they also land in the run's log file.
Non-main ranks get a sink that does nothing, which keeps `if rank == 0` out of the loop.
"""

import json
import logging
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from trainer.config import Config, TrainConfig
from trainer.observe.flops import mfu
from trainer.observe.progress import Progress
from trainer.observe.wandb_log import WandbRun
from trainer.runtime import Runtime

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

    def amend(self, record: dict[str, Any]) -> None:
        """Add `record`'s fields to the file's last record where that is of the same step, else
        append it as `write` does: a resumed run measuring the evaluation that a stop cut short
        completes that step's record, so the curve holds each step once, as in a run that never
        stopped."""
        if self._file is not None:
            self._file.close()
            lines = self.path.read_text(encoding="utf-8").splitlines()
            if lines and _step_of(lines[-1]) == record["step"]:
                lines[-1] = json.dumps({**json.loads(lines[-1]), **record})
                tmp = self.path.with_name(f".{self.path.name}.tmp")
                tmp.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
                os.replace(tmp, self.path)
            else:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
            self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
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

    @classmethod
    def for_eval(
        cls, sink: MetricsSink, step: int, t: TrainConfig, rt: Runtime
    ) -> "EvalProgress | None":
        """The reporter of the evaluation after `step`, with its batch count from the validation
        budget: rank 0's (None on the others)."""
        rows = t.val_rows(rt.data_world) * rt.data_world
        sequences = t.val_tokens // (t.val_seq_len or t.seq_len)
        return cls(sink, step, math.ceil(sequences / rows)) if rt.is_main else None

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


def step_record(
    p: Progress, loss: float, lr_mult: float, lrs: dict[str, float], stats: dict[str, Any],
    seconds: float, tokens: int,
) -> dict[str, Any]:  # fmt: skip
    """The record of the step `p` has just taken (`tokens` of them in `seconds`): its loss (None
    when non-finite), the LR multiplier, each optimizer group's LR (lr/<name>) and the
    optimizer's stats, tokens, train time and speed."""
    return {
        "step": p.step,
        "train_loss": loss if math.isfinite(loss) else None,
        "lr_mult": lr_mult,
        **{f"lr/{name}": lr for name, lr in lrs.items()},
        **stats,
        "tokens": p.tokens,
        "train_time_ms": p.train_time_s * 1000,
        "step_ms": seconds * 1000,
        "tokens_per_s": tokens / seconds,
    }


def seconds_per_token(p: Progress, t: TrainConfig) -> float | None:
    """The train time per token of the timed steps so far (None before the first)."""
    timed_tokens = p.tokens - t.tokens_after(min(t.untimed_steps, p.step))
    return p.train_time_s / timed_tokens if timed_tokens > 0 and p.train_time_s > 0 else None


def step_rates(
    p: Progress, t: TrainConfig, rt: Runtime, seconds: float, flops: float | None,
    peak: float | None,
) -> dict[str, float]:  # fmt: skip
    """ETA from the time per token of the timed steps so far, times the tokens left (so it
    follows the batch stages: a stage of 3× the tokens per step takes 3× as long a step); MFU
    (from the FLOPs of every rank's batch, when counted, and one GPU's `peak`) and peak
    memory on a GPU."""
    out = {}
    if per_token := seconds_per_token(p, t):
        out["eta_s"] = per_token * (t.tokens_after(t.steps) - p.tokens)
    if flops is not None and peak:
        out["mfu"] = mfu(flops, seconds, peak, rt.world_size)
    if rt.device.type == "cuda":
        out["peak_mem_gib"] = torch.cuda.max_memory_allocated(rt.device) / 2**30
    return out
