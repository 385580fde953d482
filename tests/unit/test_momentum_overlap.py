"""NorMuon's momentum where its warm-up and cooldown overlap (only in scaled-down runs): the warm-up
wins, as in record_2025_11_29 and record_2026_07_17 (docs/records.md C.4, D.4; the records'
`get_muon_momentum` is an if / elif), not the former reading with the cooldown applied on top of the
warm-up."""

import pytest

from optim.config import MuonConfig, OptimConfig
from optim.schedule import momentum_cooldown, muon_momentum, optim_values


def records_momentum(s: int, total: int, warmup: int, cooldown: int) -> float:
    """The records' get_muon_momentum (if warmup / elif cooldown), 0.85 → 0.95 → 0.85."""
    if s < warmup:
        return 0.85 + s / warmup * 0.1
    if s > total - cooldown:
        return 0.95 - (s - (total - cooldown)) / cooldown * 0.1
    return 0.95


def cooldown_on_top(s: int, total: int, warmup: int, cooldown: int) -> float:
    """The former reading: the cooldown applied to the warmup's value (the misreading)."""
    mu = 0.85 + 0.1 * min(s / warmup, 1.0)
    start = total - cooldown
    return mu if s <= start else mu - (mu - 0.85) * (s - start) / cooldown


def momenta(total: int, warmup: int, cooldown: int) -> list[float]:
    m = MuonConfig(momentum_warmup_steps=warmup, momentum_cooldown_steps=cooldown)
    m.validate(total)  # an overlap is allowed
    cfg = OptimConfig(muon=m)
    return [optim_values(cfg, s, total).muon_momentum for s in range(total)]


def test_momentum_warmup_wins_where_they_overlap() -> None:
    got = momenta(8, 6, 4)  # warmup 0-5, cooldown from 5: they overlap at 5
    want = [records_momentum(s, 8, 6, 4) for s in range(8)]
    assert got == pytest.approx(want, abs=1e-15)
    assert got != pytest.approx([cooldown_on_top(s, 8, 6, 4) for s in range(8)], abs=1e-6)


def test_record_2025_11_29_toy_momentum_is_unchanged() -> None:
    """record_2025_11_29's toy (8 steps, warmup 3, cooldown 2) has no overlap: bit for bit the
    values of the code before the fix (the cooldown applied to every step), so its curve is
    unchanged."""
    got = momenta(8, 3, 2)
    before = [momentum_cooldown(s, 8, 2, muon_momentum(s, 3, 0.85, 0.95), 0.85) for s in range(8)]
    assert got == before
    assert [f"{m:.4f}" for m in got] == ["0.8500", "0.8833", "0.9167"] + ["0.9500"] * 4 + ["0.9000"]
