"""One training run, wired: ranks, run directory, parts, checkpointer, wrapping, sink, loop.

`train.py` names the parts (`Parts`: the model class, the optimizer builder, the data
builder) and calls `run`; everything between a validated config and the final validation
loss happens here, in this order: start the ranks (`dist.nproc`), the process group, the run
directory, the data, the model (sharded under fsdp), the optimizer object, the checkpointer
(resuming, before DDP broadcasts the parameters), DDP or FSDP's no_sync, compilation, the
metrics sink with its startup lines, and the loop. The trainer never imports a model class:
what it needs from the model it asks the model (`fsdp_units`, `count_flops`,
`plan_summary`).
"""

import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed import ProcessGroup

from data.passes import plan_passes
from optim.parallelism import PARALLELISMS
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.files import CHECKPOINTS_DIR
from trainer.config import Config
from trainer.launch.compile import compile_model, use_compile_cache
from trainer.launch.dist import (
    agree_on_config,
    local_main_first,
    main_decides,
    process_group,
    wrap_ddp,
)
from trainer.launch.fault import Faults
from trainer.launch.signals import StopRequests
from trainer.launch.spawn import spawn_ranks
from trainer.launch.strategy import fsdp_no_sync, shard_model
from trainer.loop import Loop
from trainer.memory_check import check_fits
from trainer.observe.console import describe_run, qk_clip_without_effect, tie_outlasts_run
from trainer.observe.cpu_cost import cpu_cost_warning
from trainer.observe.flops import peak_flops
from trainer.observe.metrics import METRICS_FILE, MetricsSink
from trainer.observe.progress import Progress
from trainer.observe.provenance import code_version
from trainer.reference import Curve, load_curve, misfit, run_facts
from trainer.run_dir import check_writable, set_aside_previous
from trainer.runtime import Runtime, cpu_threads, init_runtime, resolve_param_dtype, seed_everything
from trainer.schedule import Schedule
from trainer.train_step import TrainStep

log = logging.getLogger("train")


@dataclass(frozen=True)
class Parts:
    """What a run is made of: `model(cfg.model)` builds the model, `optimizer(model,
    cfg.optim, device=, process_group=, parallelism=)` its optimizer object, and `data(cfg.data,
    **shape)` the train loader and the validation batches (data/build.py's signature)."""

    model: Callable[..., nn.Module]
    optimizer: Callable[..., Any]
    data: Callable[..., tuple[Any, Callable]]


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
    seed_everything(conf.seed)
    # The ranks of a tensor-parallel group read the same batch: the data is split over the
    # groups (neighbouring ranks, the mesh's last dim: trainer/launch/strategy.py)
    tp, data_world = conf.dist.tensor_parallel, rt.data_world
    accum_steps = t.accumulation_steps(data_world)
    with local_main_first(rt):  # one rank per node builds the corpus cache
        loader, val_batches = parts.data(
            conf.data, batch_size=t.batch_size, seq_len=t.seq_len, val_tokens=t.val_tokens,
            val_batch_size=t.val_rows(data_world) * data_world,
            val_seq_len=t.val_seq_len or t.seq_len, seed=conf.seed,
            rank=rt.data_rank, world_size=data_world, progress=rt.is_main,
        )  # fmt: skip
    model = parts.model(conf.model).to(rt.device)
    if hasattr(model, "check_device"):  # kernels this device can't run, before any step
        model.check_device(rt.device)
    # Before the first step: an OOM kill says nothing, and a GPU's out-of-memory comes
    # minutes into the compile. A GPU rank checks its own device.
    if rt.device.type in ("cpu", "cuda"):
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", rt.world_size))
        check = functools.partial(check_fits, conf, model, data_world, ranks_here, rt.device)
        main_decides(check, rt)
    model.micro_steps = accum_steps  # the FP8 head undoes the loss / micro_steps (model/head.py)
    fsdp = PARALLELISMS[conf.dist.parallelism].fsdp
    if fsdp:  # before the optimizer: its state is sharded like the parameters
        dtype = resolve_param_dtype(conf.dist.fsdp_param_dtype, rt.device)
        shard_model(model, rt, dtype, conf.dist.replicate, tp)
    compiles = conf.model.compile or conf.optim.compile
    cache = use_compile_cache(t.compile_cache) if compiles else None  # before any compile
    optimizer = parts.optimizer(
        model, conf.optim, device=rt.device, process_group=group,
        parallelism=conf.dist.parallelism,
    )  # fmt: skip
    checkpoints = Checkpointer(conf, rt, model, optimizer, loader)
    start = checkpoints.resume()  # before DDP: its construction broadcasts the parameters
    if start.step == 0 and rt.is_main:  # a fresh start owns the run directory's records
        moved = set_aside_previous(run_dir, (METRICS_FILE, CHECKPOINTS_DIR))
        if moved is not None:
            log.warning("an earlier run's metrics and checkpoints were moved to %s", moved)
    ddp = wrap_ddp(model, optimizer.self_reduced) if group is not None and not fsdp else None
    no_sync = ddp.no_sync if ddp is not None else fsdp_no_sync(model) if fsdp else None
    fwd = ddp or model
    if conf.model.compile:
        fwd = compile_model(fwd, conf.model.compile_backend)
    sink = MetricsSink.for_run(conf, rt, start, checkpoints.last)
    sink.info("%s", describe_run(conf, rt, model, optimizer.summary, accum_steps))
    sink.info("param groups:\n%s", optimizer.groups_table)
    if cache is not None:
        sink.info("compile cache: %s (train.compile_cache)", cache)
    if rt.is_main and (warning := cpu_cost_warning(conf, rt)) is not None:
        sink.warning("%s", warning)
    for advice in (tie_outlasts_run, qk_clip_without_effect):
        if rt.is_main and (warning := advice(conf)) is not None:
            sink.warning("%s", warning)
    # The handlers are the command line's or a launched rank's (trainer/launch/signals.py); the
    # test-only SIGTERM fault needs them wherever train() runs.
    with StopRequests(force=t.fault.signal_at_step > 0, announce=rt.is_main) as stop, sink:
        peak = peak_flops(rt.device)
        schedule = Schedule.for_run(t, conf.optim, conf.model, conf.data)
        if rt.is_main and (warning := data_wrap_warning(conf, loader, schedule, start)):
            sink.warning("%s", warning)
        stepper = TrainStep(
            fwd, optimizer, schedule, loader.next_batch, rt,
            t.seq_len, accum_steps=accum_steps, no_sync=no_sync,
            hook=Faults(t.fault, rt.rank, run_dir, model) if t.fault.enabled else None,
            flops=count_flops(model, tp) if peak else None,  # no MFU: nothing to count
            summed_loss=conf.model.head.reduction == "sum",
            skip_nonfinite=t.on_nonfinite == "skip",
        )  # fmt: skip
        loop = Loop(
            stepper, val_batches, t, sink, checkpoints, stop=stop, peak_flops=peak,
            code=code_version(), data_epoch=lambda: loader.epoch,
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
