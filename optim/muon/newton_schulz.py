"""Newton–Schulz orthogonalisation: the core of Muon.

Muon replaces a matrix update G = U S Vᵀ by (approximately) its orthogonal factor U Vᵀ, the
"zeroth power" of G. An odd matrix polynomial p(X) = a·X + b·(X Xᵀ)X + c·(X Xᵀ)²X applied a few
times to X = G/‖G‖_F pushes every singular value towards 1 without an SVD. The iteration runs
in bf16 (fp32 on CPUs where bf16 is emulated) on the wide orientation of each matrix (m ≤ n,
so X Xᵀ is the smaller m×m Gram matrix), and on a whole batch of same-shape matrices at once:
one batched-matmul chain for, say, all 768×768 matrices of a GPT instead of one per matrix.

Two named coefficient sets, and any table of one's own (ns_coefficients=custom, `ns_custom`):
- "classic": the quintic (3.4445, −4.7750, 2.0315) of Keller Jordan's Muon, the same at every
  iteration, tuned for the largest slope at zero; singular values end up spread around 1
  (roughly 0.7–1.15), which in Keller Jordan's experiments trains as well as the exact U Vᵀ.
- "polar_express": five per-iteration tuples from Polar Express (Amsel et al. 2025,
  arXiv 2505.16932; computed for 5 iterations, safety factor 2e-2, cushion 0.02), as used in
  current speedrun records; they land closer to 1 in the same number of steps. Other step
  counts get the schedule the same recipe computes for them (optim/muon/ns_schedule.py).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from optim.config import NS_FORMS, MuonConfig
from optim.muon.batches import RECORD_FORMS, batch_key
from optim.muon.ns_schedule import polar_express_schedule

Coefficients = tuple[float, float, float]

CLASSIC: Coefficients = (3.4445, -4.7750, 2.0315)

POLAR_EXPRESS: tuple[Coefficients, ...] = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


@dataclass(frozen=True)
class CoefficientSet:
    """Per-iteration (a, b, c) tuples, the last repeated for any further iteration, and the
    factor on the Frobenius norm of the input before dividing by it."""

    iterations: tuple[Coefficients, ...]
    norm_scale: float


# The named sets, `optim.muon.ns_coefficients`. Polar Express derives its coefficients for
# singular values in [0, 1] and keeps a 2 % margin for bf16 rounding (its safety factor), hence
# the 1.02; the classic quintic divides by the plain norm. (The Polar Express reference adds
# 1e-6 to the scaled norm; here that term is the caller's `eps`.)
COEFFICIENT_SETS: dict[str, CoefficientSet] = {
    "classic": CoefficientSet((CLASSIC,), 1.0),
    "polar_express": CoefficientSet(POLAR_EXPRESS, 1.02),
}

# How each iteration evaluates a·X + b·A·X + c·A²·X (A = X·Xᵀ, m×m), `optim.muon.ns_form`:
# factored = a·X + (b·A + c·A·A)·X, three matmuls, 4m²n + 2m³ FLOPs, each sum fused into its
# product (two baddbmm) |
# factored_unfused = the same products, each `@`, `*` and `+` a separate op rounded to the
# working dtype, in the 2025-01 record's order: B = b·A + (c·A)·A, X = a·X + B·X; same FLOPs |
# expanded = a·X + b·P + (c·A)·P with P = A·X (the 2024-11 record's order), 6m²n |
# gram = the iterations carried out on the m×m Gram matrix (`gram_polynomial`), restarted from
# X every GRAM_SEGMENT iterations; used where that costs fewer FLOPs (n ≥ GRAM_MIN_ASPECT·m:
# a 768×3072 needs 33 % fewer), factored on the other shapes.
# All four are equal in exact arithmetic; they round differently (scripts/bench/ns.py).
# The records' forms (RECORD_FORMS, optim/muon/batches.py), which `zeropower` and
# `orthogonalise` run on each matrix as the records' scripts hand it over: in its own shape
# and memory layout (see `zeropower`).
# Without a restart, bf16 rounding in the Gram iteration is never corrected (X is not re-read)
# and Polar Express's first, steep polynomial amplifies it: 5 steps on a random 768×768 reached
# singular values up to 2.5. Rebuilding the Gram matrix from X after 3 iterations brings the
# band back to the direct iteration's (0.85–1.15), for 4m²n + 2m³ more FLOPs.
GRAM_SEGMENT = 3
# 2 segments cost 8m²n + 28m³ against factored's 20m²n + 10m³ for 5 steps: fewer from n = 1.5m.
GRAM_MIN_ASPECT = 1.5


def ns_flops(shape: Sequence[int], steps: int, form: str = "factored") -> int:
    """FLOPs of `steps` Newton–Schulz iterations on one matrix (m ≤ n), in the arrangement
    `form` (see NS_FORMS): factored and factored_unfused steps·(4m²n + 2m³), expanded
    steps·6m²n, gram 4m²n + (8k − 6)·m³ per segment of k iterations where it applies; times
    the leading dimensions of a stack of matrices. The cost model of ownership and benches."""
    m, n = sorted(shape[-2:])
    stack = 1
    for k in shape[:-2]:
        stack *= k
    if form == "expanded":
        return stack * steps * 6 * m * m * n
    if form == "gram" and uses_gram(m, n):
        segments = [min(GRAM_SEGMENT, steps - i) for i in range(0, steps, GRAM_SEGMENT)]
        return stack * sum(4 * m * m * n + (8 * k - 6) * m**3 for k in segments)
    return stack * steps * (4 * m * m * n + 2 * m**3)


# A named set (COEFFICIENT_SETS) or a table of one's own
Chosen = str | CoefficientSet


def chosen_coefficients(hp: MuonConfig) -> Chosen:
    """Muon's choice: the named set of `ns_coefficients`, or with "custom" the set of
    `ns_custom`'s tuples and `ns_custom_norm_scale` (hashable, as the names are)."""
    if hp.ns_coefficients != "custom":
        return hp.ns_coefficients
    rows = tuple((float(a), float(b), float(c)) for a, b, c in hp.ns_custom)
    return CoefficientSet(rows, float(hp.ns_custom_norm_scale))


def coefficient_set(name: Chosen) -> CoefficientSet:
    """The named set (a set of one's own as it is); a ValueError lists the known names."""
    if isinstance(name, CoefficientSet):
        if not name.iterations:
            raise ValueError("a Newton-Schulz coefficient set needs at least one (a, b, c)")
        return name
    if name not in COEFFICIENT_SETS:
        raise ValueError(f"ns_coefficients must be one of {sorted(COEFFICIENT_SETS)}, got {name!r}")
    return COEFFICIENT_SETS[name]


def ns_coefficients(name: Chosen, steps: int) -> list[Coefficients]:
    """The (a, b, c) tuple for each of `steps` iterations of the named coefficient set.

    "classic" repeats its single tuple, as a set of one's own repeats its last. "polar_express"
    is the published table for 5 iterations; for any other count it is the schedule the same
    recipe computes for that many (`polar_express_schedule`: the first three tuples agree, the
    last ones are retuned so the final step lands centred on 1). 4 steps reach singular values
    in [0.42, 1.58], 5 in [0.86, 1.14], 6 in [0.998, 1.002] from inputs in [1e-3, 1].
    """
    if steps < 1:
        raise ValueError(f"Newton-Schulz steps must be >= 1, got {steps}")
    iterations = coefficient_set(name).iterations
    if name == "polar_express" and steps != len(iterations):
        return list(polar_express_schedule(steps))
    return [iterations[min(i, len(iterations) - 1)] for i in range(steps)]


def check_form(form: str) -> str:
    if form not in NS_FORMS:
        raise ValueError(f"ns_form must be one of {list(NS_FORMS)}, got {form!r}")
    return form


def quintic_step(X: Tensor, A: Tensor, a: float, b: float, c: float, form: str) -> Tensor:
    """One iteration a·X + (b·A + c·A²)·X of a batch X (k, m, n), given its Gram A = X·Xᵀ,
    arranged as `form` says ("gram" iterates this way on shapes it does not pay on).

    A is passed in, not computed, so that a caller holding X in pieces can supply the whole
    Gram matrix (tensor-parallel Newton–Schulz sums it across ranks first).
    """
    # The two records' forms are written out op by op, each rounded to X's dtype, in the order
    # their scripts evaluate them (Python reads `c * A @ P` as (c·A)·P), so that a record run
    # reproduces the record's Newton–Schulz bit for bit.
    if form == "expanded":  # a·X + b·(A·X) + c·A·(A·X), as the 2024-11 record evaluates it
        P = A @ X
        return a * X + b * P + (c * A) @ P
    if form == "factored_unfused":  # a·X + (b·A + c·A·A)·X, as the 2025-01 record does
        B = b * A + (c * A) @ A
        return a * X + B @ X
    # A and B are symmetric, so A.mT and B.mT are the same matrices as A and B. Passing them
    # transposed hands BLAS a column-major left operand: on a CPU without native bf16 (AVX2)
    # that made the whole iteration ~8x faster; the product differs only in summation order.
    B = torch.baddbmm(A, A.mT, A, beta=b, alpha=c)
    return torch.baddbmm(X, B.mT, X, beta=a)


def gram_polynomial(A: Tensor, coefficients: Sequence[Coefficients]) -> Tensor:
    """The m×m matrix Q with Q·X = Newton–Schulz of X, from A = X·Xᵀ alone (batch (k, m, m)).

    Every iterate is X_k = Q_k·X with Q_k a polynomial in A, so X_k·X_kᵀ = Q_k·A·Q_k and one
    iteration is P = a·I + b·A_k + c·A_k², Q_{k+1} = P·Q_k, A_{k+1} = P·A_k·P: nothing of
    size m×n after the first Gram matrix. Unlike the direct iteration this one never
    re-measures X, so rounding in Q is not corrected by later steps.
    """
    Q = None
    last = len(coefficients) - 1
    for k, (a, b, c) in enumerate(coefficients):
        P = torch.baddbmm(A, A.mT, A, beta=b, alpha=c)
        P.diagonal(dim1=-2, dim2=-1).add_(a)
        # baddbmm with beta=0 rather than `@`, as in quintic_step: on CPU `@` on small
        # matrices rounded a matrix differently by how many shared its batch (a rank's batch
        # is not one process's); baddbmm kept the bits on the shapes tests/unit/test_muon.py tries.
        Q = P if Q is None else torch.baddbmm(Q, P, Q, beta=0)
        if k < last:
            A = torch.baddbmm(A, torch.baddbmm(A, P, A, beta=0), P, beta=0)
    assert Q is not None  # coefficients is never empty (ns_coefficients checks steps >= 1)
    return Q


def uses_gram(m: int, n: int) -> bool:
    """Whether form "gram" runs the Gram iteration on an m×n matrix (m ≤ n): only where it
    needs fewer FLOPs than the direct one."""
    return n >= GRAM_MIN_ASPECT * m


def gram_segments(coefficients: Sequence[Coefficients]) -> list[Sequence[Coefficients]]:
    """The runs of iterations between Gram matrices rebuilt from X (GRAM_SEGMENT long)."""
    return [coefficients[i : i + GRAM_SEGMENT] for i in range(0, len(coefficients), GRAM_SEGMENT)]


def zeropower(
    G: Tensor,
    coefficients: Sequence[Coefficients],
    eps: float,
    norm_scale: float = 1.0,
    dtype: torch.dtype = torch.bfloat16,
    form: str = "factored",
) -> Tensor:
    """Orthogonalise each matrix of `G` (shape (..., m, n)) by Newton–Schulz, in `dtype`.

    bf16 is the standard (fast on GPUs and on CPUs with native bf16); fp32 is for CPUs without
    native bf16 kernels, where emulated bf16 matmuls are several times slower than fp32.

    Every matrix is divided by its own Frobenius norm · `norm_scale` + `eps` (so all singular
    values start at most 1), then each iteration applies one (a, b, c) from `coefficients` in
    the arrangement `form` (see NS_FORMS). The result keeps G's shape; the caller casts it.
    """
    if G.ndim < 2:
        raise ValueError(f"zeropower needs matrices (..., m, n), got shape {tuple(G.shape)}")
    check_form(form)
    tall = G.size(-2) > G.size(-1)
    X = G.to(dtype)
    if tall:
        X = X.mT  # iterate on the wide side: the Gram matrix X Xᵀ is then the smaller one
    if form in RECORD_FORMS:
        # As the records' scripts do: on X in its own shape (a single matrix stays 2-D) and
        # layout (a tall matrix as a column-major view of its transpose). Matmul kernels are
        # picked by layout and batch, and a contiguous copy would round differently (on a CPU
        # a 3072×768 differs in a fraction of its entries), so a record's bits need its layout.
        X = X / (X.norm(dim=(-2, -1), keepdim=True) * norm_scale + eps)
        for a, b, c in coefficients:
            X = quintic_step(X, X @ X.mT, a, b, c, form)
        return X.mT if tall else X
    out_shape = X.shape
    # One contiguous batch: baddbmm takes exactly one batch dimension, and a transposed view
    # would otherwise carry its column-major layout through every product below.
    X = X.reshape(-1, *out_shape[-2:]).contiguous()
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * norm_scale + eps)
    if form == "gram" and uses_gram(*X.shape[-2:]):
        for segment in gram_segments(coefficients):
            X = torch.baddbmm(X, gram_polynomial(X @ X.mT, segment), X, beta=0)
    else:
        for a, b, c in coefficients:
            X = quintic_step(X, X @ X.mT, a, b, c, form)
    X = X.reshape(out_shape)
    return X.mT if tall else X


def orthogonalise(
    stacks: Sequence[Tensor],
    coefficients: Chosen,
    steps: int,
    eps: float,
    dtype: torch.dtype,
    form: str = "factored",
) -> list[Tensor]:
    """Newton–Schulz of every matrix of every stack (..., m, n), one batched `zeropower` per
    shape: Muon's one orthogonalisation, for a parameter (a stack of one) and a bank alike.

    Each matrix is normalised and orthogonalised on its own. Tall matrices join the batch of
    their transposed shape (a 3072×768 with the 768×3072s), except in RECORD_FORMS, which batch
    them on their own and iterate on them as the records do (`zeropower`); a lone matrix of a
    record form goes in 2-D, as a record's script passes a 2-D weight (a transposed stack of one
    runs other CPU matmul kernels than the matrix itself). Returns `dtype` stacks in the inputs'
    shapes, in their order. The inputs are only read (one may be a momentum buffer).
    """
    as_given = form in RECORD_FORMS
    mats = [s.reshape(-1, *s.shape[-2:]) for s in stacks]
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, m in enumerate(mats):
        by_shape.setdefault(batch_key(m.shape, form), []).append(i)
    chosen = coefficient_set(coefficients)
    iterations = ns_coefficients(coefficients, steps)
    out: list[Tensor | None] = [None] * len(stacks)
    for members in by_shape.values():
        wide = [mats[i] if as_given or not _is_tall(mats[i]) else mats[i].mT for i in members]
        # One contiguous batch in `dtype`, each matrix in the layout it is iterated in: the
        # records' bits follow the layout their matmuls see.
        X = torch.cat([w.to(dtype) for w in wide]) if len(wide) > 1 else wide[0].to(dtype)
        X = X.contiguous()
        lone = as_given and X.shape[0] == 1
        Y = zeropower(X[0] if lone else X, iterations, eps, chosen.norm_scale, dtype, form)
        Y = Y.reshape(-1, *wide[0].shape[-2:])
        start = 0
        for i in members:
            n = mats[i].shape[0]
            y = Y[start : start + n]
            start += n
            out[i] = (y if as_given or not _is_tall(mats[i]) else y.mT).reshape(stacks[i].shape)
    return out  # type: ignore[return-value]  # every stack is in exactly one batch


def _is_tall(t: Tensor) -> bool:
    return t.size(-2) > t.size(-1)
