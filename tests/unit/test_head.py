"""The FP8 head's gradient cast sees the same values whatever the gradient accumulation.

record_2025_01_26 runs 8 GPUs with one micro-step each: every rank's e5m2 cast scales the gradient
of its own mean loss by 2¹⁹. One process with 8 micro-steps backpropagates loss / 8, so without a
correction the cast would see values 8 times smaller (an effective 2¹⁶) and flush more small
gradients to zero. With `micro_steps` the head undoes the factor inside the cast, and 8 accumulated
micro-steps give the head gradient that 8 ranks averaging their own would: equal up to the order of
the sum.
"""

import pytest
import torch

from model import GPT, ModelConfig
from model.config import update
from model.fp8 import scaled_mm
from model.head import FP8_SCALES, FP8Scales, fp8_scales, head_logits
from trainer.forward import forward_backward
from trainer.runtime import init_runtime

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

CFG = update(
    ModelConfig(n_layer=1, n_head=2, n_embd=64),
    {
        "numerics.dtype": "bf16",
        "head.fp8": True,
        "head.loss": "plain",
        "head.softcap_form": "sigmoid",
    },
)
ROWS, T = 8, 64


def head_grad_accumulated(model: GPT, x: torch.Tensor, y: torch.Tensor, micro_steps: int):
    """One process, a micro-step for each row, as the loop runs them."""
    model.zero_grad(set_to_none=True)
    model.micro_steps = micro_steps
    forward_backward(model, (x, y), init_runtime("cpu", "none"), accum_steps=x.size(0))
    return model.lm_head.weight.grad.clone()


def head_grad_of_ranks(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """ROWS "ranks" of one row each, no accumulation, gradients averaged as DDP does."""
    grads = []
    model.micro_steps = 1
    for r in range(ROWS):
        model.zero_grad(set_to_none=True)
        model(x[r : r + 1], y[r : r + 1]).backward()
        grads.append(model.lm_head.weight.grad.clone())
    return torch.stack(grads).mean(0)


def test_accumulated_fp8_head_gradient_equals_the_ranks_average() -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    with torch.no_grad():  # spread logits: many probabilities small enough to meet e5m2's floor
        model.lm_head.weight.normal_(0.0, 0.5).clamp_(-0.85, 0.85)  # in e4m3 range once × 512
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 50257, (ROWS * T + 1,), generator=g)
    x, y = tokens[:-1].view(ROWS, T), tokens[1:].view(ROWS, T)
    ranks = head_grad_of_ranks(model, x, y)
    fixed = head_grad_accumulated(model, x, y, micro_steps=ROWS)
    unfixed = head_grad_accumulated(model, x, y, micro_steps=1)

    def rel(a: torch.Tensor) -> float:
        return ((a - ranks).norm() / ranks.norm()).item()

    torch.testing.assert_close(fixed, ranks, rtol=1e-5, atol=1e-9)
    assert rel(unfixed) > 100 * max(rel(fixed), 1e-9), (rel(unfixed), rel(fixed))


def test_micro_steps_change_nothing_outside_the_fp8_head() -> None:
    """bf16 head: the factor is not used, the gradients are the same bits (2 micro-steps:
    a bf16 head where bf16 is emulated is slow)."""
    torch.manual_seed(0)
    model = GPT(update(CFG, {"head.fp8": False}))
    x = torch.randint(0, 50257, (2, T))
    a = head_grad_accumulated(model, x, x.roll(-1, 1), micro_steps=2)
    b = head_grad_accumulated(model, x, x.roll(-1, 1), micro_steps=1)
    assert torch.equal(a, b)


# --- the scales as divisors (model.numerics.fp8_scales) -------------------------------------

RECORD_2025_01 = (2.0**-1, 2.0**-9, 2.0**-19)  # divisors x_s, w_s, g_s (docs/records.md C.1)
RECORD_2025_11 = (768**0.5 / 448, 2.0**-9, 1 / 448)


def signed(shape: tuple[int, int], scale: float, gen: torch.Generator) -> torch.Tensor:
    """scale · ±U[1, 16): once divided by `scale` and cast to FP8, every product of two such
    values has at most 8 significant bits and a small sum of them is exact in fp32, so the
    GEMMs' accumulation order cannot change a bit."""
    magnitude = 1 + 15 * torch.rand(shape, generator=gen, dtype=torch.float64)
    sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
    return sign * magnitude * scale


def fp8_formula(x, w, g, scales, k):
    """record_2025_11_29's head (docs/records.md, C.1) in float64 with every rounding written out
    (the quotients X / x_s and G / g_s rounded to bf16 first, as a division on a bf16 tensor is)."""
    x_s, w_s, g_s = scales
    bf16 = lambda t: t.bfloat16().double()  # noqa: E731
    x8 = bf16(x.double() / x_s).to(torch.float8_e4m3fn).double()
    w8 = (w.double() / w_s).to(w.dtype).to(torch.float8_e4m3fn).double()
    g8 = bf16(g.double() / (g_s / k)).to(torch.float8_e5m2).double()
    logits = bf16(x8 @ w8.T * x_s * w_s)
    grad_x = bf16(g8 @ w8 * (g_s / k) * w_s)
    grad_w = (x8.T @ g8 * x_s * (g_s / k)).T.float().to(w.dtype).double()
    return logits, grad_x, grad_w


def run_fp8(x, w, g, scales, k):
    from model.head import FP8Matmul

    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = FP8Matmul.apply(x, w, k, FP8Scales(*scales))
    out.backward(g)
    return out, x.grad, w.grad


def test_pow2_divisors_give_the_multiply_forms_bits() -> None:
    """X·2, W·512, G·2¹⁹k with 1/2, 1/512, 1/(2¹⁹k) to dequantise (the 2025-01 form) and the
    divisors 1/2, 2⁻⁹, 2⁻¹⁹ give the same bits, for fp32 weights and any accumulation k."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, generator=gen).bfloat16()
    w = torch.randn(96, 64, generator=gen) * 0.05
    g = torch.randn(32, 96, generator=gen).bfloat16() * 1e-4

    def multiply_form(k: int):  # the same FP8 product (model.fp8), the record's operands
        one = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
        x8, w8 = (x * 2.0).to(torch.float8_e4m3fn), (w * 512.0).to(torch.float8_e4m3fn)
        g8 = (g * (2.0**19 * k)).to(torch.float8_e5m2)
        out = scaled_mm(x8, w8.T, one(1 / 2), one(1 / 512), torch.bfloat16)
        gx = scaled_mm(g8, w8, one(1 / (2.0**19 * k)), one(1 / 512), torch.bfloat16)
        gw = scaled_mm(x8.T, g8, one(1 / 2), one(1 / (2.0**19 * k)), torch.float32)
        return out, gx, gw.T

    for k in (1, 3, 8):
        for got, want in zip(run_fp8(x, w, g, RECORD_2025_01, k), multiply_form(k), strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want), k


@pytest.mark.parametrize(
    ("scales", "w_dtype", "k"),
    [
        (RECORD_2025_01, torch.float32, 1),
        (RECORD_2025_01, torch.bfloat16, 4),
        (RECORD_2025_11, torch.bfloat16, 1),
        (RECORD_2025_11, torch.bfloat16, 4),
        (RECORD_2025_11, torch.float32, 1),
    ],
)
def test_fp8_head_is_the_formula_with_explicit_casts(scales, w_dtype, k) -> None:
    """Logits, ∂X and ∂W (in W's dtype) against the float64 formula. Power-of-two scales:
    the same bits. x_s = √768/448 and g_s = 1/448 are not exact in fp32 (the scales and their
    product are rounded there), so the fp32 results may differ in their last bits: bf16
    results within one unit in the last place and nearly all equal, fp32 ones within a few
    (and a tiny absolute error where a sum cancels)."""
    gen = torch.Generator().manual_seed(1)
    x_s, w_s, g_s = scales
    x = signed((16, 32), x_s, gen).bfloat16()
    w = signed((48, 32), w_s, gen).to(w_dtype)
    g = signed((16, 48), g_s / k, gen).bfloat16()
    got, want = run_fp8(x, w, g, scales, k), fp8_formula(x, w, g, scales, k)
    assert (got[0].dtype, got[1].dtype, got[2].dtype) == (torch.bfloat16, torch.bfloat16, w_dtype)
    exact = scales == RECORD_2025_01
    for name, a, b in zip(("logits", "grad_x", "grad_w"), got, want, strict=True):
        if exact:
            assert torch.equal(a.double(), b), name
        else:
            bf16 = a.dtype == torch.bfloat16
            # atol: where a sum cancels, the operand roundings (~2⁻²⁴ of each product) remain
            atol = 2.0**-16 * b.abs().max().item()
            rtol = 2.0**-7 if bf16 else 2.0**-21  # one bf16 ulp; a few fp32 ulps
            torch.testing.assert_close(a.double(), b, rtol=rtol, atol=atol, msg=name)
            if bf16:  # the fp32 differences rarely cross a bf16 rounding boundary
                assert (a.double() == b).double().mean() > 0.99, name


def test_head_logits_by_name_quantise_x_as_sqrt_d_over_448_says() -> None:
    """`head_logits(..., "sqrt_d_over_448")` in training, read back through a unit weight:
    with W = w_s·I (so W₈ = I) the logits are X₈·x_s·w_s within a bf16 unit, and X₈ itself,
    recovered by rounding logits / (x_s·w_s) to e4m3, is the formula's e4m3(bf16(X / x_s))
    with the width's x_s = √16/448, not the record width's √768/448."""
    x_s, w_s = 16**0.5 / 448, RECORD_2025_11[1]
    gen = torch.Generator().manual_seed(2)
    x = torch.nn.functional.rms_norm(torch.randn(8, 16, generator=gen), (16,))
    x = (x * 0.99).bfloat16()  # |X| < √16 as after RMSNorm, so |X / x_s| < 448
    head = torch.nn.Linear(16, 16, bias=False).bfloat16()  # the record's bf16 head
    with torch.no_grad():
        head.weight.copy_(torch.eye(16) * w_s)
    logits = head_logits(head, x[None], True, 1, "sqrt_d_over_448")[0]
    x8 = (x.double() / x_s).bfloat16().to(torch.float8_e4m3fn).double()
    torch.testing.assert_close(logits.double(), x8 * x_s * w_s, rtol=2.0**-7, atol=0)
    recovered = (logits.double() / (x_s * w_s)).to(torch.float8_e4m3fn).double()
    assert torch.equal(recovered, x8)
    assert x8.abs().max() > 100  # the divisor scaled X up into e4m3's range
    head.eval()  # evaluation: the plain matmul
    assert torch.equal(head_logits(head, x[None], True, 1, "sqrt_d_over_448"), head(x[None]))


def test_fp8_scales_are_validated() -> None:
    from model.config import ModelConfig as Config
    from trainer.config import check_choices

    assert fp8_scales("sqrt_d_over_448", 768) == FP8Scales(*RECORD_2025_11)
    assert fp8_scales("sqrt_d_over_448", 64) == FP8Scales(8 / 448, 2.0**-9, 1 / 448)  # √d/448
    assert fp8_scales("pow2", 64) == FP8Scales(*RECORD_2025_01)
    assert fp8_scales("fixed_over_448", 64) == FP8Scales(100 / 448, 1.6 / 448, 0.75 / 448)
    assert Config().numerics.fp8_scales == "pow2"
    for name in FP8_SCALES:
        check_choices(update(Config(), {"numerics.fp8_scales": name}), "model.")
    with pytest.raises(ValueError, match=r"model\.numerics\.fp8_scales must be one of"):
        check_choices(update(Config(), {"numerics.fp8_scales": "record_2025_12"}), "model.")
    with pytest.raises(ValueError, match=r"model\.numerics\.fp8_scales must be one of"):
        fp8_scales("record_2025_12", 768)
