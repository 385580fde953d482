"""A multirun's last line: how many jobs finished and the best final validation loss, with the
command that tabulates them (a Hydra callback, registered in conf/config.yaml)."""

import logging
import math
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("train")


class SweepSummary(Callback):
    """Collects each job's final validation loss (`train()`'s return value) and says, once
    the sweep is over, how many jobs ran and which was best. Under a launcher that runs jobs
    in other processes the jobs never report here, and the line says where they wrote."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, float | None]] = []

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        value = job_return._return_value if job_return.status == JobStatus.COMPLETED else None
        loss = float(value) if isinstance(value, int | float) else None
        self.jobs.append((" ".join(job_return.overrides or []), loss))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        where = config.hydra.sweep.dir
        finished = [(o, v) for o, v in self.jobs if v is not None and math.isfinite(v)]
        if not self.jobs:
            line = f"multirun done: its jobs wrote to {where}"
        else:
            line = f"multirun done: {len(finished)} of {len(self.jobs)} jobs finished"
            if finished:
                overrides, best = min(finished, key=lambda job: job[1])
                line += f"; best final val loss {best:.4f} ({overrides or 'no overrides'})"
        print(f"{line}. Per config: python scripts/report.py {where}", flush=True)
