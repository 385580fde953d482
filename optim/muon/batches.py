"""Which of Muon's matrices share a batched Newton–Schulz (optim/muon/newton_schulz.py
`orthogonalise`): `batch_key` names a matrix's batch, and `ns_runs` cuts a param group into
runs that share none, so that a run orthogonalised on its own gets the bits of one call over
every matrix, and an exchange can start as each run finishes (optim/muon/strategies.py).
"""

from collections.abc import Sequence

import torch
from torch import Tensor

from optim.muon.normuon import head_rows, pieces

# The records' Newton–Schulz forms: each matrix iterated in the shape its script hands over,
# so a tall one is batched on its own, not with its transpose
RECORD_FORMS = ("factored_unfused", "expanded")


def batch_key(shape: Sequence[int], form: str) -> tuple[int, ...]:
    """The batch a matrix of `shape` (..., m, n) joins under `form`: its (m, n), or with a
    tall one's transpose outside RECORD_FORMS. Matrices of different keys never share a
    batched Newton–Schulz, so orthogonalising them in separate calls gives the same bits as
    one call."""
    return tuple(shape[-2:]) if form in RECORD_FORMS else tuple(sorted(shape[-2:]))


def ns_runs(params: dict[int, Tensor], form: str) -> list[list[int]]:
    """A param group's matrices (index: parameter) cut into runs that share no batch (the
    pieces of a split stack keep their batches together), each run in index order."""
    run_of: dict[tuple[int, ...], int] = {}  # batch key -> the run that holds it
    runs: list[list[int]] = []
    for i, p in params.items():
        parts = pieces(torch.empty(p.shape, device="meta"), head_rows(p))
        keys = {batch_key(part.shape, form) for part in parts}
        joined = sorted({run_of[k] for k in keys if k in run_of})
        if not joined:
            runs.append([])
            joined = [len(runs) - 1]
        target = joined[0]
        for other in joined[1:]:  # this matrix joins two runs: they become one
            runs[target] += runs[other]
            runs[other] = []
            run_of.update({k: target for k, r in run_of.items() if r == other})
        runs[target].append(i)
        run_of.update({k: target for k in keys})
    return [sorted(run) for run in runs if run]
