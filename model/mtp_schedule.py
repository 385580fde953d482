"""The multi-token prediction weights by step (model.head.mtp_weights; model/mtp.py uses
them). Free of torch, as the config that calls it (`ModelConfig.step_args`)."""

from collections.abc import Sequence

from model.window_schedule import phase_index


def mtp_weights_at(weights: Sequence[float], step: int, scheduled_steps: int) -> tuple[float, ...]:
    """The weights at `step`, padded with zeros to K_max = P = len(weights).

    The scheduled steps split into P equal phases (`phase_index`, as the window and batch
    phases). Phase p < P − 1 uses w_0 … w_{P−1−p}, and its last weight falls linearly to 0
    over the phase. The last phase, and the extension steps after it, use w_0 alone. Record D
    ([1, 0.5, 0.25], 1,380 scheduled steps): [1, 0.5, 0.25·(1 − s/460)] → [1, 0.5·(1 − (s −
    460)/460)] → [1]. The decay is computed as the record writes it, w·(1 − (P·x − p)) with
    x = s/S in float64, so the values are the record's bits (its 0.25·(1 − 3x) at p = 0)."""
    n = len(weights)
    p = phase_index(step, scheduled_steps, weights)
    kept = list(weights[: n - p])
    if len(kept) > 1:
        x = step / scheduled_steps
        kept[-1] = kept[-1] * (1 - (n * x - p))
    return tuple(float(w) for w in kept) + (0.0,) * p
