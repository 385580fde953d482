"""The multi-token prediction weights by step, from the stage table's mtp_weights column
(train.stages, stages/table.py; model/mtp.py uses them). Free of torch, as the config that
calls it (model/forward_schedule.py)."""

from stages import StageTable


def mtp_weights_at(stages: StageTable, step: int, scheduled_steps: int) -> tuple[float, ...]:
    """The weights at `step`: its stage's row, padded with zeros to K_max, the longest row's
    length, so that the forward's tensor keeps one shape.

    With stages.mtp_decay the last weight of a row of two or more falls linearly to 0 over its
    stage i of P, w·(1 − (P·x − i)) at x = s/S, computed as the record writes it in float64, so
    the values are the record's bits (its 0.25·(1 − 3x) in stage 0); after the scheduled steps
    x is 1, the end of the fall. record_2026_07_17 ([1, 0.5, 0.25], [1, 0.5], [1] over 1,380 steps):
    [1, 0.5, 0.25·(1 − s/460)] → [1, 0.5·(1 − (s − 460)/460), 0] → [1, 0, 0]."""
    rows, i = stages.rows, stages.index(step, scheduled_steps)
    k_max = max(len(r.mtp_weights) for r in rows)
    kept = list(rows[i].mtp_weights)
    if stages.mtp_decay and len(kept) > 1:
        x = min(step, scheduled_steps) / scheduled_steps
        kept[-1] = kept[-1] * (1 - (len(rows) * x - i))
    return tuple(float(w) for w in kept) + (0.0,) * (k_max - len(kept))
