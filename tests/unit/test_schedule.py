"""The schedules (pure functions of the step), and the optimizer object that applies them."""

import pytest

from optim.config import MuonConfig, OptimConfig, ScheduleConfig
from optim.schedule import OptimValues, lr_multiplier, muon_momentum, optim_values


class Schedules:
    """optim_values over `total` steps for these settings (momentum warmup from `start` to
    `end` over `warmup` steps)."""

    def __init__(self, total: int, schedule: ScheduleConfig, warmup: int = 0,
                 start: float = 0.0, end: float = 0.0) -> None:  # fmt: skip
        muon = MuonConfig(momentum=end, momentum_warmup_start=start, momentum_warmup_steps=warmup)
        self.cfg, self.total = OptimConfig(muon=muon, schedule=schedule), total

    def at(self, step: int) -> OptimValues:
        return optim_values(self.cfg, step, self.total)


def lr(step: int) -> float:
    """100 steps: warmup over 10, cooldown over the last 30 (steps 70..99) to 0.1."""
    return lr_multiplier(step, 100, warmup_steps=10, cooldown_frac=0.3, min_lr_frac=0.1)


def test_lr_multiplier_at_key_steps():
    assert lr(0) == pytest.approx(1 / 10)  # the first step already moves the weights
    assert lr(4) == pytest.approx(5 / 10)
    assert lr(9) == 1.0  # last warmup step runs at the full LR
    assert lr(10) == 1.0
    assert lr(50) == 1.0
    assert lr(70) == 1.0  # first cooldown step: 30 steps left of 30
    assert lr(71) == pytest.approx(0.1 + 29 / 30 * 0.9)  # 0.97
    assert lr(85) == pytest.approx(0.1 + 15 / 30 * 0.9)  # 0.55
    assert lr(99) == pytest.approx(0.1 + 1 / 30 * 0.9)  # final step: one step above the floor
    assert lr(99) > 0.1  # the floor itself is reached after the last step


def test_lr_multiplier_is_monotone_in_each_phase():
    values = [lr(s) for s in range(100)]
    assert values[:10] == sorted(values[:10])
    assert values[69:] == sorted(values[69:], reverse=True)
    assert len(set(values[70:])) == 30  # every cooldown step lowers the LR


def test_lr_multiplier_without_warmup_or_cooldown():
    assert lr_multiplier(0, 10, 0, 0.0, 0.0) == 1.0
    assert lr_multiplier(9, 10, 0, 0.0, 0.0) == 1.0
    assert lr_multiplier(9, 10, 0, 0.5, 0.0) == pytest.approx(1 / 5)
    # All cooldown: 4/4, 3/4, 2/4, 1/4 of the LR; never a step at 0.
    assert [lr_multiplier(s, 4, 0, 1.0, 0.0) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]


def test_lr_multiplier_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"step must be in \[0, 100\)"):
        lr(100)
    with pytest.raises(ValueError, match=r"step must be in \[0, 100\)"):
        lr(-1)
    with pytest.raises(ValueError, match="exceed"):
        lr_multiplier(0, 10, 6, 0.5, 0.0)


def test_muon_momentum_warmup():
    assert muon_momentum(0, 300, 0.85, 0.95) == 0.85
    assert muon_momentum(150, 300, 0.85, 0.95) == pytest.approx(0.90)
    assert muon_momentum(299, 300, 0.85, 0.95) == pytest.approx(0.85 + 299 / 300 * 0.1)
    assert muon_momentum(300, 300, 0.85, 0.95) == 0.95
    assert muon_momentum(5000, 300, 0.85, 0.95) == 0.95
    assert muon_momentum(0, 0, 0.85, 0.95) == 0.95  # no warmup: constant


# The two records' schedules, at their boundaries, against the values docs/records.md gives by hand.


def test_record_2024_11_06_lr_schedule_at_its_boundaries():
    """No warmup; 1 until s = 2285; then (3200 - s) / 914 from s = 2286; the last update 1/914."""
    s = Schedules(3200, ScheduleConfig(0, 0.2856, 0.0))
    assert s.at(0).lr_mult == 1.0  # first step
    assert s.at(2285).lr_mult == 1.0  # last step before the cooldown
    assert s.at(2286).lr_mult == 1.0  # first cooldown step: (3200 - 2286) / 914
    assert s.at(2287).lr_mult == pytest.approx(913 / 914)
    assert s.at(3199).lr_mult == pytest.approx(1 / 914)  # last step


def test_record_2025_01_26_lr_schedule_at_its_boundaries():
    """Floor 0.1 over the last 40 %: f = 0.1 + 0.9 (1770 - s) / 708 for s >= 1062."""
    s = Schedules(1770, ScheduleConfig(0, 0.4, 0.1))
    assert s.at(0).lr_mult == 1.0
    assert s.at(1062).lr_mult == 1.0  # (1770 - 1062) / 708 = 1
    assert s.at(1063).lr_mult == pytest.approx(0.1 + 0.9 * 707 / 708)
    assert s.at(1769).lr_mult == pytest.approx(0.1 + 0.9 / 708)  # ~0.1013, as the record logs


def test_momentum_warmup_at_its_boundaries():
    """record_2024_11_06: 0.85 + 0.10 min(s / 500, 1); record_2025_01_26 the same over 300 steps."""
    a = Schedules(3200, ScheduleConfig(), 500, 0.85, 0.95)
    assert [a.at(s).muon_momentum for s in (0, 250, 500, 3199)] == pytest.approx(
        [0.85, 0.90, 0.95, 0.95]
    )
    assert a.at(499).muon_momentum == pytest.approx(0.85 + 0.1 * 499 / 500)
    b = Schedules(1770, ScheduleConfig(0, 0.4, 0.1), 300, 0.85, 0.95)
    assert b.at(299).muon_momentum < 0.95 == b.at(300).muon_momentum


def test_warmup_boundaries():
    """Warmup over 10 of 100 steps: 1/10 at the first step, full LR at the last warmup step."""
    s = Schedules(100, ScheduleConfig(10, 0.3, 0.1))
    assert s.at(0).lr_mult == pytest.approx(0.1)
    assert s.at(9).lr_mult == 1.0
    assert s.at(10).lr_mult == 1.0
