"""The benchmarks' step times (scripts/bench/step_times.py): whole Adam periods, each kind of
step named by the optimizer itself, and a profile of one of each."""

from pathlib import Path

import torch

from optim import build_optimizer
from scripts.bench.step_times import StepTimes, profile_steps, step_kind, time_steps
from tests.helpers import TINY, compose_config
from trainer.config import to_config
from trainer.runtime import init_runtime

EVERY_2 = ["optim.adamw.update_every=2", "optim.adamw.eps_placement=raw"]


def optimizer(*overrides: str):
    conf = to_config(compose_config([*TINY, *overrides, "run_dir=."]))
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8, bias=False))
    opt = build_optimizer(model, conf.optim, device=torch.device("cpu"))
    for p in opt.params():
        p.grad = torch.ones_like(p)
    return opt


def test_a_row_is_the_mean_of_whole_periods_not_a_median() -> None:
    """Alternating 1 ms normal and 3 ms Adam steps cost 2 ms a step; a median of 5 says 1 (or 3,
    by where the count started), and the fifth step is cut (it would tilt the mean)."""
    t = StepTimes(2, [1.0, 3.0, 1.0, 3.0, 1.0], ["normal", "adam"] * 2 + ["normal"])
    assert t.period_s == 2.0
    assert (t.median_s("normal"), t.median_s("adam")) == (1.0, 3.0)
    assert StepTimes(1, [1.0, 2.0, 6.0], ["adam"] * 3).period_s == 3.0


def test_the_optimizer_names_each_step_and_the_timing_rounds_up_to_periods() -> None:
    opt = optimizer(*EVERY_2)
    assert opt.period() == 2
    times = time_steps(init_runtime("cpu", "none"), opt, 3, opt.step)  # 3 -> 4 steps
    assert times.kinds == ["normal", "adam", "normal", "adam"]
    every = optimizer()
    assert every.period() == 1 and step_kind(every) == "adam"
    assert time_steps(init_runtime("cpu", "none"), every, 3, every.step).kinds == ["adam"] * 3


def test_a_profile_has_both_kinds_of_step(tmp_path: Path) -> None:
    opt = optimizer(*EVERY_2)
    out = tmp_path / "profile.txt"

    def step() -> None:
        with torch.profiler.record_function("optimizer"):
            opt.step()

    profile_steps(opt, step, out, "tiny")
    text = out.read_text()
    assert text.startswith("# tiny") and "optimizer:" in text and "over 2 calls" in text
    assert not (tmp_path / "profile.txt.tmp").exists()
