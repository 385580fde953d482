"""Weights & Biases logging (`logging=wandb`): rank 0 logs what `metrics.jsonl` holds.

The wandb run id is the run's own id, kept in its checkpoints, so a resumed run (after a
crash, a pre-emption or a torchrun restart) continues the same wandb run instead of starting
a second one. wandb is imported only when enabled: the default logging needs no account.
"""

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trainer.config import Config

log = logging.getLogger("train")


class WandbRun:
    def __init__(self, conf: Config, run_id: str) -> None:
        import wandb

        w = conf.logging.wandb
        run_dir = Path(conf.run_dir)
        self._run = wandb.init(
            project=w.project,
            entity=w.entity,
            name=w.name or _default_name(run_dir),
            group=w.group,
            tags=list(w.tags),
            mode=w.mode,
            dir=str(run_dir),
            id=run_id,
            resume="allow",
            config=asdict(conf),  # the resolved config, every value
        )
        log.info("wandb: %s run %s (%s)", w.mode, run_id, getattr(self._run, "url", None) or "")

    def log(self, record: dict[str, Any]) -> None:
        step = record["step"]
        self._run.log({k: v for k, v in record.items() if k != "step" and v is not None}, step=step)

    def finish(self) -> None:
        self._run.finish()


def _default_name(run_dir: Path) -> str:
    """outputs/2026-11-23/10-00-00 -> "2026-11-23/10-00-00"; a sweep job keeps its number."""
    parts = run_dir.resolve().parts
    return "/".join(parts[-3:]) if len(parts) >= 3 else str(run_dir)
