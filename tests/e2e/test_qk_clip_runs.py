"""QK-clip in runs: FSDP2 shards on 2 and 3 gloo ranks clip as one process does, and
`optim.muon.qk_clip` through `train()` logs and clips (unit checks: tests/unit/test_qk_clip.py)."""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from model.config import update
from optim.qk_clip import QKClip
from tests.dist_utils import run_ranks
from tests.helpers import TINY, compose_config
from tests.unit.test_qk_clip import SHARDED, between, build, maxima, tokens
from train import train


def _fsdp_rank(rank: int, world: int, taus: dict, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    results = {}
    for merged in (False, True):
        model = build(update(SHARDED, {"attention.merged_qkv": merged}))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        clip = QKClip(model, taus[merged], dist.group.WORLD)
        clip.start()
        model(tokens(rank))  # each rank its own batch: the maxima must be all-reduced
        model.reshard()
        stats = clip.apply()
        clipped = model(tokens(0))  # the next forward all-gathers the clipped shards
        model.reshard()  # the root keeps its parameters gathered after forward
        weights = {n: p.full_tensor() for n, p in model.named_parameters()}
        results[merged] = (stats, weights, clipped.detach())
    if rank == 0:
        torch.save(results, Path(out) / "fsdp.pt")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_fsdp_shards_clip_as_one_process(world: int, tmp_path: Path) -> None:
    """gloo ranks, FSDP2 on each block and the root, a batch per rank, against one process
    that sees every rank's batch as a micro-batch."""
    want, taus = {}, {}
    for merged in (False, True):
        model = build(update(SHARDED, {"attention.merged_qkv": merged}))
        clip = QKClip(model, 1.0)
        clip.start()
        for rank in range(world):
            model(tokens(rank))
        taus[merged] = clip.tau = between(maxima(model))
        stats = clip.apply()
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        want[merged] = (stats, weights, model(tokens(0)).detach())
    run_ranks(_fsdp_rank, world, taus, str(tmp_path))
    got = torch.load(tmp_path / "fsdp.pt")
    for merged, (stats, weights, logits) in want.items():
        g_stats, g_weights, g_logits = got[merged]
        assert g_stats["qk_clip/clipped_heads"] == stats["qk_clip/clipped_heads"] == 5
        assert g_stats["qk_clip/max_logit"] == pytest.approx(stats["qk_clip/max_logit"], 1e-6)
        assert g_weights.keys() == weights.keys()
        for name, w in weights.items():
            torch.testing.assert_close(g_weights[name], w, rtol=1e-6, atol=0, msg=name)
        torch.testing.assert_close(g_logits, logits, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_training_with_qk_clip_logs_and_clips(tmp_path: Path, corpus_cache: Path) -> None:
    """optim.muon.qk_clip wired through train(): every step logs the max logit, heads over τ
    are clipped, and with a τ no logit reaches nothing changes (the run equals one without)."""

    def run(name: str, *extra: str) -> list[dict]:
        cfg = [*TINY, "model.attention.qk_norm=false", f"run_dir={tmp_path / name}",
               f"data.cache_dir={corpus_cache}", *extra]  # fmt: skip
        train(compose_config(cfg))
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x) for x in lines]

    clipped = run("clip", "optim.muon.qk_clip=0.5")
    steps = [r for r in clipped if r["step"] > 0]
    assert all("qk_clip/max_logit" in r for r in steps)
    assert sum(r["qk_clip/clipped_heads"] for r in steps) > 0
    never = run("never", "optim.muon.qk_clip=1e9")
    plain = run("plain")
    assert [r.get("val_loss") for r in never] == [r.get("val_loss") for r in plain]
    assert [r.get("train_loss") for r in never] == [r.get("train_loss") for r in plain]
    assert all(r["qk_clip/clipped_heads"] == 0 for r in never if r["step"] > 0)
