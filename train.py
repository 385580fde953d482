"""Train a GPT: `python train.py [overrides]` or `torchrun ... train.py [overrides]`.

Hydra composes `conf/config.yaml` with the command-line overrides; `train(cfg)` does the
work and returns the final validation loss (what a Hydra sweep minimises). Tests call
`train()` directly, with no Hydra in the way.
"""

import logging
import os
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from data.build import build_data
from model import GPT
from optim import build_optimizers
from trainer import loop
from trainer.config import Config, register_configs, to_config
from trainer.metrics import MetricsSink
from trainer.runtime import init_runtime, resolve_ns_dtype, seed_everything

log = logging.getLogger("train")


def check_writable(run_dir: Path) -> None:
    """Fail before any work if the run directory can't take our files."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise PermissionError(f"run_dir {str(run_dir)!r} is not writable: {e}") from e


def train(cfg: DictConfig | Config) -> float:
    """Build everything from `cfg`, train, and return the final validation loss."""
    conf = to_config(cfg)  # validates every value before any work
    rt = init_runtime(conf.train.device, conf.train.autocast)
    if rt.world_size > 1:
        raise RuntimeError("multi-process training is not available yet: run one process")
    run_dir = Path(conf.run_dir)
    if rt.is_main:
        check_writable(run_dir)
    seed_everything(conf.seed)
    t = conf.train
    train_loader, val_batches = build_data(
        conf.data,
        batch_size=t.batch_size,
        seq_len=t.seq_len,
        val_tokens=t.val_tokens,
        seed=conf.seed,
        rank=rt.rank,
        world_size=rt.world_size,
        progress=rt.is_main,
    )
    model = GPT(conf.model).to(rt.device)
    ns_dtype = resolve_ns_dtype(conf.optim.muon.ns_dtype, rt.device)
    optimizers = build_optimizers(model, conf.optim, rt.device.type, ns_dtype)
    fwd = torch.compile(model) if conf.model.compile else model
    sink = MetricsSink(run_dir, enabled=rt.is_main)
    n_params = sum(p.numel() for p in model.parameters())
    sink.info(
        "model %d layers, d %d, %d heads: %.2fM parameters | %s (Newton-Schulz in %s) | "
        "device %s, %s | %d tokens/step",
        conf.model.n_layer,
        conf.model.n_embd,
        conf.model.n_head,
        n_params / 1e6,
        conf.optim.name,
        str(ns_dtype).removeprefix("torch."),
        rt.device,
        "bf16 autocast" if rt.autocast_dtype else "fp32",
        t.batch_size * t.seq_len,
    )
    try:
        return loop.run(
            fwd, optimizers, train_loader.next_batch, val_batches, t, conf.optim, rt, sink
        )
    finally:
        sink.close()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    log.info("config:\n%s", OmegaConf.to_yaml(cfg))
    return train(cfg)


if __name__ == "__main__":
    register_configs()
    main()
