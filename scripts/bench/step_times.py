"""How the benchmarks time training steps: whole Adam periods, each kind of step, and a
profile of one of each.

With optim.adamw.update_every = 2 (records #46 and #89) steps alternate: on a "normal" one
Adam only adds the gradient to its sum, on an "Adam" one it updates, and the two cost
differently. The median of a few steps then lands on one kind or the other (and which one
depends on how many steps ran before, warm-ups and earlier stages included). So a row's
ms/step is the mean of an even number of consecutive steps, whole periods, what a run costs
per step; the medians of its normal and of its Adam steps stand beside it. A preset whose
Adam updates every step has only Adam steps ("adam": every part updates).

`profile_steps` runs one step of each kind under torch.profiler and writes a table of device
time by kernel and by part (the model's forward and backward, the optimizer), so that any GPU
call can leave with a profile.
"""

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from optim import CombinedOptimizer
from scripts.bench.head import timed
from trainer.runtime import Runtime

PARTS = ("forward_backward", "optimizer")  # the profiler's ranges (gpu.py's train_step)


@dataclass
class StepTimes:
    """Seconds and kind ("normal" / "adam") of consecutive steps, `period` steps a period."""

    period: int = 1
    seconds: list[float] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    @property
    def period_s(self) -> float:
        """The mean over the whole periods from the first step."""
        n = len(self.seconds)
        return statistics.mean(self.seconds[: n - n % self.period or n])

    def median_s(self, kind: str) -> float | None:
        times = [s for s, k in zip(self.seconds, self.kinds, strict=True) if k == kind]
        return statistics.median(times) if times else None


def step_kind(opt: CombinedOptimizer) -> str:
    """The kind of the optimizer's next step."""
    return "adam" if opt.full_next() else "normal"


def time_steps(rt: Runtime, opt: CombinedOptimizer, steps: int,
               step: Callable[[], object]) -> StepTimes:  # fmt: skip
    """Time `steps` (whole periods) consecutive calls of `step`, each with a device
    synchronise, with the kind of each."""
    out = StepTimes(opt.period())
    for _ in range(steps + -steps % out.period):  # whole periods
        out.kinds.append(step_kind(opt))
        out.seconds.append(timed(rt, step))
    return out


def profile_steps(opt: CombinedOptimizer, step: Callable[[], object], path: Path,
                  title: str) -> None:  # fmt: skip
    """One step of each kind under torch.profiler; `path` gets the device time by kernel
    (the 40 longest) and by part (PARTS), as text."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(max(2, opt.period())):  # a step of each kind
            step()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    key = f"self_{device}_time_total"
    events = prof.key_averages()
    by_kernel = events.table(sort_by=key, row_limit=40)
    parts = [e for e in events if e.key in PARTS]
    lines = [f"# {title}", "", "## device time by part (one step of each kind)", ""]
    for e in parts:
        total = getattr(e, f"{device}_time_total", 0.0) or getattr(e, "cpu_time_total", 0.0)
        lines.append(f"{e.key}: {total / 1e3:.2f} ms over {e.count} calls")
    lines += ["", "## by kernel", "", by_kernel]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
