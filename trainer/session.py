"""One training run, wired: ranks, run directory, the built run, sink, loop.

`train.py` names the parts (`Parts`: the model class, the optimizer builder, the data
builder) and calls `run`; everything between a validated config and the final validation
loss happens here, in this order: start the ranks (`dist.nproc`), the process group, the run
directory, the run itself (`trainer/build.py`: data, model, optimizer, checkpointer and
resume, DDP or FSDP, compilation, schedule, as every benchmark builds it), the metrics sink
with its startup lines, and the loop. The trainer never imports a model class:
what it needs from the model it asks the model (`fsdp_units`, `count_flops`,
`plan_summary`).
"""

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed import ProcessGroup

from data.passes import plan_passes
from trainer.build import Parts, build_run
from trainer.checkpoint.files import CHECKPOINTS_DIR
from trainer.config import Config
from trainer.launch.dist import agree_on_config, main_decides, process_group
from trainer.launch.fault import Faults
from trainer.launch.signals import StopRequests
from trainer.launch.spawn import spawn_ranks
from trainer.loop import Loop
from trainer.observe.console import describe_run, qk_clip_without_effect, tie_outlasts_run
from trainer.observe.cpu_cost import cpu_cost_warning
from trainer.observe.flops import peak_flops
from trainer.observe.metrics import METRICS_FILE, MetricsSink
from trainer.observe.progress import Progress
from trainer.observe.provenance import code_version
from trainer.reference import Curve, load_curve, misfit, run_facts
from trainer.run_dir import check_writable, set_aside_previous
from trainer.runtime import Runtime, cpu_threads, init_runtime
from trainer.schedule import Schedule
from trainer.train_step import TrainStep

log = logging.getLogger("train")


def run(conf: Config, parts: Parts) -> float:
    """Train `conf` (validated) with `parts`; return the final validation loss."""
    if conf.dist.nproc > 1:
        return spawn_ranks(conf, functools.partial(run_rank, parts=parts))
    return run_rank(conf, parts)


def run_rank(conf: Config, parts: Parts) -> float:
    """This rank's share of the run (the whole run in a single process)."""
    rt = init_runtime(conf.train.device, conf.train.autocast)
    rt = dataclasses.replace(rt, tensor_parallel=conf.dist.tensor_parallel)
    conf.train.accumulation_steps(rt.data_world)  # fails before any work
    with cpu_threads(conf.train.threads, rt.device), process_group(rt, conf.dist) as group:
        conf = agree_on_config(conf, rt)
        return _run(conf, parts, rt, group)


def _run(conf: Config, parts: Parts, rt: Runtime, group: ProcessGroup | None) -> float:
    run_dir, t = Path(conf.run_dir), conf.train
    saving = t.checkpoint_at_end or 0 < t.checkpoint_every <= t.steps  # else: no checkpoints/
    saves = [CHECKPOINTS_DIR] if saving else []
    main_decides(lambda: check_writable(run_dir, *saves), rt)  # raises on every rank
    r = build_run(conf, parts, rt, group)
    model, optimizer, start, accum_steps = r.model, r.optimizer, r.start, r.accum_steps
    if start.step == 0 and rt.is_main:  # a fresh start owns the run directory's records
        moved = set_aside_previous(run_dir, (METRICS_FILE, CHECKPOINTS_DIR))
        if moved is not None:
            log.warning("an earlier run's metrics and checkpoints were moved to %s", moved)
    sink = MetricsSink.for_run(conf, rt, start, r.checkpoints.last)
    sink.info("%s", describe_run(conf, rt, model, optimizer.summary, accum_steps))
    sink.info("param groups:\n%s", optimizer.groups_table)
    if r.compile_cache is not None:
        sink.info("compile cache: %s (train.compile_cache)", r.compile_cache)
    if rt.is_main and (warning := cpu_cost_warning(conf, rt)) is not None:
        sink.warning("%s", warning)
    for advice in (tie_outlasts_run, qk_clip_without_effect):
        if rt.is_main and (warning := advice(conf)) is not None:
            sink.warning("%s", warning)
    # The handlers are the command line's or a launched rank's (trainer/launch/signals.py); the
    # test-only SIGTERM fault needs them wherever train() runs.
    with StopRequests(force=t.fault.signal_at_step > 0, announce=rt.is_main) as stop, sink:
        peak = peak_flops(rt.device)
        if rt.is_main and (warning := data_wrap_warning(conf, r.loader, r.schedule, start)):
            sink.warning("%s", warning)
        stepper = TrainStep(
            r.fwd, optimizer, r.schedule, r.loader.next_batch, rt,
            t.seq_len, accum_steps=accum_steps, no_sync=r.no_sync,
            hook=Faults(t.fault, rt.rank, run_dir, model) if t.fault.enabled else None,
            # No peak: no MFU, nothing to count
            flops=count_flops(model, conf.dist.tensor_parallel) if peak else None,
            summed_loss=conf.model.head.reduction == "sum",
            skip_nonfinite=t.on_nonfinite == "skip",
        )  # fmt: skip
        loop = Loop(
            stepper, r.val_batches, t, sink, r.checkpoints, stop=stop, peak_flops=peak,
            code=code_version(), data_epoch=lambda: r.loader.epoch,
            reference=reference_curve(conf, sink),
        )  # fmt: skip
        return loop.run(start)


def count_flops(model: nn.Module, tensor_parallel: int) -> Callable[..., Any]:
    """A rank's share of its batch's training FLOPs: the ranks of a tensor-parallel group
    share one batch's (the step sums the counts over every rank)."""
    if tensor_parallel == 1:
        return model.count_flops
    return lambda *args, **kwargs: model.count_flops(*args, **kwargs) / tensor_parallel


def reference_curve(conf: Config, sink: MetricsSink) -> Curve | None:
    """`train.reference.curve` where it describes this run; None, said once, where it does not
    (a record preset at toy size or on the sample corpus: the record's loss at these tokens and
    a time to its target would mislead)."""
    if not conf.train.reference.curve:
        return None
    curve = load_curve(conf.train.reference.curve)
    why = misfit(curve, run_facts(conf.data, conf.model))
    if why is not None:
        sink.info(
            "train.reference.curve=%s is not shown (no reference loss, no time to target): %s",
            curve.name, why,
        )  # fmt: skip
        return None
    return curve


def data_wrap_warning(conf: Config, loader: Any, schedule: Schedule, start: Progress) -> str | None:
    """The warning when the steps left from `start` read the training data more than once."""
    steps = range(start.step, conf.train.steps)
    plan = plan_passes(loader, ((conf.train.seq_len_at(i), schedule.data_args(i)) for i in steps))
    if plan.wrap_step is None:
        return None
    d = conf.data  # a loader that wraps reads shards
    return plan.warning(
        f"data.source={d.source} ({len(loader.files)} shard(s), data.align={d.align})"
    )
