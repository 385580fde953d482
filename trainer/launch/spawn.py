"""`dist.nproc=N`: `python train.py` starts N local ranks itself, through torch's elastic
launcher (the machinery behind torchrun), which lets one Hydra multirun job be a
multi-process run. A rank's own error (trainer/launch/report.py) comes back to this process
as one line, `RanksFailed`, which it alone prints."""

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
from trainer.launch.report import ONE_LINE, RanksFailed, leave_rank, reported_line, to_log_file
from trainer.launch.signals import Stopped, claim_signals
from trainer.run_dir import env_rank, under_torchelastic

# The launcher's own signal handlers (the elastic agent installs them and never puts the old
# ones back): restored after the launch, so a program that called train() keeps its Ctrl-C.
AGENT_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    if hasattr(signal, name)
)  # fmt: skip
# The launcher's lines when it forwards a signal (the ranks already say they are stopping) or
# stops the ranks after one failed, and its report of the failure with the rank's traceback
# (the error this process raises says it once: one line, or torch's summary).
AGENT_NOISE = ("death signal", "via signal", "closing signal", "failed (exitcode")
AGENT_LOGGERS = (  # a logger's filter applies to its own records only, not its children's
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.multiprocessing.api",
    "torch.multiprocessing.spawn",
)

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
    # Into train.log only: on the console rank 0's first line says how many ranks run, and a
    # run that fails before it prints its error alone.
    to_log_file(
        logging.INFO, f"starting {conf.dist.nproc} ranks (torch elastic, {config.rdzv_backend})"
    )
    previous = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}
    quiet = _DropAgentNoise()
    for name in AGENT_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    try:
        results = elastic_launch(config, _rank_entry)(entry, asdict(conf), _logging_config())
    except SignalException as e:
        # This process got the signal; the launcher forwarded it, and the ranks stopped.
        raise Stopped.by_ranks(e.sigval.name) from e
    except ChildFailedError as e:
        # Only the ranks got it (nothing to restart: they stopped on purpose).
        codes = {f.exitcode for f in e.failures.values()}
        if codes <= {128 + signal.SIGTERM, 128 + signal.SIGINT}:
            raise Stopped.by_ranks(signal.Signals(max(codes) - 128).name) from e
        if (line := reported_line(e)) is not None:
            raise RanksFailed(line) from None  # the rank's error, whole in its one line
        raise
    finally:
        for name in AGENT_LOGGERS:
            logging.getLogger(name).removeFilter(quiet)
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)
    return results[0]


class _DropAgentNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(noise in record.getMessage() for noise in AGENT_NOISE)


def _rank_entry(entry: Callable[[Config], float], conf: dict, logging_cfg: dict | None) -> float:
    """What each spawned rank runs: set up logging and threads, then train.

    A rank stopped by a signal (after saving) exits at once with the signal's status: a
    returned value would wait for the launcher to collect it, which it does not do while it
    shuts down on the same signal, so the rank would sit until SIGKILLed 30 s later.
    """
    claim_signals()  # this process is a rank of the run: its signals are the run's
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
    except ONE_LINE as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        leave_rank(e)  # printed by the launching process (RanksFailed), once


def _logging_config() -> dict | None:
    """This Hydra job's logging config, resolved, for rank 0 to reuse (None outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    job_logging = HydraConfig.get().job_logging
    return OmegaConf.to_container(job_logging, resolve=True) if job_logging else None
