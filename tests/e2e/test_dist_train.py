"""Training on 2 gloo ranks gives the 1-rank curve: DDP, global batches, accumulation, Muon modes.

Each multi-rank run spawns 2 processes with torchrun's environment variables and calls the
same `train(cfg)` a user's torchrun would; the reference is the same config in one process.
"""

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from optim.parallelism import MUON_EXCHANGES
from tests.dist_utils import run_torchrun_ranks
from tests.helpers import TINY, compose_config
from train import train

# 12 steps of a tiny model, evaluated every 4, in global batches of 4 x 64 tokens.
RUN = [
    *TINY,
    "train.steps=12",
    "train.batch_size=4",
    "train.val_every=4",
    "train.val_tokens=512",  # validation is most of a tiny run's forwards: keep it small
    "dist.timeout_s=60",
]
TOL = 1e-3


def curve(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def val_losses(records: list[dict]) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in records if "val_loss" in r}


def _train_rank(rank: int, world: int, overrides: list[str], run_dir: str, cache: str) -> None:
    # Rank 1 is pointed elsewhere on purpose: it must adopt rank 0's directory and create none.
    where = run_dir if rank == 0 else f"{run_dir}-rank{rank}"
    final = train(compose_config([*overrides, f"run_dir={where}", f"data.cache_dir={cache}"]))
    (Path(where).parent / f"final-rank{rank}-{Path(run_dir).name}.json").write_text(
        json.dumps(final)
    )


def train_on_ranks(world: int, tmp: Path, name: str, cache: Path, *overrides: str) -> list[dict]:
    """The curve of `RUN + overrides` trained on `world` ranks (world 1: in this process)."""
    run_dir = tmp / name
    if world == 1:
        train(compose_config([*RUN, *overrides, f"run_dir={run_dir}", f"data.cache_dir={cache}"]))
    else:
        run_torchrun_ranks(_train_rank, world, [*RUN, *overrides], str(run_dir), str(cache))
        assert not (tmp / f"{name}-rank1").exists(), "rank 1 created a run directory"
        finals = {json.loads((tmp / f"final-rank{r}-{name}.json").read_text()) for r in (0, 1)}
        assert len(finals) == 1, f"ranks returned different final losses: {finals}"
    return curve(run_dir)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory, corpus_cache: Path) -> list[dict]:
    return train_on_ranks(1, tmp_path_factory.mktemp("one"), "run", corpus_cache)


def assert_same_curve(got: list[dict], want: list[dict]) -> None:
    got_val, want_val = val_losses(got), val_losses(want)
    assert list(got_val) == list(want_val) == [0, 4, 8, 12]
    for step, loss in want_val.items():
        assert got_val[step] == pytest.approx(loss, abs=TOL), f"val loss differs at step {step}"
    for g, w in zip(got[1:], want[1:], strict=True):
        assert g["tokens"] == w["tokens"]
        assert g["train_loss"] == pytest.approx(w["train_loss"], abs=TOL), f"step {g['step']}"
    # Training happened: equality is not the trivial initial loss.
    assert want_val[12] < want_val[0] - 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("parallelism", MUON_EXCHANGES)
def test_two_ranks_give_the_one_rank_curve(
    parallelism: str, one_rank: list[dict], tmp_path: Path, corpus_cache: Path
) -> None:
    two = train_on_ranks(2, tmp_path, "two", corpus_cache, f"dist.parallelism={parallelism}")
    assert_same_curve(two, one_rank)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_accumulation_equals_more_ranks(
    one_rank: list[dict], tmp_path: Path, corpus_cache: Path
) -> None:
    """1 rank x 2 micro-steps = 2 ranks x 1 micro-step = 2 ranks x 2 micro-steps (= 1 x 1)."""
    one_by_two = train_on_ranks(1, tmp_path, "1x2", corpus_cache, "train.micro_batch_size=2")
    two_by_one = train_on_ranks(2, tmp_path, "2x1", corpus_cache, "train.micro_batch_size=2")
    two_by_two = train_on_ranks(2, tmp_path, "2x2", corpus_cache, "train.micro_batch_size=1")
    assert_same_curve(one_by_two, two_by_one)
    assert_same_curve(two_by_two, two_by_one)
    assert_same_curve(one_by_two, one_rank)


def _disagreeing_rank(rank: int, world: int, run_dir: str, cache: str) -> None:
    overrides = [*TINY, f"run_dir={run_dir}", f"data.cache_dir={cache}", "dist.timeout_s=60"]
    if rank == 1:
        overrides.append("optim.muon.lr=0.03")
    try:
        train(compose_config(overrides))
    except ValueError as e:
        (Path(run_dir).parent / f"error-rank{rank}.txt").write_text(str(e))


@pytest.mark.timeout(180)
def test_ranks_with_different_configs_fail_before_training(
    tmp_path: Path, corpus_cache: Path
) -> None:
    run_torchrun_ranks(_disagreeing_rank, 2, str(tmp_path / "run"), str(corpus_cache))
    assert "optim.muon.lr: 0.03 here, 0.02 on rank 0" in (tmp_path / "error-rank1.txt").read_text()
    assert "different configs" in (tmp_path / "error-rank0.txt").read_text()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def _indivisible_rank(rank: int, world: int, run_dir: str) -> None:
    cfg = compose_config([*TINY, "train.batch_size=3", f"run_dir={run_dir}"])
    with pytest.raises(ValueError, match=r"train\.batch_size \(3\) must be divisible by the world"):
        train(cfg)
    assert not dist.is_initialized()  # refused before any process group or work


@pytest.mark.timeout(120)
def test_global_batch_not_divisible_by_ranks_fails_first(tmp_path: Path) -> None:
    run_torchrun_ranks(_indivisible_rank, 2, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
