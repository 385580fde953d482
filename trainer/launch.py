"""`dist.nproc=N`: `python train.py` starts N local ranks itself, through torch's elastic
launcher (the machinery behind torchrun), which lets one Hydra multirun job be a
multi-process run."""

import logging
import logging.config
import os
import signal
import sys
import uuid
from collections.abc import Callable
from dataclasses import asdict

import torch
from omegaconf import OmegaConf

from trainer.config import Config, to_config
from trainer.run_dir import env_rank, under_torchelastic
from trainer.signals import Stopped

_SAVED = "the newest under checkpoints/"

log = logging.getLogger("train")


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
