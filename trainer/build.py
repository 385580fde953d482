"""One run, built from its config: the data, the model, its optimizer object, checkpoint I/O,
DDP or FSDP, compilation and the schedule, in the order training needs them.

Training (`trainer/session.py`), the benchmarks (scripts/bench/), the GPU proof and the GPU
dry run all call `build_run`, so what a benchmark times is what a run steps: the same model on
the same device, the FP8 head told its micro-steps, FSDP's shards before the optimizer, the
checkpoint resumed before DDP broadcasts the parameters, DDP or FSDP's `no_sync`, the compiled
forward and the schedule read with the data's piece lengths. `build_model` is its first part,
for a caller that needs only the model (sampling from a checkpoint).

A benchmark builds one GPU's share of a W-GPU run in one process: `world=W` gives the
micro-steps and the memory check of W ranks, and `comm` (a `LocalView`) rank 0's share of the
optimizer's exchange. `data=False` builds no loader and no checkpointer: the caller brings its
own batches, and the run starts at step 0.
"""

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed import ProcessGroup

from optim.parallelism import PARALLELISMS
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.config import Config
from trainer.launch.compile import compile_model, use_compile_cache
from trainer.launch.dist import local_main_first, main_decides, wrap_ddp
from trainer.launch.strategy import fsdp_no_sync, shard_model
from trainer.memory_check import check_fits
from trainer.observe.progress import Progress
from trainer.runtime import Runtime, resolve_param_dtype, seed_everything
from trainer.schedule import Schedule


@dataclass(frozen=True)
class Parts:
    """What a run is made of: `model(cfg.model, cfg.train.stages)` builds the model (handed
    the run's stage table), `optimizer(model,
    cfg.optim, device=, process_group=, parallelism=[, comm=])` its optimizer object (`comm`
    only where a caller gives one), and `data(cfg.data, **shape)` the train loader and the
    validation batches (data/build.py's signature)."""

    model: Callable[..., nn.Module]
    optimizer: Callable[..., Any]
    data: Callable[..., tuple[Any, Callable]]


@dataclass
class Run:
    """A built run: what a training step, a benchmark or an evaluation needs."""

    conf: Config
    rt: Runtime
    model: nn.Module  # the model itself (FSDP's shards under fsdp): state, FLOPs, summaries
    optimizer: Any
    fwd: nn.Module  # what runs forward: the model, DDP around it, compiled
    schedule: Schedule
    accum_steps: int  # micro-steps per optimizer step
    no_sync: Callable[[], Any] | None  # DDP's or FSDP's, for every micro-step but the last
    start: Progress  # where the run starts (a resumed checkpoint's progress, else step 0)
    loader: Any | None = None  # None: data=False
    val_batches: Callable | None = None
    checkpoints: Checkpointer | None = None  # None: data=False
    compile_cache: Path | None = None  # train.compile_cache, where anything compiles


def build_model(conf: Config, parts: Parts, rt: Runtime, accum_steps: int = 1) -> nn.Module:
    """`parts.model(conf.model, conf.train.stages)` on the run's device, refused where the
    device cannot run its kernels, told its micro-steps."""
    model = parts.model(conf.model, conf.train.stages).to(rt.device)
    if hasattr(model, "check_device"):  # kernels this device can't run, before any step
        model.check_device(rt.device)
    # The FP8 head undoes the loss's division by micro-steps (model/head.py)
    model.micro_steps = accum_steps
    return model


def build_run(
    conf: Config, parts: Parts, rt: Runtime, group: ProcessGroup | None = None, *,
    world: int | None = None, comm: Any = None, data: bool = True,
) -> Run:  # fmt: skip
    """`conf` (validated) built with `parts` on this rank: seeded, then the data (one rank per
    node builds the corpus cache first), the model (sharded under fsdp), the optimizer, the
    checkpointer and its resume, DDP or FSDP's no_sync, compilation and the schedule.

    `world`: the data-parallel ranks this rank is one of (default: the runtime's); `comm`: the
    optimizer's exchange (ddp_row_shards' `LocalView`); `data`: False builds no loader and
    no checkpointer (a benchmark's random batches)."""
    t, fsdp = conf.train, PARALLELISMS[conf.dist.parallelism].fsdp
    if world is not None and data and world != rt.data_world:
        raise ValueError(
            f"world={world} with data: the loader reads {rt.data_world} rank(s); build a wider "
            "world's share with data=False (a benchmark's own batches)"
        )
    data_world = world or rt.data_world
    accum_steps = t.accumulation_steps(data_world)
    seed_everything(conf.seed)
    loader = val_batches = None
    if data:
        # The ranks of a tensor-parallel group read the same batch: the data is split over the
        # groups (neighbouring ranks, the mesh's last dim: trainer/launch/strategy.py)
        with local_main_first(rt):  # one rank per node builds the corpus cache
            loader, val_batches = parts.data(
                conf.data, batch_size=t.batch_size, seq_len=t.seq_len, val_tokens=t.val_tokens,
                val_batch_size=t.val_rows(data_world) * data_world,
                val_seq_len=t.val_seq_len or t.seq_len, seed=conf.seed,
                rank=rt.data_rank, world_size=data_world, progress=rt.is_main,
            )  # fmt: skip
    model = build_model(conf, parts, rt, accum_steps)
    # Before the first step: an OOM kill says nothing, and a GPU's out-of-memory comes
    # minutes into the compile. A GPU rank checks its own device.
    if rt.device.type in ("cpu", "cuda"):
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", rt.world_size))
        check = functools.partial(check_fits, conf, model, data_world, ranks_here, rt.device)
        main_decides(check, rt)
    if fsdp:  # before the optimizer: its state is sharded like the parameters
        dtype = resolve_param_dtype(conf.dist.fsdp_param_dtype, rt.device)
        shard_model(model, rt, dtype, conf.dist.replicate, conf.dist.tensor_parallel)
    compiles = conf.model.compile or conf.optim.compile
    cache = use_compile_cache(t.compile_cache) if compiles else None  # before any compile
    optimizer = parts.optimizer(
        model, conf.optim, device=rt.device, process_group=group,
        parallelism=conf.dist.parallelism, **({"comm": comm} if comm is not None else {}),
    )  # fmt: skip
    checkpoints, start = None, Progress()
    if data:
        checkpoints = Checkpointer(conf, rt, model, optimizer, loader)
        start = checkpoints.resume()  # before DDP: its construction broadcasts the parameters
    ddp = wrap_ddp(model, optimizer.self_reduced) if group is not None and not fsdp else None
    no_sync = ddp.no_sync if ddp is not None else fsdp_no_sync(model) if fsdp else None
    fwd = ddp or model
    if conf.model.compile:
        fwd = compile_model(fwd, conf.model.compile_backend)
    schedule = Schedule.for_run(t, conf.optim, conf.model, conf.data)
    return Run(
        conf, rt, model, optimizer, fwd, schedule, accum_steps, no_sync, start, loader,
        val_batches, checkpoints, cache,
    )  # fmt: skip
