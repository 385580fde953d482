"""Record D's tied token table and head (optim.tie_embed_head_until, optim/tied.py) in real runs:
a run stopped after the split resumes bit for bit through the trainer's checkpoint, and 2 gloo
ranks give the 1-rank curve (the tie acts on the rank-averaged gradients). ~25 s on 2 cores; the
fast float64 checks are tests/unit/test_record_d_tied.py."""

from pathlib import Path

import pytest
import torch

from tests.e2e.test_dist_train import TOL, train_on_ranks, val_losses
from tests.e2e.test_resume import assert_bitwise, final_state, losses, run, run_until_stopped

# Tied until the update of step s = 5 (trainer step 6, the head's third update).
TIED = ("model.embed.tied_init=true", "model.head.init_std=0.005", "optim.adamw.update_every=2",
        "optim.adamw.eps_placement=raw", "optim.tie_embed_head_until=5")  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tied_run_resumes_bitwise_after_the_split(tmp_path: Path, corpus_cache: Path) -> None:
    """Stopped at trainer step 7 (s = 6: after the split, inside a pair; the unit tests resume
    the optimizer on both sides), through the trainer's own checkpoint."""
    stop_at = 7
    common = (*TIED, "train.steps=10")
    straight = tmp_path / "straight"
    final = run(straight, corpus_cache, *common)
    model = final_state(straight)["model"]
    assert not torch.equal(model["embed.weight"], model["lm_head.weight"])  # split, then apart

    resumed = tmp_path / "resumed"
    stopped = run_until_stopped(
        resumed, corpus_cache, *common, f"train.fault.signal_at_step={stop_at}"
    )
    assert stopped.step == stop_at
    at_stop = final_state(resumed)["model"]
    assert torch.equal(at_stop["embed.weight"], at_stop["lm_head.weight"])  # tied at the stop
    assert run(resumed, corpus_cache, *common) == final
    assert losses(resumed) == losses(straight)
    assert_bitwise(final_state(resumed), final_state(straight))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tied_two_ranks_give_the_one_rank_curve(tmp_path: Path, corpus_cache: Path) -> None:
    one = train_on_ranks(1, tmp_path, "one", corpus_cache, *TIED)
    two = train_on_ranks(2, tmp_path, "two", corpus_cache, *TIED)
    for g, w in zip(two[1:], one[1:], strict=True):  # every train and validation loss
        for key in ("train_loss", "val_loss"):
            assert g.get(key) == pytest.approx(w.get(key), abs=TOL), f"{key} at {g['step']}"
    assert val_losses(one)[12] < val_losses(one)[0] - 0.1  # it trained (slowly: Adam every 2)
