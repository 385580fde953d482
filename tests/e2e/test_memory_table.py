"""scripts/bench/memory.py: the computed per-rank bytes are what a real step holds.

One training step of the tiny model on gloo ranks, under ddp, fsdp and fsdp+offload; the
bytes of parameter and gradient shards, device optimizer state and offload's host mirrors
must equal the formula exactly: at W=2 (every dim-0 splits evenly) and at W=3, where the
128-row matrices split 43/43/42 and the fullest rank sets the figure.
"""

from pathlib import Path

import pytest
import torch

from model.config import ModelConfig
from scripts.bench.memory import (
    PARTS,
    SETUPS,
    computed,
    gpt2_config,
    max_over_ranks,
    measure_rank,
)
from tests.dist_utils import run_ranks


def _measure(rank: int, world: int, cfg: ModelConfig, setups: tuple, out: str) -> None:
    """Runs on every rank: the per-rank maximum of each setup's measured bytes, to a file."""
    got = {s: max_over_ranks(measure_rank(cfg, s, tokens=16)) for s in setups}
    if rank == 0:
        torch.save(got, out)


def _assert_measured_equals_computed(
    cfg: ModelConfig, world: int, setups: tuple, tmp_path: Path
) -> None:
    out = tmp_path / "measured.pt"
    run_ranks(_measure, world, cfg, setups, str(out))
    measured, want = torch.load(out), computed(cfg, world)
    assert set(measured) == set(setups)
    for setup, got in measured.items():
        assert {k: got[k] for k in PARTS} == want[setup], setup
        assert got["counters"] == 4 * 2  # AdamW's step counters: embedding and head


@pytest.mark.timeout(120)
def test_computed_equals_a_measured_step_on_two_ranks(tmp_path: Path) -> None:
    _assert_measured_equals_computed(ModelConfig(), 2, SETUPS, tmp_path)


@pytest.mark.timeout(120)
def test_uneven_shards_count_the_fullest_rank(tmp_path: Path) -> None:
    cfg = ModelConfig(n_layer=1)
    assert computed(cfg, 3)["fsdp"]["params"] > computed(cfg, 1)["fsdp"]["params"] / 3
    _assert_measured_equals_computed(cfg, 3, ("fsdp",), tmp_path)


def test_124m_is_gpt2_small_plus_an_untied_head() -> None:
    c = computed(gpt2_config("124M"), world=8)
    head = 50304 * 768
    # 162,201,600 = 123,568,128 (embedding 50304x768 + 12 blocks of 12·768², no biases or
    # position table) + the 38,633,472 head; GPT-2 small with its tied head is 124,439,808.
    assert c["params"] == 162_201_600
    assert c["groups"] == {"muon": 84_934_656, "embed": head, "head": head, "scalar": 0}
    assert c["params"] - head == pytest.approx(124.4e6, rel=0.01)
    # fsdp at W=8: every dim-0 divides by 8, so exactly 1/8 of ddp, part by part.
    assert {k: 8 * v for k, v in c["fsdp"].items()} == c["ddp"]
    # The transient's end-of-backward term dominates: (2 + 4)·head + 2·2·embedding, in bf16.
    assert c["gathered"] == 10 * head
