"""Newton–Schulz formulations against each other, against an fp64 SVD polar factor, against
the singular-value band their coefficients promise, and their FLOPs against torch's counter.

The forms are the same polynomials arranged differently, so in fp32 they agree to rounding;
in bf16 each rounds its own way. The band check is exact: `schedule_band` maps the input's
own singular-value interval through the coefficients, so a result outside it (beyond the
precision's slack) is an arithmetic error, not a loose tolerance.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from optim.muon.newton_schulz import (
    COEFFICIENT_SETS,
    NS_FORMS,
    ns_coefficients,
    ns_flops,
    uses_gram,
    zeropower,
)
from optim.muon.ns_schedule import schedule_band

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

# Wide and tall rectangles (the Gram iteration applies to the 3:1 ones), a square, and a
# stack of matrices each orthogonalised on its own.
SHAPES = [(48, 144), (144, 48), (64, 96), (64, 64), (3, 40, 120)]
# fp32: every form equals the factored one to rounding (measured ≤ 5.5e-6 relative, Frobenius,
# over SHAPES and both coefficient sets). bf16: each form's distance from the fp32 result,
# measured worst: factored 0.027, factored_unfused 0.047, expanded 0.077, gram 0.095 (Polar
# Express; classic 0.017, 0.039, 0.036, 0.046): factored rounds least (one rounding per fused
# product), which is one reason it is the default.
FP32_AGREE = 2e-5
BF16_FROM_FP32 = {"factored": 0.04, "factored_unfused": 0.07, "expanded": 0.12, "gram": 0.14}


def _run(G: torch.Tensor, name: str, form: str, dtype: torch.dtype, steps: int = 5):
    coeffs = ns_coefficients(name, steps)
    scale = COEFFICIENT_SETS[name].norm_scale
    return zeropower(G, coeffs, 1e-7, scale, dtype, form).double()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", sorted(COEFFICIENT_SETS))
@pytest.mark.parametrize("form", NS_FORMS)
def test_every_form_agrees_with_factored(form, name):
    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        G = torch.randn(shape, generator=gen)
        ref = _run(G, name, "factored", torch.float32)
        fp32, bf16 = _run(G, name, form, torch.float32), _run(G, name, form, torch.bfloat16)
        assert fp32.shape == bf16.shape == G.shape
        assert _rel(fp32, ref) < FP32_AGREE, (shape, _rel(fp32, ref))
        assert _rel(bf16, ref) < BF16_FROM_FP32[form], (shape, _rel(bf16, ref))


def test_gram_runs_only_where_it_saves_flops():
    """Square and near-square matrices take the direct iteration: bitwise the factored form."""
    assert uses_gram(48, 144) and uses_gram(64, 96) and not uses_gram(64, 95)
    gen = torch.Generator().manual_seed(1)
    for shape in [(64, 64), (60, 80), (80, 60)]:
        G = torch.randn(shape, generator=gen)
        gram, fac = (
            _run(G, "classic", "gram", torch.bfloat16),
            _run(G, "classic", "factored", torch.bfloat16),
        )
        assert torch.equal(gram, fac)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("steps", [4, 5, 6])
@pytest.mark.parametrize("name", sorted(COEFFICIENT_SETS))
@pytest.mark.parametrize("form", NS_FORMS)
def test_singular_values_land_in_the_promised_band(form, name, steps, dtype):
    """The input's normalised singular values, mapped through the coefficients exactly
    (schedule_band), bound the result's. Measured overshoot: fp32 none (≤ 1e-4 inside);
    bf16 ≤ 0.01 for classic and 5-step Polar Express, ≤ 0.035 for its 4- and 6-step schedules
    (their last polynomials are steeper near 1, so rounding moves the result more)."""
    gen = torch.Generator().manual_seed(2)
    slack = 1e-4 if dtype == torch.float32 else 0.06
    for shape in [(48, 144), (144, 48), (64, 96)]:  # rectangular: well-conditioned
        G = torch.randn(shape, generator=gen)
        sv_in = torch.linalg.svdvals(G.double())
        scaled = sv_in / (sv_in.norm() * COEFFICIENT_SETS[name].norm_scale)
        lo, hi = schedule_band(tuple(ns_coefficients(name, steps)), *scaled.aminmax())
        sv = torch.linalg.svdvals(_run(G, name, form, dtype, steps))
        assert lo - slack <= sv.min().item() and sv.max().item() <= hi + slack, (
            shape,
            (lo, hi),
            (sv.min().item(), sv.max().item()),
        )


def test_six_polar_express_steps_reach_the_polar_factor():
    """The 6-step schedule's band is [0.998, 1.002] from [1e-3, 1]: in fp32 the result is the
    fp64 SVD polar factor U·Vᵀ to ~2e-3 (measured 1.0e-3 on this input)."""
    G = torch.randn(64, 192, generator=torch.Generator().manual_seed(3))
    U, _, Vh = torch.linalg.svd(G.double(), full_matrices=False)
    for form in NS_FORMS:
        assert _rel(_run(G, "polar_express", form, torch.float32, 6), U @ Vh) < 2.5e-3
    # while 5 classic steps are ~16 % away (singular values spread over ~0.7-1.15)
    assert _rel(_run(G, "classic", "factored", torch.float32), U @ Vh) > 0.1


@pytest.mark.parametrize("steps", [1, 3, 5, 7])
@pytest.mark.parametrize("form", NS_FORMS)
@pytest.mark.parametrize("shape", [(48, 144), (144, 48), (64, 64), (3, 40, 120)])
def test_ns_flops_is_what_torch_counts(shape, form, steps):
    G = torch.randn(shape)
    with FlopCounterMode(display=False) as counter:
        zeropower(G, ns_coefficients("classic", steps), 1e-7, 1.0, torch.float32, form)
    assert counter.get_total_flops() == ns_flops(shape, steps, form)


def test_unknown_form_is_named():
    with pytest.raises(ValueError, match=r"ns_form must be one of .*got 'cubic'"):
        zeropower(torch.randn(8, 8), ns_coefficients("classic", 5), 1e-7, form="cubic")
