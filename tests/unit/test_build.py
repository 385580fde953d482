"""trainer/build.py: one run builder for training and every tool.

A benchmark builds its run without a loader (`data=False`); what it times must be what
training steps: the same initial parameters (the data's construction draws nothing from the
seeded generators), the same schedule, and the micro-steps of the world it stands for. A
world the loader does not read is refused.
"""

from pathlib import Path

import pytest
import torch

from optim.ddp_rows import LocalView
from scripts.bench.presets import PARTS
from tests.helpers import RECORD_89_TOY, TINY, compose_config
from trainer.build import build_run
from trainer.config import to_config
from trainer.runtime import init_runtime
from trainer.schedule import Schedule


def config(overrides: list[str], run_dir: Path):
    return to_config(compose_config([*overrides, f"run_dir={run_dir}"]))


def test_a_tools_build_is_trainings(corpus_cache: Path, tmp_path: Path) -> None:
    """The record's toy built with its loader and checkpointer (as train.py builds it) and
    without (as a benchmark does): bitwise the same parameters, the same forward arguments
    at every stage, and a fresh start."""
    conf = config([*RECORD_89_TOY, "train.device=cpu", f"data.cache_dir={corpus_cache}"], tmp_path)
    rt = init_runtime("cpu", conf.train.autocast)
    trained = build_run(conf, PARTS, rt)
    tool = build_run(conf, PARTS, rt, data=False)
    assert trained.loader is not None and trained.checkpoints is not None
    assert tool.loader is None and tool.checkpoints is None and tool.start.step == 0
    a, b = trained.model.state_dict(), tool.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    want = Schedule.for_run(conf.train, conf.optim, conf.model, conf.data)
    for step in (0, conf.train.steps // 2, conf.train.steps - 1, conf.train.steps):
        assert tool.schedule.model_args(step) == want.model_args(step)
        assert trained.schedule.data_args(step) == want.data_args(step)
    # The build hands the model train.stages: YaRN's scales, one per long window, rising
    scales = tool.model.yarn_scale_list
    assert len(scales) == len(conf.train.stages.long_windows) == 4 and scales == sorted(scales)
    assert len(set(scales)) == 4


def test_one_gpus_share_of_a_wider_run(tmp_path: Path) -> None:
    """world=W: the micro-steps of W ranks and rank 0's share of the optimizer (LocalView);
    a world the loader would not read is refused before any work."""
    sets = ["train.batch_size=8", "train.micro_batch_size=1", "dist.parallelism=ddp_row_shards"]
    conf = config([*TINY, *sets, "data.source=synthetic"], tmp_path)
    rt = init_runtime("cpu", "none")
    one = build_run(conf, PARTS, rt, data=False)
    share = build_run(conf, PARTS, rt, world=4, comm=LocalView(4), data=False)
    assert (one.accum_steps, share.accum_steps) == (8, 2)
    owned = sum(p.numel() for p in share.optimizer.params())
    assert owned == sum(p.numel() for p in one.optimizer.params())  # every parameter is seen
    # ... and rank 0 steps its share, as on the 4 ranks' run
    assert "exchange sharded over 4 ranks" in share.optimizer.summary
    assert "sharded" not in one.optimizer.summary
    with pytest.raises(ValueError, match=r"world=4 with data: the loader reads 1 rank"):
        build_run(conf, PARTS, rt, world=4)
