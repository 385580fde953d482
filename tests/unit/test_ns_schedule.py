"""Polar Express coefficient schedules (optim/muon/ns_schedule.py): the published tuples, the
minimax property of each quintic, and the singular-value bands a schedule guarantees."""

import itertools
import math
import time

import numpy as np
import pytest
from scipy.optimize import linprog

from optim.muon.ns_schedule import optimal_quintic, polar_express_schedule, schedule_band

# The five tuples of the speedrun records (num_iters=5, safety 2e-2, lower 1e-3), copied here so
# the test stays an independent check of optim/muon/newton_schulz.py's constants.
PUBLISHED = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)

# Bands from [1e-3, 1] measured with the default parameters (exact interval images).
BANDS = {
    3: (0.13078789219527745, 1.8692121078047226),
    4: (0.42446957702930893, 1.5755304229706901),
    5: (0.8588726435266889, 1.1411273564733107),
    6: (0.997714367015707, 1.002285632984293),
}


def quintic(coeffs, x):
    a, b, c = coeffs
    return a * x + b * x**3 + c * x**5


def newton_schulz(x, coeffs):
    for a, b, c in coeffs:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def test_reproduces_published_tuples():
    schedule = polar_express_schedule(5)
    assert len(schedule) == 5
    for got, want in zip(schedule, PUBLISHED, strict=True):
        for g, w in zip(got, want, strict=True):
            assert g == pytest.approx(w, rel=1e-13, abs=0)  # measured: ≤ 3e-15


@pytest.mark.parametrize(("lower", "upper"), [(0.02, 1.0), (0.04, 1.99), (0.3, 1.7), (1e-6, 1.0)])
def test_optimal_quintic_is_minimax(lower, upper):
    coeffs = optimal_quintic(lower, upper)
    xs = np.linspace(lower, upper, 2001)
    err = np.abs(1 - quintic(coeffs, xs)).max()
    # Equioscillation: error +E at lower, −E at upper, and no larger in between.
    assert 1 - quintic(coeffs, lower) == pytest.approx(err, rel=1e-9)
    assert quintic(coeffs, upper) - 1 == pytest.approx(err, rel=1e-9)
    # The LP over the same grid is a lower bound on the true minimax error (it only sees the
    # grid), so it may undercut the Remez answer slightly but never meaningfully.
    powers = np.stack([xs, xs**3, xs**5], axis=1)
    ones = np.ones((len(xs), 1))
    res = linprog(
        [0, 0, 0, 1],
        A_ub=np.block([[powers, -ones], [-powers, -ones]]),
        b_ub=np.concatenate([np.ones(len(xs)), -np.ones(len(xs))]),
        bounds=[(None, None)] * 4,
        method="highs",
    )
    assert res.success
    assert res.x[3] <= err * (1 + 1e-9)
    assert err <= res.x[3] * (1 + 1e-4)


def test_optimal_quintic_scale_invariance_and_narrow_limit():
    a, b, c = optimal_quintic(0.1, 1.0)
    for u in (0.5, 2.0):
        got = optimal_quintic(0.1 * u, u)
        assert got == pytest.approx((a / u, b / u**3, c / u**5), rel=1e-10)
    # Just below and at the switch to the closed-form limit, the answers agree.
    assert optimal_quintic(1 - 1e-5, 1.0) == pytest.approx((15 / 8, -10 / 8, 3 / 8), rel=1e-4)
    assert optimal_quintic(1.0, 1.0) == (15 / 8, -10 / 8, 3 / 8)


@pytest.mark.parametrize("steps", [3, 4, 5, 6])
def test_band_from_lower(steps):
    lo, hi = schedule_band(polar_express_schedule(steps), 1e-3)
    assert (lo, hi) == pytest.approx(BANDS[steps], rel=1e-9)
    assert 1e-3 < lo < 1 < hi
    # The last step carries no safety factor, so it is centred on 1.
    assert lo + hi == pytest.approx(2, abs=1e-12)


def test_more_steps_give_tighter_bands():
    bands = [schedule_band(polar_express_schedule(n), 1e-3) for n in range(1, 8)]
    widths = [hi - lo for lo, hi in bands]
    assert all(w2 < w1 for w1, w2 in itertools.pairwise(widths))


def test_band_of_published_tuples_matches_its_own():
    assert schedule_band(PUBLISHED, 1e-3) == pytest.approx(BANDS[5], rel=1e-9)


@pytest.mark.parametrize("steps", [3, 4, 5, 6])
@pytest.mark.parametrize("shape", [(64, 128), (96, 40)])
def test_fp64_newton_schulz_stays_in_band(steps, shape):
    coeffs = polar_express_schedule(steps)
    lo, hi = schedule_band(coeffs, 1e-3)
    rng = np.random.default_rng(steps * 1000 + shape[0])
    g = rng.standard_normal(shape)
    x = g / (np.linalg.norm(g) * 1.02)
    assert np.linalg.svd(x, compute_uv=False).min() >= 1e-3  # inside the designed range
    sv = np.linalg.svd(newton_schulz(x, coeffs), compute_uv=False)
    assert lo - 1e-10 <= sv.min() and sv.max() <= hi + 1e-10


@pytest.mark.parametrize("steps", [3, 4, 5])
def test_band_is_attained(steps):
    """Singular values spread over all of [1e-3, 1] reach both ends of the band."""
    coeffs = polar_express_schedule(steps)
    lo, hi = schedule_band(coeffs, 1e-3)
    rng = np.random.default_rng(steps)
    u, _ = np.linalg.qr(rng.standard_normal((48, 48)))
    v, _ = np.linalg.qr(rng.standard_normal((80, 48)))
    # 40 matrices of 48 singular values each, together a fine grid over [1e-3, 1].
    spectra = np.geomspace(1e-3, 1, 40 * 48).reshape(40, 48)
    out = np.concatenate(
        [np.linalg.svd(newton_schulz(u * s @ v.T, coeffs), compute_uv=False) for s in spectra]
    )
    assert lo - 1e-10 <= out.min() and out.max() <= hi + 1e-10
    assert out.min() == pytest.approx(lo, abs=1e-9)  # attained at σ = lower itself
    assert out.max() == pytest.approx(hi, abs=1e-3 * (hi - lo))  # attained on the grid


def test_fast():
    start = time.perf_counter()
    for steps in range(1, 9):
        polar_express_schedule(steps)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps": 0},
        {"steps": 2.0},
        {"steps": True},
        {"steps": 3, "lower": 0.0},
        {"steps": 3, "lower": 1.0},
        {"steps": 3, "safety": -0.1},
        {"steps": 3, "cushion": 1.0},
        {"steps": 3, "lower": math.nan},
    ],
)
def test_schedule_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        polar_express_schedule(**kwargs)


def test_helpers_reject_bad_arguments():
    with pytest.raises(ValueError):
        optimal_quintic(0.0, 1.0)
    with pytest.raises(ValueError):
        optimal_quintic(0.5, 0.4)
    with pytest.raises(ValueError):
        schedule_band(PUBLISHED, 0.5, 0.4)
    with pytest.raises(ValueError):
        schedule_band(((1.0, 2.0),), 0.1)
