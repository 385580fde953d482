"""Tensor-parallel Newton–Schulz on 2 gloo ranks vs single-process `zeropower`, and
sharded Muon (dist.parallelism=fsdp_tp) vs single-process `Muon`.

One spawn runs every 2-rank check (interpreter start-up and the torch import cost seconds per
spawn). Each rank takes its block of a seeded matrix (`torch.chunk`, so blocks are uneven for
17 rows and empty on rank 1 for a 1×16 row split or a 16×1 column split), runs `tp_zeropower`
and compares with its block of `zeropower` of the whole matrix, and of the exact iteration
(`zeropower` in fp64).

None of the 2-rank results is bitwise, and none should be: the Gram matrix is the sum of two
partial products (another summation order than one matmul) and the norm a sum of two partial
sums of squares; where the Gram matrix sits on the long side (a wide matrix split by rows, a
tall one by columns) `zeropower` iterates on the other side, equal only in exact arithmetic.
fp32: |TP − zeropower| ≤ FP32_TOL. bf16: one process is itself 0.003–0.14 from the exact
result, and TP rounds differently, so the check is that TP is no less accurate: its error is
at most twice that of `zeropower` running the same iteration, plus BF16_FLOOR (measured: at
most twice plus 0.002). (With form="gram" and the Gram matrix on the long side, TP
runs the factored iteration: the Gram iteration is 3–13× less accurate there.) What is
bitwise: a group of one rank on a matrix in `zeropower`'s own orientation, in bf16 (in fp32
the norm's sum of squares adds in another order than `Tensor.norm`), and reducing the Gram in
bf16 vs fp32 on 2 ranks (both round the exact sum of two bf16 values once). A norm that is
not summed across ranks (each rank divides by its own block's norm) must miss by far more
than the tolerances: the check can fail.

Sharded Muon under fsdp_tp over 3 steps on test_sharded_muon's shapes and settings
(plus the gram form): stacked weights (their dim-0 shards are whole matrices,
orthogonalised locally) stay bitwise; 2-D ones agree within MUON_TOL.
"""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import optim.muon.tp_newton_schulz as tpns
from optim.config import MuonConfig
from optim.muon.newton_schulz import COEFFICIENT_SETS, ns_coefficients, zeropower
from optim.muon.optimizer import Muon
from optim.muon.tp_newton_schulz import TP_FORMS, ns_traffic, tp_zeropower
from tests.dist_utils import run_ranks
from tests.e2e.test_sharded_muon import SETTINGS, SHAPES, _reference, _sharded

WORLD = 2
STEPS = 5
EPS = 1e-7
# (split, shape): even, uneven (17 rows / 40 columns over 2), empty on rank 1, a stack, and a
# tall matrix row-split (Gram on zeropower's own side) next to wide ones (Gram on the long side)
CASES = [
    ("row", (16, 48)),
    ("col", (16, 48)),
    ("row", (17, 40)),
    ("col", (17, 40)),
    ("row", (48, 16)),
    ("row", (1, 16)),
    ("col", (16, 1)),
    ("row", (3, 16, 24)),
    ("col", (3, 16, 24)),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# fp32: max |TP − zeropower| per form; measured ≤ 9.3e-6 (factored, expanded), 1.4e-5 (gram:
# zeropower's gram iteration is itself that far from exact where TP runs the factored one)
FP32_TOL = {"factored": 2e-5, "expanded": 2e-5, "gram": 5e-5}
BF16_FLOOR = 0.02  # bf16: |TP − exact| ≤ 2·|zeropower − exact| + this
# Parameters after 3 Muon steps of lr 0.05; measured ≤ 6e-7 (fp32), 7.4e-3 (bf16), 0.017
# (bf16, gram form: one process's own error is larger there)
MUON_TOL = {"torch.float32": 5e-6, "torch.bfloat16": 0.04}
GRAM_SETTINGS = {"ns_coefficients": "polar_express", "ns_form": "gram", "momentum_form": "ema"}


def _matrix(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _block(full: torch.Tensor, split: str, rank: int) -> torch.Tensor:
    dim = -2 if split == "row" else -1
    blocks = list(full.chunk(WORLD, dim=dim))
    if rank >= len(blocks):  # torch.chunk gives fewer pieces than ranks: this one is empty
        shape = list(full.shape)
        shape[dim] = 0
        return full.new_empty(shape)
    return blocks[rank]


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def _gram_on_long_side(split: str, shape: tuple[int, ...]) -> bool:
    rows, cols = shape[-2:]
    return cols > rows if split == "row" else rows > cols


def _tp_cases(rank: int) -> list[tuple]:
    """For every split, shape, coefficient set, form and dtype: (case, |TP − zeropower|,
    |TP − exact|, |zeropower − exact|) on this rank's block, the last for `zeropower` running
    the iteration TP runs (factored for form="gram" with the Gram matrix on the long side)."""
    group = dist.group.WORLD
    out: list[tuple] = []
    for (split, shape), seed in zip(CASES, range(len(CASES)), strict=True):
        full = _matrix(shape, seed)
        mine = _block(full, split, rank)
        for coeffs in COEFFICIENT_SETS:
            iterations = ns_coefficients(coeffs, STEPS)
            scale = COEFFICIENT_SETS[coeffs].norm_scale
            exact = _block(zeropower(full, iterations, EPS, scale, torch.float64), split, rank)
            for form in TP_FORMS:
                for name, dtype in DTYPES.items():
                    case = (split, shape, coeffs, form, name)
                    want = _block(zeropower(full, iterations, EPS, scale, dtype, form), split, rank)
                    got = tp_zeropower(mine, split, group, iterations, EPS, scale, dtype, form)
                    assert got.dtype == dtype and got.shape == mine.shape
                    if form == "gram" and _gram_on_long_side(split, shape):
                        twin = zeropower(full, iterations, EPS, scale, dtype, "factored")
                        want_ran = _block(twin, split, rank)
                    else:
                        want_ran = want
                    diffs = _max_diff(got, want), _max_diff(got, exact), _max_diff(want_ran, exact)
                    out.append((case, *diffs))
    return out


def _local_norms(Y: torch.Tensor, group: dist.ProcessGroup) -> tuple:
    """`_norms` without the all_reduce: each rank's own block's norm."""
    norm = Y.float().square().sum(dim=(-2, -1), keepdim=True).sqrt()
    return norm, torch.tensor(float(Y.size(-1)))


def _special_cases(rank: int) -> dict[str, object]:
    """A group of one, bf16 vs fp32 reduction, and the unsummed norm that must fail."""
    singles = [dist.new_group([r]) for r in range(WORLD)]  # every rank creates every group
    iterations = ns_coefficients("classic", STEPS)
    results: dict[str, object] = {}
    # One rank holding the whole wide matrix as its column block: zeropower's own side, no sum.
    alone = []
    for dtype in DTYPES.values():
        for form in TP_FORMS:
            full = _matrix((16, 48), 100)
            want = zeropower(full, iterations, EPS, 1.0, dtype, form)
            got = tp_zeropower(full, "col", singles[rank], iterations, EPS, 1.0, dtype, form)
            alone.append((str(dtype), form, torch.equal(got, want), _max_diff(got, want)))
    results["alone"] = alone
    same = []
    for split, shape in CASES:
        mine = _block(_matrix(shape, 200), split, rank)
        for form in TP_FORMS:
            args = (mine, split, dist.group.WORLD, iterations, EPS, 1.0, torch.bfloat16, form)
            fp32 = tp_zeropower(*args, reduce_dtype=torch.float32)
            bf16 = tp_zeropower(*args, reduce_dtype=torch.bfloat16)
            same.append(((split, shape, form), torch.equal(fp32, bf16)))
    results["reduce_bf16_equal"] = same
    full = _matrix((16, 48), 300)
    want = _block(zeropower(full, iterations, EPS, 1.0, torch.float32), "row", rank)
    original = tpns._norms
    tpns._norms = _local_norms
    try:
        got = tp_zeropower(
            _block(full, "row", rank), "row", dist.group.WORLD, iterations, EPS, 1.0, torch.float32
        )
    finally:
        tpns._norms = original
    results["unsummed_norm_error"] = (got - want).abs().max().item()
    return results


def _muon_cases(rank: int) -> list[tuple]:
    """Sharded Muon (fsdp_tp) vs Muon: per setting and dtype, each parameter's max |Δ|
    and whether it is bitwise, and how many whole parameters the steps gathered."""
    mesh = init_device_mesh("cpu", (WORLD,))
    out = []
    runs = [(s, dtype) for s in [*SETTINGS, GRAM_SETTINGS] for dtype in DTYPES.values()]
    for settings, dtype in runs:
        want = _reference(settings, dtype)
        got, gathers = _sharded(settings, dtype, mesh, "fsdp_tp")
        per_param = [
            ((a - b).abs().max().item(), torch.equal(a, b)) for a, b in zip(got, want, strict=True)
        ]
        out.append((settings, str(dtype), per_param, gathers))
    return out


def _rank_main(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)  # two ranks on a two-core machine
    results = {
        "tp": _tp_cases(rank),
        "special": _special_cases(rank),
        "muon": _muon_cases(rank),
    }
    torch.save(results, Path(out) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("tp-ns")
    run_ranks(_rank_main, WORLD, str(out))
    return [torch.load(out / f"rank{rank}.pt") for rank in range(WORLD)]


@pytest.mark.slow
def test_tp_zeropower_matches_zeropower(two_ranks: list[dict]) -> None:
    for rank, results in enumerate(two_ranks):
        for case, *diffs in results["tp"]:
            form, dtype = case[-2:]
            where = f"rank {rank} {case}"
            vs_zeropower, tp_error, zeropower_error = diffs
            if dtype == "fp32":
                assert vs_zeropower <= FP32_TOL[form], f"{where}: |Δ| = {vs_zeropower:.3g}"
            else:
                bound = 2 * zeropower_error + BF16_FLOOR
                assert tp_error <= bound, f"{where}: error {tp_error:.3g} > {bound:.3g}"


@pytest.mark.slow
def test_tp_zeropower_bitwise_cases_and_failure(two_ranks: list[dict]) -> None:
    for rank, results in enumerate(two_ranks):
        special = results["special"]
        for dtype, form, equal, diff in special["alone"]:
            where = f"rank {rank}: a one-rank group vs zeropower ({dtype}, {form}): {diff:.3g}"
            # fp32: the norm's sum of squares adds in another order than Tensor.norm (≤ 8e-7)
            assert equal if dtype == "torch.bfloat16" else diff <= 5e-6, where
        for case, equal in special["reduce_bf16_equal"]:
            assert equal, f"rank {rank} {case}: bf16 and fp32 Gram reductions differ on 2 ranks"
        # Each rank dividing by its own block's norm: far outside FP32_TOL.
        error = special["unsummed_norm_error"]  # measured 0.11-0.13
        assert error > 1000 * FP32_TOL["factored"], error


@pytest.mark.slow
def test_sharded_muon_tp_matches_single_process(two_ranks: list[dict]) -> None:
    for rank, results in enumerate(two_ranks):
        for settings, dtype, per_param, gathers in results["muon"]:
            assert gathers == 0, f"{settings}: the step gathered {gathers} whole parameters"
            for shape, (diff, equal) in zip(SHAPES, per_param, strict=True):
                where = f"rank {rank} {settings} {dtype} {shape}"
                assert diff <= MUON_TOL[dtype], f"{where}: |Δ| = {diff:.3g}"
                if len(shape) > 2:  # whole matrices in each shard: orthogonalised locally
                    assert equal, f"{where}: a stacked weight is not bitwise ({diff:.3g})"


def test_arguments_are_checked() -> None:
    X, it = torch.zeros(4, 6), ns_coefficients("classic", 2)
    group = object()  # never reached: the checks come first
    with pytest.raises(ValueError, match="split must be one of"):
        tp_zeropower(X, "diagonal", group, it, EPS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ns_form must be one of"):
        tp_zeropower(X, "row", group, it, EPS, form="sextic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not run tensor-parallel"):
        tp_zeropower(X, "row", group, it, EPS, form="factored_unfused")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"needs matrices \(\.\.\., m, n\), got shape \(6,\)"):
        tp_zeropower(X[0], "row", group, it, EPS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="explicit process group"):
        tp_zeropower(X, "row", None, it, EPS)  # type: ignore[arg-type]
    # An empty batch needs no collective (every rank has the same batch), so no group is used.
    empty = tp_zeropower(torch.zeros(0, 4, 6), "row", group, it, EPS)  # type: ignore[arg-type]
    assert empty.shape == (0, 4, 6) and empty.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="Muon parallelism must be one of"):
        Muon([torch.nn.Parameter(X)], parallelism="fsdp_scatter")
    with pytest.raises(TypeError, match=r"optim\.muon\.sharded_ns is now dist\.parallelism"):
        Muon([torch.nn.Parameter(X)], sharded_ns="tp")
    assert MuonConfig().ns_form == "factored"


def test_ns_traffic() -> None:
    # 3072×768 split by rows on 2 ranks: Gram 768×768. Gram form (2 reductions for 5 steps),
    # fp32 reduction of bf16: twice the bytes of gathering (s/k = 4, W·r·b_r/b = 8); factored,
    # 5 reductions: 5× as many. (+ 8 bytes: the norm and the size.)
    gram = ns_traffic((3072, 768), "row", 2, 5, "gram")
    assert gram.gather == 2 * 1 / 4 * 3072 * 768 * 2
    assert gram.tp == 2 * 768 * 768 * 4 + 8 == 2 * gram.gather + 8
    factored = ns_traffic((3072, 768), "row", 2, 5)
    assert factored.tp == 5 * 768 * 768 * 4 + 8
    # The wide 768×3072 split by rows needs the 3072×3072 Gram: 16× the tall one's bytes, and
    # the gram form runs the factored iteration there.
    assert ns_traffic((768, 3072), "row", 2, 5).tp - 8 == 16 * (factored.tp - 8)
    assert ns_traffic((768, 3072), "row", 2, 5, "gram") == ns_traffic((768, 3072), "row", 2, 5)
    assert ns_traffic((768, 3072), "col", 2, 5) == factored
    assert ns_traffic((3, 16, 24), "col", 4, 2).tp == 1.5 * (3 * 2 * 16 * 16 * 4 + 4 * 4)
    assert ns_traffic((16, 16), "row", 1, 5) == (0, 0)
    with pytest.raises(ValueError, match="world must be >= 1"):
        ns_traffic((16, 16), "row", 0, 5)
