"""Train a GPT: `python train.py [overrides]` or `torchrun ... train.py [overrides]`.

Hydra composes `conf/config.yaml` with the command-line overrides; `train(cfg)` does the
work and returns the final validation loss (what a Hydra sweep minimises). Tests call
`train()` directly, with no Hydra in the way. Under torchrun every rank runs this file;
`dist.nproc=N` makes this one process start N ranks itself. This file names the parts a run
is made of; trainer/session.py wires them.
"""

import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

from data.build import build_data
from model import GPT
from optim import build_optimizer
from trainer.cli import run_main
from trainer.config import Config, register_configs, to_config
from trainer.session import Parts, run

PARTS = Parts(model=GPT, optimizer=build_optimizer, data=build_data)


def train(cfg: DictConfig | Config) -> float:
    """Build everything from `cfg`, train, and return the final validation loss."""
    return run(to_config(cfg), PARTS)  # validates every value before any work


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
@record  # a failing rank's traceback reaches torchrun's summary
def main(cfg: DictConfig) -> float:
    return run_main(cfg, train)


if __name__ == "__main__":
    register_configs()
    main()
