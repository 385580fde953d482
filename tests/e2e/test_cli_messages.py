"""Mistakes on the command line that used to print a message that did not help, each now one
exact line on stderr, through the real `python train.py`: a key put in the wrong group (no
near spelling in its own) names the keys of that name elsewhere and the group's own keys; a
seed outside numpy's range names `seed` and the range; `-m` with `--cfg` or `--help`, which
Hydra refuses with a traceback, names the command that shows a job's config; a row past the
end of the stage table, which Hydra reports in a block, names the rows there are. Each fails
before Hydra makes a run directory or imports torch, in a second or two.
"""

import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from model.config.attention import AttentionConfig
from trainer.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]
# The learning rates a misplaced `lr` may mean: Muon's, then AdamW's per parameter kind.
LRS = (
    "optim.muon.lr, optim.adamw.embed_lr, optim.adamw.head_lr, optim.adamw.scalar_lr or "
    "optim.adamw.hidden_lr"
)


def keys_of(schema: type) -> str:
    return ", ".join(f.name for f in fields(schema))


CASES = [
    (["train.lr=0.1"], f"unknown config key train.lr; did you mean {LRS}? (the keys of train, "
     f"the fields of trainer.config.TrainConfig: {keys_of(TrainConfig)})"),
    (["model.attention.lr=0.1"], f"unknown config key model.attention.lr; did you mean {LRS}? "
     "(the keys of model.attention, the fields of model.config.attention.AttentionConfig: "
     f"{keys_of(AttentionConfig)})"),
    (["logging.mode=offline"], "unknown config key logging.mode; did you mean "
     "logging.wandb.mode? (the keys of logging, the fields of trainer.config.LoggingConfig: "
     "wandb)"),
    (["seed=-1"], "seed must be in [0, 4294967295] (0 to 2**32 - 1), got -1"),
    (["seed=4294967296"], "seed must be in [0, 4294967295] (0 to 2**32 - 1), got 4294967296"),
    (["-m", "seed=0,1", "--cfg", "hydra"], "-m (run a sweep) and --cfg hydra (print a run's "
     "config) are separate commands, and Hydra does one per launch; for the sweep's first "
     "job: python train.py seed=0 --cfg hydra"),
    (["-m", "--cfg", "job"], "-m (run a sweep) and --cfg job (print a run's config) are "
     "separate commands, and Hydra does one per launch; without -m: python train.py --cfg job"),
    (["-m", "seed=0,1", "--help"], "--help describes one run's config, and seed=0,1 is a "
     "sweep; for the sweep's first job: python train.py seed=0 --help"),
    (["experiment=record_2026_07_17", "train.stages.rows.5.seq_len=128", "--cfg", "job"],
     "cannot set train.stages.rows.5.seq_len=128: train.stages.rows has 3 rows (0..2); to add "
     "rows, give the whole list: 'train.stages.rows=[{...}, ...]'"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "line"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_mistake_is_one_exact_line(tmp_path: Path, args: list[str], line: str) -> None:
    cmd = [sys.executable, str(REPO / "train.py"), *args]  # the run directory: under tmp_path
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout, out.stderr) == (1, "", f"error: {line}\n")
    assert not list(tmp_path.iterdir())  # no run directory (outputs/...), nothing at all
