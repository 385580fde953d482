"""A stopped run, resumed, gives the losses and parameters of a run that never stopped.

References: the same config trained straight through, in one process or on the same number
of ranks. Stops are real signals (`train.fault.signal_at_step` sends the rank a SIGTERM) or
a SIGTERM from outside; elastic restarts are in test_launch.py.
"""

import contextlib
import json
import logging
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.dist_utils import run_torchrun_ranks
from tests.helpers import TINY, compose_config, sigterm_after
from train import train
from trainer.checkpoint import files as checkpoint
from trainer.launch.signals import Stopped
from trainer.nonfinite import NonFiniteStep

REPO = Path(__file__).resolve().parents[2]
RUN = [*TINY, "train.steps=20", "train.val_every=5", "train.val_tokens=512",
       "train.checkpoint_every=5", "train.checkpoint_at_end=true", "dist.timeout_s=60"]  # fmt: skip


def records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> list[tuple]:
    """(step, tokens, train loss, val loss) of every record: the curve."""
    return [
        (r["step"], r["tokens"], r.get("train_loss"), r.get("val_loss")) for r in records(run_dir)
    ]


def final_state(run_dir: Path) -> dict:
    loaded = checkpoint.load(checkpoint.find_latest(run_dir / checkpoint.CHECKPOINTS_DIR))
    return {"model": loaded.parts["model"], "optimizers": loaded.parts["optimizers"]}


def run(run_dir: Path, cache: Path, *overrides: str) -> float:
    cfg = compose_config([*RUN, *overrides, f"run_dir={run_dir}", f"data.cache_dir={cache}"])
    return train(cfg)


def run_until_stopped(run_dir: Path, cache: Path, *overrides: str) -> Stopped:
    with pytest.raises(Stopped) as stopped:
        run(run_dir, cache, *overrides)
    return stopped.value


def assert_bitwise(a: object, b: object, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"tensors differ at {where}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_bitwise(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise(x, y, f"{where}/{i}")
    else:
        assert a == b, f"{a!r} != {b!r} at {where}"


# The optimizer over banks and as one Adam function (optim.compile), traced without inductor
# (its compile: tests/unit/test_optimizer_compile.py): Muon's state as views of its stacks
# through a checkpoint, Adam stopped inside an update pair (step 9 of pairs 2k-1, 2k)
BANKED = ["optim.compile=true", "optim.compile_backend=eager", "optim.adamw.update_every=2",
          "optim.adamw.eps_placement=raw"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [["train.autocast=none"], ["train.autocast=bf16"], ["train.autocast=none", *BANKED],
     ["train.autocast=none", "model.mlp.experts=4"]],
    ids=["none", "bf16", "compiled optimizer", "experts"],
)  # fmt: skip
def test_stop_and_resume_is_bitwise_on_one_rank(
    tmp_path: Path, corpus_cache: Path, settings: list[str]
) -> None:
    straight = tmp_path / "straight"
    common = (*settings, "train.steps=12")
    final = run(straight, corpus_cache, *common)

    resumed = tmp_path / "resumed"
    # The SIGTERM lands during step 9; the loop sees it in that step's reduction, finishes
    # the step, saves, stops (between the periodic saves of steps 5 and 10).
    stopped = run_until_stopped(resumed, corpus_cache, *common, "train.fault.signal_at_step=9")
    assert (stopped.signal_name, stopped.step) == ("SIGTERM", 9)
    assert stopped.checkpoint == str(resumed / "checkpoints" / "step_000009")
    assert [r["step"] for r in records(resumed)][-1] == 9
    final_resumed = run(resumed, corpus_cache, *common)

    assert final_resumed == final
    assert losses(resumed) == losses(straight)
    assert_bitwise(final_state(resumed), final_state(straight))
    times = [r["train_time_ms"] for r in records(resumed)]
    assert times == sorted(times), "train time continues from the checkpoint's"


def _rank_job(rank: int, world: int, run_dir: str, overrides: list[str], cache: str) -> None:
    with contextlib.suppress(Stopped):  # the stopping run: its checkpoint is what counts
        run(Path(run_dir), Path(cache), *overrides)


def on_two_ranks(run_dir: Path, cache: Path, *overrides: str) -> None:
    """One 2-rank run (a fresh set of processes and port per run, as torchrun would)."""
    run_torchrun_ranks(_rank_job, 2, str(run_dir), list(overrides), str(cache))


def test_rng_states_round_trip_through_a_checkpoint_file(tmp_path: Path) -> None:
    import random

    import numpy as np

    from trainer.runtime import rng_state, set_rng_state

    cpu = torch.device("cpu")
    torch.save(rng_state(cpu), tmp_path / "rng.pt")
    want = (random.random(), np.random.rand(), torch.rand(3))
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), cpu)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[:2] == want[:2] and torch.equal(got[2], want[2])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_ranks_resume_continues_the_curve(tmp_path: Path, corpus_cache: Path) -> None:
    """Owner-only Muon momentum (dist.parallelism=ddp_owners), a SIGTERM to rank 1 alone: both
    ranks stop at the same step, and the resumed run matches the one that never stopped."""
    common = "dist.parallelism=ddp_owners"
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    on_two_ranks(straight, corpus_cache, common)
    on_two_ranks(
        resumed, corpus_cache, common, "train.fault.signal_at_step=8", "train.fault.rank=1"
    )
    assert [r["step"] for r in records(resumed)][-1] == 8, "both ranks stopped after step 8"
    assert checkpoint.find_latest(resumed / "checkpoints").name == "step_000008"
    on_two_ranks(resumed, corpus_cache, common)
    meta = json.loads((resumed / "checkpoints" / "step_000020" / "meta.json").read_text())
    assert meta["world_size"] == 2
    a, b = losses(resumed), losses(straight)
    assert [r[:2] for r in a] == [r[:2] for r in b]
    for (step, _, train_a, val_a), (_, _, train_b, val_b) in zip(a, b, strict=True):
        for x, y in ((train_a, train_b), (val_a, val_b)):
            assert (x is None) == (y is None)
            assert x is None or x == pytest.approx(y, abs=1e-6), f"step {step}"
    sa, sb = final_state(resumed), final_state(straight)
    for name, tensor in sa["model"].items():
        torch.testing.assert_close(tensor, sb["model"][name], atol=1e-6, rtol=0)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_sharded_ranks_stopped_inside_a_pair_resume_bit_for_bit(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """dist.parallelism=ddp_row_shards with Adam every other step: each rank sums its own two
    gradients and only the sum is exchanged (optim/adam.py), so a stop inside a pair saves
    both ranks' partial sums; the resumed run is the straight one bit for bit."""
    common = ("dist.parallelism=ddp_row_shards", *BANKED)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    on_two_ranks(straight, corpus_cache, *common)
    on_two_ranks(resumed, corpus_cache, *common, "train.fault.signal_at_step=9")
    assert checkpoint.find_latest(resumed / "checkpoints").name == "step_000009"
    saved = final_state(resumed)["optimizers"]
    stacked = [v for opt in saved for st in opt["state"].values() for k, v in st.items()
               if k == "grad_sum" and v.ndim and v.shape[0] == 2 and v.abs().sum() > 0]  # fmt: skip
    assert stacked, "the stop inside a pair saved every rank's partial sum"
    on_two_ranks(resumed, corpus_cache, *common)
    assert losses(resumed) == losses(straight)
    assert_bitwise(final_state(resumed), final_state(straight))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_one_rank_checkpoint_resumes_on_two_ranks(tmp_path: Path, corpus_cache: Path) -> None:
    one = tmp_path / "one"
    run(one, corpus_cache)
    moved = tmp_path / "moved"
    stopped = run_until_stopped(moved, corpus_cache, "train.fault.signal_at_step=9")
    assert stopped.step == 9
    on_two_ranks(moved, corpus_cache)
    meta = json.loads((moved / "checkpoints" / "step_000020" / "meta.json").read_text())
    assert meta["world_size"] == 2
    a, b = losses(moved), losses(one)
    assert [r[:2] for r in a] == [r[:2] for r in b]
    assert a[:10] == b[:10], "the one-rank part (steps 0-9) is the same run"
    for (step, _, train_a, val_a), (_, _, train_b, val_b) in zip(a[10:], b[10:], strict=True):
        assert train_a == pytest.approx(train_b, abs=1e-3), f"step {step}"
        assert (val_a is None) == (val_b is None)
        assert val_a is None or val_a == pytest.approx(val_b, abs=1e-3), f"step {step}"
    assert b[-1][3] < b[0][3] - 1.0, "training happened"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_from_outside_saves_and_the_rerun_continues_exactly(
    tmp_path: Path, corpus_cache: Path
) -> None:
    # The same torch threads here and in the command: the promise is for the same number.
    overrides = [*RUN, "train.steps=12", "train.checkpoint_every=0", "train.threads=1",
                 f"data.cache_dir={corpus_cache}"]  # fmt: skip
    straight = tmp_path / "straight"
    final = train(compose_config([*overrides, f"run_dir={straight}"]))
    run_dir = tmp_path / "cli"
    cmd = [sys.executable, "train.py", *overrides, f"hydra.run.dir={run_dir}"]
    status, out = sigterm_after(cmd, REPO, run_dir, records=6)
    assert status == 128 + signal.SIGTERM, out[-3000:]
    assert "Traceback" not in out
    stopped_at = records(run_dir)[-1]["step"]
    assert 5 <= stopped_at < 12, "the signal arrived mid-run"
    assert f"stopped by SIGTERM after step {stopped_at}" in out
    assert checkpoint.find_latest(run_dir / "checkpoints").name == f"step_{stopped_at:06d}"

    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{stopped_at:06d}'}" in out.stdout
    assert losses(run_dir) == losses(straight)
    assert records(run_dir)[-1]["val_loss"] == final


# A NaN loss (its gradients finite), and a NaN gradient under a finite loss: the gradient check
# rides in the step's one all-reduce, so both are caught at the step where they happen.
NONFINITE = {
    "loss": ("train.fault.nonfinite_at_step=7", r"non-finite training loss \(nan\) at step 7"),
    "gradient": (
        "train.fault.nonfinite_grad_at_step=7",
        r"non-finite gradient \(the loss, [0-9.]+, is finite\) at step 7",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", NONFINITE)
def test_nonfinite_step_stops_naming_the_last_good_checkpoint(
    tmp_path: Path, corpus_cache: Path, kind: str
) -> None:
    fault, message = NONFINITE[kind]
    with pytest.raises(NonFiniteStep, match=message) as e:
        run(tmp_path, corpus_cache, fault)
    good = tmp_path / "checkpoints" / "step_000005"
    assert str(good) in str(e.value)
    assert checkpoint.find_latest(tmp_path / "checkpoints") == good
    params = checkpoint.load(good).parts["model"]
    assert all(torch.isfinite(t).all() for t in params.values())
    assert [r["step"] for r in records(tmp_path)][-1] == 6, "the bad step is not logged as good"


@pytest.mark.slow
@pytest.mark.parametrize("kind", NONFINITE)
def test_nonfinite_step_skip_drops_that_update_and_goes_on(
    tmp_path: Path, corpus_cache: Path, kind: str
) -> None:
    final = run(tmp_path, corpus_cache, "train.on_nonfinite=skip", NONFINITE[kind][0])
    assert math.isfinite(final)
    bad = [r for r in records(tmp_path) if r.get("skipped")]
    assert [r["step"] for r in bad] == [7]
    assert (bad[0]["train_loss"] is None) == (kind == "loss"), "a finite loss is still logged"
    state = final_state(tmp_path)
    adamw = state["optimizers"][-1]["state"]
    assert {int(s["step"]) for s in adamw.values()} == {19}, "19 of 20 steps updated"
    assert all(torch.isfinite(t).all() for t in state["model"].values())


@pytest.mark.slow
def test_resuming_a_finished_run_does_no_work(
    tmp_path: Path, corpus_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    final = run(tmp_path, corpus_cache)
    before = (tmp_path / "metrics.jsonl").read_text()
    assert run(tmp_path, corpus_cache) == final
    assert (tmp_path / "metrics.jsonl").read_text() == before


def test_a_stop_in_the_last_step_resumes_to_the_final_validation_record(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """Stopped during its last step, the run saves without a validation loss; the resume
    evaluates and writes that loss as the last step's record (what marks a run finished)."""
    short = ["train.steps=4", "train.val_every=0", "train.checkpoint_every=0"]
    run_until_stopped(tmp_path, corpus_cache, *short, "train.fault.signal_at_step=4")
    assert "val_loss" not in records(tmp_path)[-1] and records(tmp_path)[-1]["step"] == 4
    final = run(tmp_path, corpus_cache, *short)
    last = records(tmp_path)[-1]
    assert (last["step"], last["val_loss"]) == (4, final)
    assert run(tmp_path / "straight", corpus_cache, *short) == final


def test_a_torn_last_metrics_line_is_dropped_on_resume(tmp_path: Path, corpus_cache: Path) -> None:
    """A kill in the middle of writing a record leaves half a line: the resume keeps the
    records up to its checkpoint, drops the torn one, and writes each later step once."""
    short = ["train.steps=6", "train.val_every=0", "train.checkpoint_every=3"]
    run_until_stopped(tmp_path, corpus_cache, *short, "train.fault.signal_at_step=3")
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "train_lo')
    run(tmp_path, corpus_cache, *short)
    assert [r["step"] for r in records(tmp_path)] == list(range(7))


@pytest.mark.slow
def test_changed_values_are_named_and_take_effect(
    tmp_path: Path, corpus_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A changed LR is named and used; so is another thread count, which also says that the
    bitwise promise needs the saved one (docs/checkpoints.md, "Exact resume"), and is this
    run's alone."""
    assert torch.get_num_threads() == 1  # the suite's (tests/conftest.py)
    run_until_stopped(tmp_path, corpus_cache, "train.fault.signal_at_step=4")
    meta = tmp_path / "checkpoints" / "step_000004" / "meta.json"
    assert json.loads(meta.read_text())["threads"] == 1
    with caplog.at_level(logging.WARNING, logger="train"):
        run(tmp_path, corpus_cache, "optim.adamw.head_lr=0.001", "train.threads=2")
    for said in ("optim.adamw.head_lr: 0.008 -> 0.001", "train.threads: 0 -> 2",
                 "computes with 2 torch thread(s) per rank, the checkpoint's with 1",
                 "train.threads=1 matches it"):  # fmt: skip
        assert said in caplog.text, said
    assert torch.get_num_threads() == 1, "the caller's threads are put back"
    groups = final_state(tmp_path)["optimizers"][-1]["param_groups"]
    assert {g["initial_lr"] for g in groups if g["name"] == "head"} == {0.001}


@pytest.mark.slow
def test_a_stop_inside_an_evaluation_resumes_to_the_same_curve(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """The SIGTERM of step 10 lands before that step's evaluation (train.val_every=5), which it
    cuts short: the save of step 10 has no val loss. The resumed run measures it first, into
    step 10's record, so metrics.jsonl is the uninterrupted run's, each step once."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = ("train.steps=12",)
    run(straight, corpus_cache, *common)
    stopped = run_until_stopped(resumed, corpus_cache, *common, "train.fault.signal_at_step=10")
    assert (stopped.signal_name, stopped.step) == ("SIGTERM", 10)
    assert "val_loss" not in records(resumed)[-1], "the stop did not cut the evaluation short"
    run(resumed, corpus_cache, *common)
    assert losses(resumed) == losses(straight)
    assert [r["step"] for r in records(resumed)] == list(range(13))
