"""LR and momentum schedules, and applying them to built optimizers."""

import pytest
import torch
from torch import nn

from optim import Muon, apply_schedules, build_optimizers
from optim.config import OptimConfig
from optim.schedule import lr_multiplier, muon_momentum


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


def small_model() -> nn.Module:
    model = nn.Module()
    model.embed = nn.Embedding(10, 8)
    model.hidden = nn.Linear(8, 8, bias=False)
    model.gain = nn.Parameter(torch.ones(8))
    model.lm_head = nn.Linear(8, 10, bias=False)
    return model


def schedule_cfg(name: str) -> OptimConfig:
    cfg = OptimConfig(name=name)
    cfg.schedule.warmup_steps = 10
    cfg.schedule.cooldown_frac = 0.3
    cfg.schedule.min_lr_frac = 0.1
    cfg.muon.momentum_warmup_steps = 20
    return cfg


@pytest.mark.parametrize("name", ["muon_adamw", "adamw"])
@pytest.mark.parametrize("step", [0, 9, 15, 50, 70, 99])
def test_apply_schedules_sets_every_group(name, step):
    cfg = schedule_cfg(name)
    optimizers = build_optimizers(small_model(), cfg, "cpu")
    mult = apply_schedules(optimizers, step, 100, cfg)
    assert mult == lr(step)
    a = cfg.adamw
    built_lrs = {"muon": cfg.muon.lr, "hidden": a.hidden_lr, "embed": a.embed_lr}
    built_lrs |= {"head": a.head_lr, "scalar": a.scalar_lr}
    seen = []
    for opt in optimizers:
        for group in opt.param_groups:
            seen.append(group["name"])
            assert group["initial_lr"] == built_lrs[group["name"]]
            assert group["lr"] == pytest.approx(built_lrs[group["name"]] * mult)
    expected_groups = ["embed", "head", "scalar"]
    expected_groups.insert(0, "muon" if name == "muon_adamw" else "hidden")
    assert seen == expected_groups
    if name == "muon_adamw":
        momentum = optimizers[0].param_groups[0]["momentum"]
        assert isinstance(optimizers[0], Muon)
        assert momentum == pytest.approx(0.85 + min(step, 20) / 20 * 0.10)


def test_apply_schedules_does_not_compound():
    """Each call sets lr from initial_lr, so the LR at a step does not depend on the past."""
    cfg = schedule_cfg("muon_adamw")
    optimizers = build_optimizers(small_model(), cfg, "cpu")
    for step in range(100):
        apply_schedules(optimizers, step, 100, cfg)
    final = 0.1 + 0.9 / 30  # the last of 30 cooldown steps, one step above the 0.1 floor
    assert optimizers[0].param_groups[0]["lr"] == pytest.approx(cfg.muon.lr * final)
