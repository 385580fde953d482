"""Tensor-parallel Newton–Schulz: orthogonalise a matrix that the ranks of a group hold in pieces.

Every rank of a process group holds one contiguous block of each matrix X (m×n): a block of
rows (split="row", rank r holds X_r of m_r×n) or of columns (split="col", m×n_r). Blocks may
be uneven or empty, as `torch.chunk` cuts them. `tp_zeropower` returns each rank its block of
exactly what `zeropower` of the whole matrix returns, and no rank ever holds the whole matrix.

Why it works: every Newton–Schulz iterate is p(X·Xᵀ)·X for a polynomial p, and
p(X·Xᵀ)·X = X·p(Xᵀ·X). With the Gram matrix on the *unsplit* side the polynomial acts on each
block alone: for a column split, p(A)·X = [p(A)·X_0 | p(A)·X_1 | …] with A = X·Xᵀ = Σ_r X_r·X_rᵀ,
a sum of per-rank products. So each iteration costs one all_reduce of a k×k Gram matrix (k the
unsplit side: n for a row split, m for a column split) and local matmuls on the blocks. A row
split is the column split of Xᵀ, so the code transposes the local block and runs one case.
The Frobenius norm is one more all_reduce (of per-matrix sums of squares). `form="gram"`
(`gram_polynomial`) needs one Gram all_reduce per segment of GRAM_SEGMENT iterations, as
`zeropower` rebuilds it: every rank evaluates the same k×k polynomial Q and multiplies its
block by it.

`form="gram"` runs the Gram iteration only where `zeropower` would on the same side: the Gram
matrix on the short side and `uses_gram` (elongated enough to pay); elsewhere it runs the
factored iteration, as `zeropower` does on near-square shapes. On the long side the Gram
matrix is rank-deficient, and its rounding noise includes negative eigenvalues, which the Gram
polynomial (never re-measuring X) amplifies: measured on 16×48, 17×40, 1×16 and 64×1024
matrices, 3–13× (bf16) and 4–17× (fp32) further from the exact iteration than the factored
form on the same side, even restarted every GRAM_SEGMENT steps (bf16 results off by 20 to
1e19 without restarts), and it would cost more FLOPs there, not fewer. "factored" and
"expanded" re-measure X every iteration and are as accurate with the Gram matrix on either
side.

Cost per rank, per matrix, for W ranks, r Gram reductions (steps for factored and expanded,
⌈steps/GRAM_SEGMENT⌉ for gram: 2 of 5), b bytes per Newton–Schulz value and b_r per reduced
Gram value (`ns_traffic`):
- TP sends 2·(W−1)/W·r·k²·b_r bytes (ring all_reduce), every rank alike. Its matmuls on the
  blocks are split W ways; the k×k polynomial (2k³ per factored step) runs on every rank.
- Gathering (sharded Muon's default, `optim/muon/fsdp_strategies.py`): each block goes to the
  matrix's owner and its rows come back, (W−1)/W·m·n·b bytes each way, 2·(W−1)/W²·m·n·b per
  rank when owners are balanced; the owner alone runs the whole Newton–Schulz and holds the
  whole matrix.

So TP is the right tool when the split runs along the *long* side and the Gram matrix sits on
the short one (a 3072×768 split by rows: 768×768 Gram): nothing whole is ever materialised,
every rank does 1/W of each large product, and there is no owner to wait for, which matters
when there are fewer large matrices than ranks. It sends fewer bytes than gathering only
when the split side s outgrows the unsplit side k by s/k > W·r·b_r/b (W=2, an fp32 reduction
of bf16, 5 steps: s/k > 8 for gram, > 20 for factored). It is the wrong tool for a wide matrix
split along its short side (a 768×3072 split by rows needs the 3072×3072 Gram): (n/m)² times
the bytes of the short-side case and a replicated n³ polynomial, where gathering needs m×m.

Gram matrices are reduced in fp32 (`reduce_dtype`): each rank's partial X_r·X_rᵀ is computed in
`dtype`, cast up, summed, and cast back, so that a sum over many ranks is not rounded to bf16
at every hop. Measured (gloo, bf16 Newton–Schulz, polar_express, 64×1024 and 128×2048 split by
columns, 3 seeds): for W=2 the two give the same bits (one rounding of the exact sum of two
bf16 values either way); for W=4 a bf16 reduction makes the first Gram matrix 1.3–1.5× and the
result 1.2–1.7× as far from the exact iteration as an fp32 one, for W=8 1.7–2× and 1.3–1.6×
(max |Δ| 0.0037–0.0056 against 0.0025–0.0043, where one process's `zeropower` is at
0.0026–0.0044). With the fp32 reduction TP is as accurate as one process; it sends twice the
bytes of a bf16 reduction.
"""

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from optim.config import NS_FORMS
from optim.muon.newton_schulz import (
    GRAM_SEGMENT,
    Chosen,
    Coefficients,
    check_form,
    coefficient_set,
    gram_polynomial,
    gram_segments,
    ns_coefficients,
    orthogonalise,
    quintic_step,
    uses_gram,
)

# How the ranks split each matrix: "row" = a block of rows each (FSDP2's dim-0 shards),
# "col" = a block of columns each.
SPLITS = ("row", "col")
# The forms TP runs. Not "factored_unfused": it exists to reproduce one process's rounding in
# the 2025-01 record, which a Gram matrix summed across ranks cannot, and on the long side
# its extra bf16 roundings are amplified (measured 0.10 from exact on a 1×16 split by rows,
# Polar Express, where one process's `zeropower` is at 0.014).
TP_FORMS = tuple(f for f in NS_FORMS if f != "factored_unfused")


def tp_zeropower(
    X_local: Tensor,
    split: str,
    group: dist.ProcessGroup,
    coefficients: Sequence[Coefficients],
    eps: float,
    norm_scale: float = 1.0,
    dtype: torch.dtype = torch.bfloat16,
    form: str = "factored",
    reduce_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """This rank's block of `zeropower(X, coefficients, eps, norm_scale, dtype, form)`, in
    `dtype`, where X (..., m, n) is the matrices whose blocks the ranks of `group` hold.

    `X_local` is this rank's block (..., m_r, n) for split="row", (..., m, n_r) for "col";
    every rank must call with the same leading dimensions, coefficients and settings (the
    collectives pair up by order). All leading dimensions are one batch: one all_reduce per
    iteration serves every matrix. `reduce_dtype` is the precision the partial Gram matrices
    are summed in (never below `dtype`; norms always in fp32 at least). `X_local` is only read.

    The result equals `zeropower`'s in exact arithmetic, not bitwise: the Gram sum across
    ranks adds in a different order than one matmul, and where `zeropower` would iterate on
    the other side of the matrix (its short side, here the unsplit one) the products differ.
    (On a one-rank group, in zeropower's orientation and bf16, it is bitwise.) form="gram"
    runs the Gram iteration where `zeropower` would on the unsplit side, the factored one
    elsewhere: on near-square shapes, as `zeropower` does, and with the unsplit side the long
    one (see the module docstring).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    check_tp_form(form)
    if X_local.ndim < 2:
        raise ValueError(
            f"tp_zeropower needs matrices (..., m, n), got shape {tuple(X_local.shape)}"
        )
    if group is None:
        # The caller names the group: a silent fallback to the world group would pair these
        # collectives with whatever else the world is doing.
        raise ValueError("tp_zeropower needs an explicit process group, got None")
    if not coefficients:
        raise ValueError("tp_zeropower needs at least one (a, b, c) iteration in coefficients")
    reduce_dtype = torch.promote_types(dtype, reduce_dtype)  # never below `dtype`
    # Column split is the one case: rank r's rows of X are its columns of Xᵀ.
    Y = X_local.to(dtype)
    if split == "row":
        Y = Y.mT
    out_shape = Y.shape
    batch = math.prod(out_shape[:-2])
    if batch == 0:  # the same on every rank: no collective to pair up
        return X_local.to(dtype)
    # One contiguous 3-D batch (baddbmm takes one batch dimension). The explicit batch size,
    # not -1, keeps an empty block (0 columns) reshapeable.
    Y = Y.reshape(batch, *out_shape[-2:]).contiguous()
    norm, split_size = _norms(Y, group)
    Y = Y / (norm.to(dtype) * norm_scale + eps)  # the same arithmetic, in `dtype`, as zeropower
    # The same decision on every rank: the sizes come from the all_reduce. (`.item()` waits
    # for the device, so only the gram form asks.)
    k = Y.size(-2)
    if form == "gram" and k <= (s := int(split_size.item())) and uses_gram(k, s):
        for segment in gram_segments(coefficients):
            Y = torch.baddbmm(
                Y, gram_polynomial(_summed_gram(Y, group, reduce_dtype), segment), Y, beta=0
            )
    else:
        for a, b, c in coefficients:
            Y = quintic_step(Y, _summed_gram(Y, group, reduce_dtype), a, b, c, form)
    Y = Y.reshape(out_shape)
    return Y.mT if split == "row" else Y


def check_tp_form(form: str) -> str:
    """`form` if TP runs it (TP_FORMS); a ValueError naming the alternative otherwise."""
    check_form(form)
    if form not in TP_FORMS:
        raise ValueError(
            f"ns_form={form!r} is not run tensor-parallel (dist.parallelism=fsdp_tp): it "
            "reproduces one process's rounding, which a Gram matrix summed across ranks "
            "cannot; use ns_form=factored, or dist.parallelism=fsdp_gather"
        )
    return form


def _norms(Y: Tensor, group: dist.ProcessGroup) -> tuple[Tensor, Tensor]:
    """‖X‖_F of each whole matrix (batch, 1, 1), and the global size of the split side (a
    0-d tensor, for form="gram"'s check): both from one all_reduce of the blocks' sums of
    squares, in fp32 at least, with the local size appended (exact in fp32 below 2²⁴): the
    global size is known only after a collective, and this one is already needed."""
    sumsq = Y.to(torch.promote_types(Y.dtype, torch.float32)).square().sum(dim=(-2, -1))
    stats = torch.cat([sumsq, sumsq.new_tensor([Y.size(-1)])])
    dist.all_reduce(stats, group=group)
    return stats[:-1].sqrt().view(-1, 1, 1), stats[-1]


def _summed_gram(Y: Tensor, group: dist.ProcessGroup, reduce_dtype: torch.dtype) -> Tensor:
    """Y·Yᵀ of the whole matrices (batch, k, k) from every rank's block, summed in
    `reduce_dtype` and returned in Y's dtype."""
    A = (Y @ Y.mT).to(reduce_dtype)
    dist.all_reduce(A, group=group)
    return A.to(Y.dtype)


def orthogonalise_row_shards(
    shards: dict[int, Tensor],
    shapes: Sequence[Sequence[int]],
    group: dist.ProcessGroup,
    coefficients: Chosen,
    steps: int,
    eps: float,
    dtype: torch.dtype,
    form: str = "factored",
) -> dict[int, Tensor]:
    """`orthogonalise` for matrices held as dim-0 shards (FSDP2's layout): this rank's rows of
    each result, in `dtype`, under the same keys. `shapes[i]` is matrix i's global shape.

    2-D matrices go through `tp_zeropower(split="row")`, one batched call per exact global
    shape (every rank holds the same number of rows of each, so they stack), hence one
    all_reduce per iteration for all matrices of a shape. A stack (…, m, n) sharded on dim 0
    holds whole matrices: those are orthogonalised locally, with no communication. Every rank
    must pass the same keys and shapes; the shards are only read.
    """
    check_tp_form(form)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    stacked: dict[int, Tensor] = {}
    for i, shard in shards.items():
        if len(shapes[i]) == 2:
            by_shape.setdefault(tuple(shapes[i]), []).append(i)
        else:
            stacked[i] = shard
    whole = orthogonalise(list(stacked.values()), coefficients, steps, eps, dtype, form)
    out = dict(zip(stacked, whole, strict=True))
    iterations = ns_coefficients(coefficients, steps)
    norm_scale = coefficient_set(coefficients).norm_scale
    for indices in by_shape.values():  # in first-appearance order, the same on every rank
        first = shards[indices[0]]
        # One stack per shape, cast to `dtype` as it is copied.
        X = torch.empty((len(indices), *first.shape), dtype=dtype, device=first.device)
        for k, i in enumerate(indices):
            X[k].copy_(shards[i])
        Y = tp_zeropower(X, "row", group, iterations, eps, norm_scale, dtype, form)
        out.update(zip(indices, Y.unbind(), strict=True))
    return out


class NSTraffic(NamedTuple):
    """Bytes each rank sends to orthogonalise matrices held in blocks, per optimizer step."""

    tp: float  # tensor-parallel: Gram and norm all_reduces (every rank the same)
    gather: float  # blocks to their owner and results back, averaged over balanced owners


def ns_traffic(
    shape: Sequence[int],
    split: str,
    world: int,
    steps: int,
    form: str = "factored",
    dtype_bytes: int = 2,
    reduce_bytes: int = 4,
) -> NSTraffic:
    """Bytes each rank sends for a matrix (or stack, (..., m, n)) split over `world` ranks.

    TP: a ring all_reduce of N values sends 2·(W−1)/W·N of them per rank; each Gram reduction
    is k² values of `reduce_bytes` (k = n for a row split, m for a column split), `steps` of
    them (factored, expanded) or one per GRAM_SEGMENT iterations (gram, where `tp_zeropower`
    runs it), plus one fp32 value for the norm and one for the size. Gathering: the
    (W−1)/W of the matrix other ranks hold goes to the owner, and as much comes back, in
    `dtype_bytes`: 2·(W−1)/W·m·n bytes in all, 2·(W−1)/W²·m·n per rank when every rank owns
    its share of the matrices (the owner of one matrix sends (W−1)/W·m·n of them itself).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    check_form(form)
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if len(shape) < 2:
        raise ValueError(f"ns_traffic needs a matrix shape (..., m, n), got {tuple(shape)}")
    m, n = shape[-2:]
    stack = math.prod(shape[:-2])
    k, s = (n, m) if split == "row" else (m, n)
    gram = form == "gram" and k <= s and uses_gram(k, s)
    reductions = -(-steps // GRAM_SEGMENT) if gram else steps
    ring = 2 * (world - 1) / world
    tp = ring * (stack * reductions * k * k * reduce_bytes + (stack + 1) * 4)
    gather = stack * 2 * (world - 1) / world**2 * m * n * dtype_bytes
    return NSTraffic(tp, gather)
