"""Weights & Biases logging (`logging=wandb`): rank 0 logs what `metrics.jsonl` holds.

The wandb run id is the run's own id, kept in its checkpoints, so a resumed run (after a
crash, a pre-emption or a torchrun restart) continues the same wandb run instead of starting
a second one. wandb is imported only when enabled: the default logging needs no account.
"""

import logging
from pathlib import Path
from typing import Any

from trainer.config import WandbConfig

log = logging.getLogger("train")


class WandbRun:
    def __init__(self, w: WandbConfig, run_dir: Path, config: dict[str, Any], run_id: str) -> None:
        """`config`: the run's resolved config, every value, as wandb's run config."""
        import wandb

        try:
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
                config=config,
            )
        except Exception as e:  # wandb raises its own UsageError / CommError types
            if w.mode != "online":
                raise
            # Online needs an API key and the network; the usual first-run failure.
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(
                f"logging.wandb.mode=online could not start a W&B run ({first}); log in with "
                "`wandb login` or set WANDB_API_KEY, or use logging.wandb.mode=offline"
            ) from e
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
