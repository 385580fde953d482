"""Per-iteration Newton–Schulz quintics by the Polar Express recipe (Amsel, Persson, Musco, Gower
2025, arXiv 2505.16932).

Newton–Schulz applies odd quintics p(x) = a·x + b·x³ + c·x⁵ to the singular values of a matrix
scaled so they lie in [lower, 1]. One fixed quintic has to be good everywhere at once; Polar
Express instead picks, greedily per iteration, the quintic that best approximates 1 (in the
minimax sense) on the interval the singular values can currently be in, then tracks where that
interval goes. Deriving the tuples here, instead of pasting them, lets the trainer ask for any
number of iterations or margins and states which singular-value band each schedule guarantees.

With the defaults, `polar_express_schedule(5)` reproduces the five tuples used in speedrun
records (`optim.muon.newton_schulz.POLAR_EXPRESS`) to about 3e-15 relative.
"""

import math

import numpy as np

Coefficients = tuple[float, float, float]

# The smallest singular value (after normalisation) the schedule is designed to lift.
DEFAULT_LOWER = 1e-3
# Margin for bf16 rounding: every iteration but the last is tuned for singular values up to
# 1 + safety, so rounding that lands slightly above the tracked interval is still pulled back.
DEFAULT_SAFETY = 2e-2
# Never optimise for an interval thinner than [cushion·u, u]: on [1e-3, 1] the exact minimax
# quintic sacrifices almost everything to lift the tiny end; a floor keeps early steps useful.
DEFAULT_CUSHION = 2e-2

# Above this lower/upper ratio the 4×4 Remez system is numerically singular; the minimax quintic
# is then, to rounding, the one with p(u) = 1 and p'(u) = p''(u) = 0: (15, −10, 3)/8 scaled to u.
_NARROW = 1 - 5e-6


def _value(coeffs: Coefficients, x: float) -> float:
    a, b, c = coeffs
    return a * x + b * x**3 + c * x**5


def _critical_points(coeffs: Coefficients) -> list[float]:
    """Positive x where p'(x) = a + 3b·x² + 5c·x⁴ vanishes (a quadratic in y = x²)."""
    a, b, c = coeffs
    ys = np.roots([5 * c, 3 * b, a])  # np.roots drops vanishing leading terms
    return [math.sqrt(y.real) for y in ys if abs(y.imag) <= 1e-12 * abs(y) and y.real > 0]


def optimal_quintic(lower: float, upper: float) -> Coefficients:
    """The odd quintic minimising max |1 − p(x)| over [lower, upper], by Remez exchange.

    By the equioscillation theorem the optimum touches 1 − E, 1 + E, 1 − E, 1 + E at lower,
    its local maximum q, its local minimum r, and upper. Alternating between solving the
    4×4 linear system for (a, b, c, E) at fixed (q, r) and moving q, r to the new critical
    points converges in a handful of steps; the problem is solved on [lower/upper, 1] (it is
    scale-invariant) and mapped back, which keeps the system well scaled.
    """
    if not (math.isfinite(lower) and math.isfinite(upper) and 0 < lower <= upper):
        raise ValueError(f"need 0 < lower <= upper, finite; got lower={lower}, upper={upper}")
    rho = lower / upper
    if rho >= _NARROW:
        a, b, c = 15 / 8, -10 / 8, 3 / 8
    else:
        q, r = (3 * rho + 1) / 4, (rho + 3) / 4
        prev_err = math.inf
        for _ in range(100):
            xs = np.array([rho, q, r, 1.0])
            system = np.stack([xs, xs**3, xs**5, np.array([1.0, -1.0, 1.0, -1.0])], axis=1)
            a, b, c, err = (float(v) for v in np.linalg.solve(system, np.ones(4)))
            crit = _critical_points((a, b, c))
            if len(crit) != 2 or not rho < min(crit) <= max(crit) < 1:
                raise RuntimeError(f"Remez exchange lost its alternation on [{lower}, {upper}]")
            q, r = sorted(crit)
            if abs(prev_err - err) <= 1e-15:
                break
            prev_err = err
        else:
            raise RuntimeError(f"Remez exchange did not converge on [{lower}, {upper}]")
    return a / upper, b / upper**3, c / upper**5


def polar_express_schedule(
    steps: int,
    lower: float = DEFAULT_LOWER,
    safety: float = DEFAULT_SAFETY,
    cushion: float = DEFAULT_CUSHION,
) -> tuple[Coefficients, ...]:
    """`steps` (a, b, c) tuples for singular values in [lower, 1], one per NS iteration.

    Each iteration: take the minimax quintic on [max(l, cushion·u), u]; rescale it so it is
    centred on 1 over the true interval, 1 − p(l) = p(u) − 1 (with the cushion active p(l) sits
    below the optimised error band, and centring balances the two sides); unless it is the last
    iteration, divide x by 1 + safety, i.e. a, b, c by (1 + safety)^(1, 3, 5); then l ← p(l)
    with the final coefficients and u ← 2 − l (the centred error band, a safe upper bound).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not 0 < lower < 1:
        raise ValueError(f"lower must be in (0, 1), got {lower}")
    if not 0 <= safety < 1:
        raise ValueError(f"safety must be in [0, 1), got {safety}")
    if not 0 <= cushion < 1:
        raise ValueError(f"cushion must be in [0, 1), got {cushion}")
    low, up = float(lower), 1.0
    schedule: list[Coefficients] = []
    for step in range(steps):
        a, b, c = optimal_quintic(max(low, cushion * up), up)
        scale = 2 / (_value((a, b, c), low) + _value((a, b, c), up))
        a, b, c = a * scale, b * scale, c * scale
        if step < steps - 1:
            s = 1 + safety
            a, b, c = a / s, b / s**3, c / s**5
        schedule.append((a, b, c))
        low = _value((a, b, c), low)
        up = 2 - low
    return tuple(schedule)


def schedule_band(
    coeffs: tuple[Coefficients, ...], lower: float, upper: float = 1.0
) -> tuple[float, float]:
    """The exact interval the singular values land in, starting anywhere in [lower, upper].

    The image of an interval under a polynomial is [min, max] over its endpoints and the
    critical points inside it, so composing the steps is exact (no grid). Unlike the u = 2 − l
    bound the schedule tracks, this also credits the safety factor for lowering the top.
    """
    if not 0 <= lower <= upper or not math.isfinite(upper):
        raise ValueError(f"need 0 <= lower <= upper, finite; got lower={lower}, upper={upper}")
    lo, hi = float(lower), float(upper)
    for step in coeffs:
        if len(step) != 3:
            raise ValueError(f"each step must be an (a, b, c) tuple, got {step!r}")
        xs = [lo, hi, *(x for x in _critical_points(step) if lo < x < hi)]
        values = [_value(step, x) for x in xs]
        lo, hi = min(values), max(values)
    return lo, hi
