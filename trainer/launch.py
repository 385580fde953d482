"""Launching ranks: one run directory per launch, and `dist.nproc` ranks started from Python.

Under torchrun every rank runs `@hydra.main`, so every rank would pick a run directory and
write `.hydra/` and a log into it. The resolvers here, used by `conf/config.yaml`, make that
rank-aware: rank 0 gets `outputs/<date>/<time>` of the moment the *launch* started (for
torchrun, the start of the torchrun process that is every local rank's parent, so a restart by
`--max-restarts` returns to the same directory and finds its checkpoints); other ranks get `.`
(the working directory, which exists) and write no `.hydra/` and no log file, so they create
nothing. `trainer.dist.agree_on_config` then hands them rank 0's directory.

`spawn_ranks` is the switch `dist.nproc=N`: `python train.py` starts N local ranks itself
through torch's elastic launcher (the machinery behind torchrun), which lets one Hydra
multirun job be a multi-process run.
"""

import logging
import logging.config
import os
import signal
import sys
import uuid
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from trainer.config import Config, to_config
from trainer.signals import Stopped

_SAVED = "the newest under checkpoints/"

log = logging.getLogger("train")


def env_rank() -> int:
    """This process's global rank as torchrun set it (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def under_torchelastic() -> bool:
    """Whether torchrun (or torch's elastic agent) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def launch_start_time() -> datetime | None:
    """When this launch began: torchrun's start for its workers, else now.

    None when it can't be known the same way by a restarted worker: under torchrun across
    several nodes (rank 0's parent may differ after a restart) or where /proc is missing.
    """
    if not under_torchelastic():
        return datetime.now()
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
        return None
    return _process_start_time(os.getppid())


def launch_dir(root: str) -> str:
    """The Hydra run directory of this rank (see the module docstring)."""
    if env_rank() != 0:
        return "."
    start = launch_start_time()
    if start is None:
        # Nodes share the rendezvous id, and it survives restarts: torchrun's --rdzv-id.
        return f"{root}/torchrun-{os.environ['TORCHELASTIC_RUN_ID']}"
    return f"{root}/{start:%Y-%m-%d}/{start:%H-%M-%S}"


def rank_zero(on_rank_zero: Any, elsewhere: Any) -> Any:
    """One value on rank 0 and another on every other rank."""
    return on_rank_zero if env_rank() == 0 else elsewhere


def register_resolvers() -> None:
    """Make `${launch_dir:...}` and `${rank_zero:...}` available to the config files."""
    OmegaConf.register_new_resolver("launch_dir", launch_dir, replace=True)
    OmegaConf.register_new_resolver("rank_zero", rank_zero, replace=True)


def spawn_ranks(conf: Config, entry: Callable[[Config], float]) -> float:
    """Run `entry(conf)` on `dist.nproc` local ranks; return rank 0's result.

    `entry` must be importable by name (a module-level function), since ranks are spawned.
    Rank 0 logs with this process's logging config (Hydra's, so to the same `train.log`).
    """
    if under_torchelastic() or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(
            f"dist.nproc={conf.dist.nproc} starts its own ranks, but this process is already "
            "one of several started by torchrun: leave dist.nproc at 1 under torchrun"
        )
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=conf.dist.nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",  # a free port on loopback, as torchrun --standalone
        max_restarts=conf.dist.max_restarts,
        start_method="spawn",
        monitor_interval=0.1,
    )
    log.info("starting %d ranks (torch elastic, %s)", conf.dist.nproc, config.rdzv_backend)
    try:
        results = elastic_launch(config, _rank_entry)(entry, asdict(conf), _logging_config())
    except SignalException as e:
        # This process got the signal; the launcher forwarded it, and the ranks saved.
        raise Stopped(e.sigval.name, None, _SAVED) from e
    except ChildFailedError as e:
        # Only the ranks got it (nothing to restart: they saved and stopped on purpose).
        codes = {f.exitcode for f in e.failures.values()}
        if codes <= {128 + signal.SIGTERM, 128 + signal.SIGINT}:
            raise Stopped(signal.Signals(max(codes) - 128).name, None, _SAVED) from e
        raise
    return results[0]


def _rank_entry(entry: Callable[[Config], float], conf: dict, logging_cfg: dict | None) -> float:
    """What each spawned rank runs: set up logging and threads, then train.

    A rank stopped by a signal (after saving) exits at once with the signal's status: a
    returned value would wait for the launcher to collect it, which it does not do while it
    shuts down on the same signal, so the rank would sit until SIGKILLed 30 s later.
    """
    if env_rank() == 0 and logging_cfg is not None:
        logging.config.dictConfig(logging_cfg)
    else:
        level = logging.INFO if env_rank() == 0 else logging.WARNING
        logging.basicConfig(
            level=level, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
        )
    if "OMP_NUM_THREADS" not in os.environ:
        # N ranks on one CPU: share the cores instead of each taking all of them (torchrun's
        # launcher does the same by setting OMP_NUM_THREADS=1).
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    try:
        return entry(to_config(conf))
    except Stopped as e:
        if env_rank() == 0:
            logging.getLogger("train").warning("%s", e)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(e.exit_code)


def _logging_config() -> dict | None:
    """This Hydra job's logging config, resolved, for rank 0 to reuse (None outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    job_logging = HydraConfig.get().job_logging
    return OmegaConf.to_container(job_logging, resolve=True) if job_logging else None


def _process_start_time(pid: int) -> datetime | None:
    """A process's start time from /proc (Linux), to the second; None where unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError):
        return None
    # Field 22 (starttime, clock ticks after boot); fields after the ")" of the command name.
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"))
