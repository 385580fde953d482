"""optim/muon/newton_schulz.py: coefficient sets, zeropower against torch's, batching, the
singular-value band, the cost model; and optim/muon/exchange.py's ownership."""

import pytest
import torch
from torch.optim._muon import _zeropower_via_newtonschulz as torch_zeropower

from optim.muon.exchange import assign_owners
from optim.muon.newton_schulz import (
    CLASSIC,
    COEFFICIENT_SETS,
    NS_FORMS,
    POLAR_EXPRESS,
    ns_coefficients,
    ns_flops,
    zeropower,
)
from optim.muon.ns_schedule import polar_express_schedule

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

# bf16 against torch's own Newton–Schulz: different operand layouts round ~0.5-1 % apart.
RTOL = 0.02


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


# --- Newton–Schulz ---------------------------------------------------------------------------


def test_coefficient_sets():
    assert ns_coefficients("classic", 3) == [(3.4445, -4.7750, 2.0315)] * 3
    pe = ns_coefficients("polar_express", 5)
    assert pe[0] == (8.156554524902461, -22.48329292557795, 15.878769915207462)
    assert pe[4] == (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)
    assert pe == list(POLAR_EXPRESS)
    # Other counts: the schedule computed for that many steps (its first tuples are the same).
    assert ns_coefficients("polar_express", 4) == list(polar_express_schedule(4))
    four = ns_coefficients("polar_express", 4)
    assert [x for t in four[:3] for x in t] == pytest.approx([x for t in pe[:3] for x in t])
    assert four[3] != pytest.approx(pe[3], rel=1e-3)
    with pytest.raises(ValueError, match=r"ns_coefficients must be one of .*, got 'cubic'"):
        ns_coefficients("cubic", 5)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        ns_coefficients("classic", 0)


@pytest.mark.parametrize("shape", [(48, 128), (128, 48), (64, 64)])
def test_zeropower_matches_torch(shape):
    torch.manual_seed(0)
    G = torch.randn(shape)
    expected = torch_zeropower(G, CLASSIC, 5, 1e-7)
    ours = zeropower(G, ns_coefficients("classic", 5), 1e-7)
    assert ours.dtype == torch.bfloat16 and ours.shape == G.shape
    assert rel_err(ours, expected) < RTOL
    # The tolerance is tight enough to see one step fewer, or a 2 % normalisation change.
    assert rel_err(zeropower(G, ns_coefficients("classic", 4), 1e-7), expected) > 5 * RTOL
    assert rel_err(zeropower(G, [CLASSIC] * 5, 1e-7, norm_scale=1.02), expected) > RTOL


@pytest.mark.parametrize("form", NS_FORMS)
def test_zeropower_batch_equals_one_by_one(form):
    """Bitwise on these shapes: a matrix's result does not depend on what else shares its
    batch (ranks batch different matrices together). Not a guarantee for every shape: CPU
    kernels are picked by size, and a 16×48 batch of 6 rounds unlike one of 1 in either form."""
    torch.manual_seed(0)
    coefficients = ns_coefficients("polar_express", 5)
    for shape in [(32, 80), (80, 32), (40, 40)]:
        G = torch.randn(2, 3, *shape)
        batched = zeropower(G, coefficients, 1e-7, norm_scale=1.02, form=form)
        assert batched.shape == G.shape
        for i in range(2):
            for j in range(3):
                single = zeropower(G[i, j], coefficients, 1e-7, norm_scale=1.02, form=form)
                assert torch.equal(batched[i, j], single)


def test_zeropower_of_zero_is_zero():
    out = zeropower(torch.zeros(3, 8, 16), [CLASSIC] * 5, 1e-7)
    assert torch.equal(out, torch.zeros_like(out))


def singular_value_spread(s: torch.Tensor) -> float:
    return (s.std() / s.mean()).item()


# Measured bands (random Gaussian input, 5 steps): classic 0.680-1.138, Polar Express
# 0.858-1.143, for every shape below; padded by ~0.02. Square random matrices are left out:
# their smallest singular values are near 0 and 5 steps cannot lift them.
BANDS = {"classic": (0.66, 1.16), "polar_express": (0.84, 1.16)}


@pytest.mark.parametrize("name", ["classic", "polar_express"])
@pytest.mark.parametrize("shape", [(768, 3072), (128, 512), (512, 128), (200, 600), (600, 200)])
def test_singular_values_in_band(name, shape):
    torch.manual_seed(0)
    G = torch.randn(shape)
    out = zeropower(G, ns_coefficients(name, 5), 1e-7, COEFFICIENT_SETS[name].norm_scale)
    s = torch.linalg.svdvals(out.float())
    lo, hi = BANDS[name]
    assert lo < s.min().item() and s.max().item() < hi, (s.min().item(), s.max().item())
    # Closer to orthogonal than the input: the relative spread of the singular values shrinks
    # (input ~0.26-0.31, classic ~0.16-0.19, Polar Express ~0.09).
    s_in = torch.linalg.svdvals(G)
    assert singular_value_spread(s) < 0.75 * singular_value_spread(s_in)


# --- Ownership for the distributed mode ------------------------------------------------------


def test_ns_flops():
    assert ns_flops((768, 3072), 5) == 5 * (4 * 768 * 768 * 3072 + 2 * 768**3)
    assert ns_flops((3072, 768), 1) == ns_flops((768, 3072), 1)


def gpt_shapes(n_layer: int, d: int) -> list[tuple[int, int]]:
    block = [(d, d)] * 4 + [(4 * d, d), (d, 4 * d)]
    return block * n_layer


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_assign_owners_balances_cost(world_size):
    shapes = gpt_shapes(12, 768)
    owners = assign_owners(shapes, world_size)
    assert owners == assign_owners(shapes, world_size)  # every rank computes the same
    load = [0] * world_size
    for shape, owner in zip(shapes, owners, strict=True):
        load[owner] += ns_flops(shape, 5)
    # The most loaded rank carries at most one small (768²) matrix more than the average.
    assert max(load) - sum(load) / world_size <= ns_flops((768, 768), 5)


def test_assign_owners_sorts_by_cost_not_position():
    big, small = (64, 256), (16, 16)
    # In model order, rank 0 would get both large matrices.
    assert assign_owners([big, small, big, small], 2) == [0, 0, 1, 1]
    assert assign_owners([small, small, big], 3) == [1, 2, 0]  # ties broken by index
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        assign_owners([big], 0)


def test_expanded_newton_schulz_equals_the_factored_form():
    G = torch.randn(4, 64, 96, generator=torch.Generator().manual_seed(0))
    coefficients = ns_coefficients("classic", 5)
    a = zeropower(G, coefficients, 1e-7, dtype=torch.float64)
    b = zeropower(G, coefficients, 1e-7, dtype=torch.float64, form="expanded")
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # In bf16 each form rounds its own way: measured 1.5 % (factored) and 3.0 % (expanded,
    # three rounded terms per iteration) from the exact result on these matrices.
    expanded = rel_err(zeropower(G, coefficients, 1e-7, form="expanded"), a)
    factored = rel_err(zeropower(G, coefficients, 1e-7), a)
    assert factored < 0.02 and expanded < 0.04
