"""The CPU's FP8 product (model/fp8.py) against torch's own FP8 GEMM, `torch._scaled_mm`, on
shapes small enough for the CPU kernel (which is very slow on some CPUs); and a CPU training
step with FP8 in it never calls that kernel.

Both compute Σ a·b over k with exact fp32 products (an FP8 value has at most 4 significant
bits, a product of two at most 8) and fp32 sums, so they can differ only where a sum rounds:
- operands whose partial sums are all exact in fp32 give the same bits in any order;
- others differ by the accumulation order, at most 2·γ_k·Σ|a·b| (γ_k = k·2⁻²⁴: each of the two
  sums' rounding error is within γ_k·Σ|a·b|), plus one unit in the last place of the output
  dtype where that difference crosses one of its rounding boundaries.
The CPU kernel multiplies each operand by its scale before the product, the emulation (as the
CUDA kernel) scales the sum: with powers of two that is the same, otherwise each scaled value
carries one more fp32 rounding (2⁻²⁴ relative), which the bound covers by a third γ_k term.
"""

import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model.fp8 import emulated_scaled_mm, scaled_mm

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
U = 2.0**-24  # fp32's unit roundoff
POW2 = (2.0**-1, 2.0**-9)  # the 2025-01 record's x and w divisors
ODD = (768**0.5 / 448, 1 / 448)  # the 2025-11 record's: not exact in fp32
M, K, N = 24, 96, 40
CASES = list(
    itertools.product([(E4M3, E4M3), (E5M2, E4M3)], [torch.bfloat16, torch.float32], [False, True])
)


def exact_operand(shape: tuple[int, int], dtype: torch.dtype, gen: torch.Generator):
    """±{1, 1.25, 1.5, 1.75}·2^e for e in 0..3: FP8 values whose products are multiples of
    1/16 below 2⁸, so every partial sum of K = 96 of them (< 2¹⁵) is exact in fp32."""
    mant = 1 + torch.randint(0, 4, shape, generator=gen) / 4
    exp = torch.randint(0, 4, shape, generator=gen).float()
    sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
    return (sign * mant * 2**exp).to(dtype)


def gaussian_operand(shape: tuple[int, int], dtype: torch.dtype, gen: torch.Generator):
    """Spread FP8 values: sums that round, in an order that matters."""
    return (torch.randn(shape, generator=gen) * 16).to(dtype)


def both(a8, b8, scales, out_dtype, fast):
    sa, sb = (torch.tensor(s, dtype=torch.float32) for s in scales)
    ours = emulated_scaled_mm(a8, b8.T, sa, sb, out_dtype)
    torchs = torch._scaled_mm(
        a8, b8.T, scale_a=sa, scale_b=sb, out_dtype=out_dtype, use_fast_accum=fast
    )
    return ours, torchs


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of `dtype` at |x| (float64)."""
    info = torch.finfo(dtype)
    return info.eps * torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(info.tiny))))


@pytest.mark.parametrize(("dtypes", "out_dtype", "fast"), CASES)
def test_exact_sums_give_the_same_bits(dtypes, out_dtype, fast) -> None:
    gen = torch.Generator().manual_seed(0)
    a8 = exact_operand((M, K), dtypes[0], gen)
    b8 = exact_operand((N, K), dtypes[1], gen)
    ours, torchs = both(a8, b8, POW2, out_dtype, fast)
    assert ours.dtype == torchs.dtype == out_dtype
    assert torch.equal(ours, torchs)
    # and both are the float64 product: no rounding before the output's
    want = (a8.double() @ b8.double().T * POW2[0] * POW2[1]).to(out_dtype)
    assert torch.equal(ours, want)


@pytest.mark.parametrize(("dtypes", "out_dtype", "fast"), CASES)
@pytest.mark.parametrize("scales", [POW2, ODD], ids=["pow2", "odd"])
def test_other_sums_differ_by_the_accumulation_order_only(dtypes, out_dtype, fast, scales):
    gen = torch.Generator().manual_seed(1)
    a8 = gaussian_operand((M, K), dtypes[0], gen)
    b8 = gaussian_operand((N, K), dtypes[1], gen)
    ours, torchs = both(a8, b8, scales, out_dtype, fast)
    s = scales[0] * scales[1]
    magnitude = (a8.double().abs() @ b8.double().abs().T) * s
    terms = 2 if scales == POW2 else 3
    bound = terms * K * U * magnitude + ulp(torchs.double(), out_dtype)
    gap = (ours.double() - torchs.double()).abs()
    assert (gap <= bound).all(), (gap - bound).max().item()
    # the bound is not vacuous: the values are far larger than it
    assert (bound / magnitude).median() < 2.0**-6
    if scales == POW2 and out_dtype == torch.bfloat16:  # a rounding boundary is rarely met
        assert (ours == torchs).double().mean() > 0.95


def test_scaled_mm_takes_fp8_only() -> None:
    one = torch.tensor(1.0)
    with pytest.raises(TypeError, match="FP8 operands"):
        emulated_scaled_mm(torch.ones(2, 2), torch.ones(2, 2).bfloat16(), one, one, torch.float32)


class OpsSeen(TorchDispatchMode):
    """The aten ops a piece of code runs, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.fp8_outputs = 0  # ops that returned an FP8 tensor: the casts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.name())
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype in (E4M3, E5M2):
            self.fp8_outputs += 1
        return out


@pytest.mark.parametrize("experiment", ["record_2025_01_26", "record_2025_11_29"])
def test_a_cpu_training_step_never_calls_the_fp8_kernel(experiment: str) -> None:
    """The FP8-head presets at toy size, one forward/backward/update on the CPU: the FP8 casts
    happen (so the FP8 path ran) and `_scaled_mm` never does."""
    from model import GPT
    from optim import build_optimizer
    from tests.helpers import compose_config
    from trainer.config import to_config
    from trainer.forward import forward_backward
    from trainer.runtime import init_runtime
    from trainer.schedule import Schedule

    toy = ["run_dir=.", "model.n_layer=4", "model.n_head=2", "model.n_embd=64",
           "model.attention.window_block=16",
           "model.compile=false", "train.device=cpu", "train.seq_len=128"]  # fmt: skip
    if experiment == "record_2025_11_29":  # docs/speedruns.md's toy: skip and backout at 4 layers
        toy += ["model.residual.skips=[[1,2]]",
                "model.residual.backout_layer=2",
                "train.stages.rows.0.seq_len=128", "train.stages.rows.1.seq_len=128",
                "train.stages.rows.2.seq_len=128"]  # fmt: skip
    conf = to_config(compose_config([f"experiment={experiment}", *toy]))
    assert conf.model.head.fp8
    torch.manual_seed(0)
    model = GPT(conf.model, conf.train.stages)
    opt = build_optimizer(model, conf.optim, device=torch.device("cpu"))
    schedule = Schedule.for_run(conf.train, conf.optim, conf.model)
    args = {k: torch.tensor(v, dtype=torch.float64) for k, v in schedule.model_args(0).items()}
    x = torch.randint(0, 50257, (1, 128))
    rt = init_runtime("cpu", conf.train.autocast)
    with OpsSeen() as seen:
        opt.set_step(schedule.at(0).optim)
        forward_backward(model, (x, x.roll(-1, 1)), rt, 1, None, args)
        opt.step()
    assert seen.fp8_outputs >= 3  # X, W and G cast to FP8: the FP8 path ran
    assert "aten::_scaled_mm" not in seen.names, sorted(seen.names)
    assert all(p.grad is None or p.grad.isfinite().all() for p in model.parameters())


def test_scaled_mm_dispatches_by_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU tensor the emulation, whatever torch's CPU kernel would do."""

    def refuse(*args, **kwargs):
        raise AssertionError("torch._scaled_mm called on a CPU tensor")

    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    gen = torch.Generator().manual_seed(2)
    a8, b8 = exact_operand((4, 8), E4M3, gen), exact_operand((6, 8), E4M3, gen)
    one = torch.tensor(1.0)
    out = scaled_mm(a8, b8.T, one, one, torch.float32, use_fast_accum=True)
    assert torch.equal(out, (a8.double() @ b8.double().T).float())
