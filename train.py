"""Train a GPT: `python train.py [overrides]` or `torchrun ... train.py [overrides]`.

Hydra composes `conf/config.yaml` with the command-line overrides; `train(cfg)` does the
work and returns the final validation loss (what a Hydra sweep minimises). Tests call
`train()` directly, with no Hydra in the way. Under torchrun every rank runs this file;
`dist.nproc=N` makes this one process start N ranks itself. This file names the parts a run
is made of; trainer/session.py wires them. Torch is imported only once the config is valid,
so a mistyped value fails in a fraction of a second.
"""

import sys

import hydra
from omegaconf import DictConfig

from trainer.cli.main import check_arguments, run_main
from trainer.config import Config, register_configs, to_config


def train(cfg: DictConfig | Config) -> float:
    """Build everything from `cfg`, train, and return the final validation loss."""
    conf = to_config(cfg)  # validates every value before any work
    from data.build import build_data
    from model import GPT
    from optim import build_optimizer
    from trainer.build import Parts
    from trainer.session import run

    return run(conf, Parts(model=GPT, optimizer=build_optimizer, data=build_data))


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    return run_main(cfg, train)


if __name__ == "__main__":
    register_configs()
    check_arguments(sys.argv[1:])  # a typo fails here in one line, before Hydra composes
    main()
