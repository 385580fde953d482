"""dist.parallelism=fsdp_gather: the DDP curve on 2 gloo ranks, and DCP checkpoints across world
sizes and parallelisms.

Each run is the `train(cfg)` a user's torchrun calls (tests/e2e/test_dist_train.py's helpers).
Resumes start in a fresh run directory from a checkpoint path, so the resumed curve (steps
7-12) is compared with the uninterrupted run's: bitwise at the same world size and parallelism,
within the 1e-3 of any two layouts otherwise (sums over ranks associate differently).
"""

from pathlib import Path

import pytest
import torch

from tests.e2e.test_dist_train import RUN, TOL, assert_same_curve, curve, train_on_ranks
from tests.helpers import compose_config
from trainer.checkpoint import files
from trainer.config import to_config

SAVE = ["train.checkpoint_every=6", "train.checkpoint_keep=3"]
MID = 6  # the step a resume starts from
FSDP = "dist.parallelism=fsdp_gather"


def _after(records: list[dict], step: int) -> list[dict]:
    return [r for r in records if r["step"] > step]


def assert_continues(resumed: list[dict], full: list[dict], exact: bool) -> None:
    """`resumed` (from step MID, its history copied) follows `full` after it."""
    want, resumed = _after(full, MID), _after(resumed, MID)
    assert [r["step"] for r in resumed] == [r["step"] for r in want]
    for got, ref in zip(resumed, want, strict=True):
        for key in ("train_loss", "val_loss"):
            if key in ref:
                if exact:
                    assert got[key] == ref[key], f"{key} at step {ref['step']}"
                else:
                    assert got[key] == pytest.approx(ref[key], abs=TOL), f"step {ref['step']}"


def _checkpoint(run: Path) -> str:
    return str(run / files.CHECKPOINTS_DIR / files.step_dir_name(MID))


@pytest.fixture(scope="module")
def fsdp_two(tmp_path_factory: pytest.TempPathFactory, corpus_cache: Path) -> Path:
    """A 2-rank fsdp run of 12 steps, saving (layout dcp) at steps 6 and 12."""
    tmp = tmp_path_factory.mktemp("fsdp2")
    train_on_ranks(2, tmp, "run", corpus_cache, FSDP, *SAVE)
    return tmp / "run"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp_gives_the_ddp_curve(fsdp_two: Path, tmp_path: Path, corpus_cache: Path) -> None:
    ddp = train_on_ranks(2, tmp_path, "ddp", corpus_cache)
    assert_same_curve(curve(fsdp_two), ddp)
    # Gradient accumulation under fsdp: no reduce-scatter until the last micro-step.
    accumulated = train_on_ranks(2, tmp_path, "acc", corpus_cache, FSDP, "train.micro_batch_size=1")
    assert_same_curve(accumulated, ddp)
    meta = files.validate(fsdp_two / files.CHECKPOINTS_DIR / files.step_dir_name(12))
    assert meta["layout"] == "dcp" and meta["world_size"] == 2
    assert any(name.startswith(f"{files.DCP_DIR}/") for name in meta["files"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dcp_resume_on_two_one_and_a_ddp_run(
    fsdp_two: Path, tmp_path: Path, corpus_cache: Path
) -> None:
    full, ckpt = curve(fsdp_two), _checkpoint(fsdp_two)
    resume = f"train.resume={ckpt}"
    same = train_on_ranks(2, tmp_path, "2to2", corpus_cache, FSDP, resume)
    assert_continues(same, full, exact=True)
    fewer = train_on_ranks(1, tmp_path, "2to1", corpus_cache, FSDP, resume)
    assert_continues(fewer, full, exact=False)
    ddp = train_on_ranks(1, tmp_path, "fsdp_to_ddp", corpus_cache, resume)
    assert_continues(ddp, full, exact=False)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_rank_fsdp_is_ddp_and_its_saves_resume_on_two(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """On one rank FSDP2, sharded Muon on a 1-rank mesh and optimizer-state offload compute
    exactly what the plain run computes (every loss equal); then 1 → 2 ranks, from its dcp
    save (written while the state lived in host memory) and the plain run's torch_save one."""
    key = ("train_loss", "val_loss")
    runs = {"ddp": train_on_ranks(1, tmp_path, "one_ddp", corpus_cache, *SAVE)}
    runs["fsdp"] = train_on_ranks(
        1, tmp_path, "one_fsdp", corpus_cache, *SAVE, FSDP, "optim.offload=true"
    )
    assert [[r.get(k) for k in key] for r in runs["fsdp"]] == [
        [r.get(k) for k in key] for r in runs["ddp"]
    ]
    for strategy, one in runs.items():
        resume = f"train.resume={_checkpoint(tmp_path / f'one_{strategy}')}"
        two = train_on_ranks(2, tmp_path, f"{strategy}_1to2", corpus_cache, FSDP, resume)
        assert_continues(two, one, exact=False)


# 4 ranks as 2 × 2: HSDP's (replicate, shard) mesh, or (shard, tp) with each block's heads and
# MLP split over a TP pair that reads one batch (FSDP2 over the pairs)
MESHES_OF_FOUR = {"hsdp": "dist.replicate=2", "tp": "dist.tensor_parallel=2"}


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", list(MESHES_OF_FOUR))
def test_a_2x2_mesh_gives_the_curve_and_resumes(
    name: str, fsdp_two: Path, tmp_path: Path, corpus_cache: Path
) -> None:
    """A 2 × 2 mesh on 4 ranks gives the 2-rank FSDP run's curve (the same model, data and
    batch, its sums associated otherwise); from its DCP checkpoint it resumes bit for bit on
    the same mesh, and on 2 ranks of plain FSDP within TOL."""
    layout = MESHES_OF_FOUR[name]
    run = train_on_ranks(4, tmp_path, name, corpus_cache, FSDP, layout, *SAVE)
    assert_same_curve(run, curve(fsdp_two))
    meta = files.validate(tmp_path / name / files.CHECKPOINTS_DIR / files.step_dir_name(12))
    assert meta["layout"] == "dcp" and meta["world_size"] == 4
    resume = f"train.resume={_checkpoint(tmp_path / name)}"
    same = train_on_ranks(4, tmp_path, f"{name}_again", corpus_cache, FSDP, layout, resume)
    assert_continues(same, run, exact=True)
    two = train_on_ranks(2, tmp_path, f"{name}_to_2", corpus_cache, FSDP, resume)
    assert_continues(two, run, exact=False)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_hsdp_beside_tensor_parallel_on_eight_ranks_gives_the_curve(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """dist.replicate=2 with dist.tensor_parallel=2 on 8 ranks: a 2 × 2 × 2 (replicate, shard,
    tp) mesh, four groups of a TP pair reading one batch each. Its curve is the 4-rank FSDP
    run's."""
    fsdp = train_on_ranks(4, tmp_path, "fsdp4", corpus_cache, FSDP)
    both = ["dist.replicate=2", "dist.tensor_parallel=2"]
    assert_same_curve(train_on_ranks(8, tmp_path, "hsdp_tp", corpus_cache, FSDP, *both), fsdp)


def test_fsdp_run_config_is_checked() -> None:
    from trainer.runtime import resolve_param_dtype

    assert resolve_param_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_param_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_param_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert RUN  # the shared tiny run
    for overrides, message in [
        (["dist.replicate=2"], r"dist\.replicate=2 .* needs an fsdp dist\.parallelism"),
        (
            [FSDP, "dist.replicate=2", "dist.nproc=3", "train.batch_size=6"],
            r"dist\.replicate=2 must divide",
        ),
        ([FSDP, "dist.replicate=0"], r"dist\.replicate must be >= 1"),
        (
            ["dist.tensor_parallel=2"],
            r"dist\.tensor_parallel=2 needs dist\.parallelism=fsdp_gather",
        ),
        ([FSDP, "dist.tensor_parallel=0"], r"dist\.tensor_parallel must be >= 1"),
        (
            [FSDP, "dist.tensor_parallel=2", "dist.replicate=2", "dist.nproc=2"],
            r"dist\.tensor_parallel=2 × dist\.replicate=2 must divide the ranks, 2 here",
        ),
        ([FSDP, "dist.tensor_parallel=4"], r"must divide model\.n_head \(2\)"),
        (
            [FSDP, "dist.tensor_parallel=2", "model.attention.gate=true"],
            r"model\.attention\.gate works across all of them",
        ),
        (
            [FSDP, "dist.tensor_parallel=2", "model.attention.merged_qkv=true"],
            r"model\.attention\.merged_qkv works across",
        ),
        (
            [
                FSDP,
                "dist.tensor_parallel=2",
                "model.attention.qk_norm=false",
                "optim.muon.qk_clip=100",
            ],
            r"optim\.muon\.qk_clip works across",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            to_config(compose_config([*RUN, *overrides, "run_dir=."]))
