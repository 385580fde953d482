"""model/triton_mlp.py's kernel against model/mlp_fp8.py's FP8 MLP forward (torch ops, the
reference; on a CPU `model.fp8.scaled_mm` emulates the FP8 GEMM), run by Triton's interpreter
on the CPU (TRITON_INTERPRET=1, set before the kernel is built; the interpreter runs tl.dot on
the e4m3 tiles, upcast exactly, and the epilogue in numpy's fp32).

The bounds:
- the epilogue (ReLU², post₈, the tile maxima) from the kernel's own pre: bit for bit;
- pre, where the fp32 sums are exact (small integer operands): bit for bit;
- the whole path from n₈ and c_fc₈ against the forward's pre, post, post₈ and max post: pre
  within one bf16 step on at most `MAX_DIFFERING` of its values (the K-blocked sums add in
  another order than the emulation's fp32 matmul), the rest equal wherever pre is. Measured on
  30 seeds of each: no pre differed at T = 64 or 50, d = 32, 48 or 64 (2.0 million values),
  one in 2.0 million at T = 128, d = 128.
"""

import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the Triton MLP kernel needs triton (pip install triton)")

from model import mlp_fp8
from model.fp8 import scaled_mm
from model.mlp_fp8 import E4M3, E4M3_MAX, FP8MlpFunction, _e4m3
from model.triton_mlp import available, fused_relu2_grad, fused_up_relu2

BF16 = torch.bfloat16
BLOCKS = (32, 32, 16)  # 2 × 4 tiles of a 64 × 128 output (a partial row of tiles at T = 50)
MAX_DIFFERING = 1e-3  # the share of pre's values that may differ from the reference's
SUBNORMAL = 2.0**-6  # e4m3's smallest normal value


@pytest.fixture(autouse=True)
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def mlp_inputs(tokens: int, d: int, fc_in_out: bool, seed: int) -> tuple:
    """n as the MLP gets it (T×d, bf16, RMS-normed rows), the fp32 master weights c_fc (4d×d,
    or d×4d stored (in, out)) and c_proj (d×4d), U(±√3/√d) as the model's init."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, d, generator=g, dtype=torch.float64)
    n = (x / x.square().mean(-1, keepdim=True).sqrt()).to(BF16)
    bound = 3**0.5 / d**0.5
    fc = (torch.rand(4 * d, d, generator=g) * 2 - 1) * bound
    proj = (torch.rand(d, 4 * d, generator=g) * 2 - 1) * bound
    return n, (fc.T.contiguous() if fc_in_out else fc).requires_grad_(), proj.requires_grad_()


def mlp_forward(
    monkeypatch: pytest.MonkeyPatch, tokens: int, d: int, fc_in_out: bool, s_act, seed: int
) -> dict:
    """mlp_fp8's FP8 forward (mlp.fp8=up_down, s_w = 1) and what it computed: its operands and
    scales as it handed them to `scaled_mm`, pre and post as it saved them, post₈, max post."""
    calls = []
    real = mlp_fp8.scaled_mm

    def spy(a, b, scale_a, scale_b, dtype, use_fast_accum=False):
        calls.append((a, b, scale_a, scale_b))
        return real(a, b, scale_a, scale_b, dtype, use_fast_accum)

    monkeypatch.setattr(mlp_fp8, "scaled_mm", spy)
    n, fc, proj = mlp_inputs(tokens, d, fc_in_out, seed)
    s_act = torch.tensor(float(s_act))
    out, post_max = FP8MlpFunction.apply(n, fc, proj, (fc_in_out, False), (s_act, torch.ones(())))
    _, pre, post, _, _ = out.grad_fn.saved_tensors
    (n8, fc8_t, a_scale, s_up), (post8, _, s_act_seen, _) = calls
    assert s_act_seen is s_act
    return {
        "n8": n8, "w8": fc8_t.T, "a_scale": a_scale, "s_up": s_up, "s_act": s_act,
        "pre": pre, "post": post, "post8": post8, "post_max": post_max,
    }  # fmt: skip


def epilogue(pre: torch.Tensor, s_act: torch.Tensor, blocks=BLOCKS) -> tuple:
    """post, post₈ and the tile maxima from pre by mlp_fp8's forward's ops."""
    post = F.relu(pre).square()
    post8 = _e4m3(post.float() / s_act, E4M3_MAX)
    bm, bn, _ = blocks
    (t, f), rows, cols = post.shape, -(-post.size(0) // bm), -(-post.size(1) // bn)
    padded = F.pad(post.float(), (0, cols * bn - f, 0, rows * bm - t))  # post ≥ 0
    tiles = padded.view(rows, bm, cols, bn).amax(dim=(1, 3))
    return post, post8, tiles


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same bits (bf16, e4m3 or fp32), NaN included."""
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


def bf16_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bf16 values apart a and b are (same signs: pre's differing values are not 0)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


CASES = [  # T, d, c_fc stored (in, out), the kernel's blocks (None: its defaults, one tile)
    (64, 32, False, None),
    (50, 32, True, BLOCKS),
    (50, 48, False, (32, 32, 32)),
]


@pytest.mark.parametrize(("tokens", "d", "fc_in_out", "blocks"), CASES)
def test_the_whole_path_is_the_fp8_mlp_forward(
    monkeypatch: pytest.MonkeyPatch, tokens: int, d: int, fc_in_out: bool, blocks
) -> None:
    """From the forward's n₈ and c_fc₈ (its transposed view under fc_in_out: other strides),
    the kernel's four results against the forward's; T = 50 leaves a partial row of tiles, d =
    48 a partial K-block (16 of 32). s_act = 1: the first step's."""
    ref = mlp_forward(monkeypatch, tokens, d, fc_in_out, 1.0, seed=tokens + d)
    pre, post, post8, tiles = fused_up_relu2(
        ref["n8"], ref["w8"], ref["a_scale"], ref["s_up"], ref["s_act"], blocks=blocks
    )
    assert pre.shape == post.shape == post8.shape == (tokens, 4 * d)
    assert (pre.dtype, post.dtype, post8.dtype) == (BF16, BF16, E4M3)
    bm, bn, _ = blocks or (64, 128, 32)
    assert tiles.shape == (-(-tokens // bm), -(-4 * d // bn))
    differs = pre.view(torch.int16) != ref["pre"].view(torch.int16)
    assert differs.sum() <= MAX_DIFFERING * pre.numel()
    assert bf16_steps(pre, ref["pre"]).max() <= 1
    rows = ~differs.any(dim=1)  # the other rows' post, post₈ must be the forward's bit for bit
    assert same(post[rows], ref["post"][rows]) and same(post8[rows], ref["post8"][rows])
    if not differs.any():
        assert same(tiles.amax(), ref["post_max"].float())


@pytest.mark.parametrize("headroom", [1.8, 0.25])
def test_the_epilogue_is_bit_for_bit(monkeypatch: pytest.MonkeyPatch, headroom: float) -> None:
    """post, post₈ and the tile maxima from the kernel's own pre by mlp_fp8's ops, bit for bit,
    with s_act = h·m/448 for the forward's max post m: h = 1.8 (the record's delayed scale,
    post/s_act ≤ 249) and h = 0.25 (posts that outgrew it: past 464, where the clamp decides).
    The data can tell a kernel without the clamp or without pre's bf16 rounding before ReLU²:
    both would change values here (checked below on the reference's side)."""
    first = mlp_forward(monkeypatch, 64, 32, False, 1.0, seed=1)
    s_act = headroom * first["post_max"].float() / E4M3_MAX
    ref = mlp_forward(monkeypatch, 64, 32, False, s_act, seed=1)
    pre, post, post8, tiles = fused_up_relu2(
        ref["n8"], ref["w8"], ref["a_scale"], ref["s_up"], ref["s_act"], blocks=BLOCKS
    )
    want_post, want_post8, want_tiles = epilogue(pre, ref["s_act"])
    assert same(post, want_post) and same(post8, want_post8) and same(tiles, want_tiles)
    quotient = want_post.float() / ref["s_act"]
    assert ((quotient > 0) & (quotient < SUBNORMAL)).any()  # subnormal e4m3 values
    assert (quotient > 464).any() == (headroom < 1)  # past 464 an unclamped e4m3 is wrong
    unrounded = scaled_mm(ref["n8"], ref["w8"].T, ref["a_scale"], ref["s_up"], torch.float32)
    assert not same(F.relu(unrounded).square().to(BF16), want_post)  # ReLU² of the fp32 pre


def test_exact_sums_give_pre_bit_for_bit() -> None:
    """Operands of small integers (|n₈|, |c_fc₈| ≤ 16, d = 32: every sum exact in fp32, in any
    order): pre is the emulated GEMM's bit for bit, so the scales' product and pre's rounding
    are scaled_mm's; scales that are not powers of two (their product's rounding counts)."""
    g = torch.Generator().manual_seed(3)
    n8 = torch.randint(-16, 17, (50, 32), generator=g).float().to(E4M3)
    w8 = torch.randint(-16, 17, (128, 32), generator=g).float().to(E4M3)
    a_scale = torch.tensor(3.7109375 / E4M3_MAX)
    s_up = torch.tensor(0.0123291015625)  # a bf16 value, as mlp_fp8's s_up
    s_act = torch.tensor(0.0071)
    pre, post, post8, tiles = fused_up_relu2(n8, w8, a_scale, s_up, s_act, blocks=BLOCKS)
    want_pre = scaled_mm(n8, w8.T, a_scale, s_up, BF16)
    assert same(pre, want_pre)
    want_post, want_post8, want_tiles = epilogue(want_pre, s_act)
    assert same(post, want_post) and same(post8, want_post8) and same(tiles, want_tiles)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy's 0·inf
def test_nan_and_infinity_go_through_as_in_torch() -> None:
    """An infinite scale: pre = ±inf, and NaN where a sum is 0 (all of row 5: zeros); ReLU²,
    the clamp and the tile maxima carry them as mlp_fp8's ops do (NaN: the same NaN-ness, the
    bits of a NaN being the CPU's)."""
    g = torch.Generator().manual_seed(4)
    n = torch.randn(64, 32, generator=g)
    n[5] = 0
    n8, w8 = n.to(E4M3), torch.randn(128, 32, generator=g).to(E4M3)
    inf = torch.tensor(float("inf"))
    pre, post, post8, tiles = fused_up_relu2(n8, w8, inf, 1.0, 1.0, blocks=BLOCKS)
    want_pre = scaled_mm(n8, w8.T, inf, torch.tensor(1.0), BF16)
    want_post, want_post8, want_tiles = epilogue(want_pre, torch.tensor(1.0))
    assert pre.isnan()[5].all() and want_pre.isnan()[5].all()
    assert torch.equal(pre.isnan(), want_pre.isnan())
    assert torch.equal(pre.nan_to_num(), want_pre.nan_to_num())
    assert torch.equal(post.isnan(), want_post.isnan())
    assert torch.equal(post.nan_to_num(), want_post.nan_to_num())
    assert torch.equal(post8.float().isnan(), want_post8.float().isnan())
    assert same(post8[~post8.float().isnan()], want_post8[~want_post8.float().isnan()])
    assert torch.equal(tiles.isnan(), want_tiles.isnan()) and tiles[0].isnan().all()
    assert torch.equal(tiles.nan_to_num(), want_tiles.nan_to_num())


def grad_reference(g: torch.Tensor, w: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """∂pre by FP8MlpFunction.backward's torch ops (w: c_proj as (4d, d))."""
    return (g @ w.T).mul_(2).mul_(F.relu(pre))


def exact_grad_operands(tokens: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    """g, w (as a transposed view of a row-major d×4d c_proj) of small integers, |·| ≤ 16
    (every sum exact in fp32, in any order), and a pre with negatives, zeros, ±inf and NaN."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randint(-16, 17, (tokens, d), generator=gen).to(BF16)
    w = torch.randint(-16, 17, (d, 4 * d), generator=gen).to(BF16).T  # strides (1, 4d)
    pre = torch.randn(tokens, 4 * d, generator=gen).mul(3).to(BF16)
    pre[0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0])
    return g, w, pre


@pytest.mark.parametrize(("tokens", "d", "blocks"), [(50, 32, BLOCKS), (64, 48, (32, 64, 32))])
def test_the_backward_kernel_is_the_backward_s_ops_where_the_sums_are_exact(
    tokens: int, d: int, blocks
) -> None:
    """∂pre = 2·(g·c_projᵀ)·ReLU(pre) equals FP8MlpFunction.backward's ops value for value
    (±0 alike; NaN where they give NaN: ReLU passes it, inf·0 makes it), T = 50 a partial row
    of tiles, d = 48 a partial K-block. Its roundings are the torch ops' and no other: the
    product rounded to bf16 before ·ReLU(pre) (rounding once at the end differs here), and
    ReLU applied (pre alone differs)."""
    g, w, pre = exact_grad_operands(tokens, d, seed=d)
    got = fused_relu2_grad(g, w, pre, blocks=blocks)
    want = grad_reference(g, w, pre)
    assert got.shape == want.shape and got.dtype == BF16
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    once = ((g.float() @ w.T.float()) * 2 * F.relu(pre).float()).to(BF16)
    assert not torch.equal(once.nan_to_num(), got.nan_to_num())
    assert not torch.equal(((g @ w.T) * 2 * pre).nan_to_num(), got.nan_to_num())


def test_the_backward_kernel_on_the_model_s_data_is_within_the_sums_error() -> None:
    """Random g and c_proj as in training (T = 128, d = 128, default blocks: 128 × 128 × 64,
    two K-blocks): at most `MAX_DIFFERING` of ∂pre's values differ from the torch ops' (the
    sums' order: measured 18 of 655,360 over 10 seeds), and every value of each lies within
    the error bound of its fp32 sum and two bf16 roundings of the exact product p (float64):
    |∂pre − 2·r·p| ≤ 2·r·(2⁻⁷·|p| + d·2⁻²⁴·Σ|g||w|)·(1 + 2⁻⁷) with r = ReLU(pre). A kernel
    that read c_proj one row off, or summed half of K, would be far outside it (checked)."""
    gen = torch.Generator().manual_seed(7)
    tokens, d = 128, 128
    g = (torch.randn(tokens, d, generator=gen) * 1e-3).to(BF16)
    w = ((torch.rand(d, 4 * d, generator=gen) - 0.5) * 0.2).to(BF16).T
    pre = torch.randn(tokens, 4 * d, generator=gen).to(BF16)
    got = fused_relu2_grad(g, w, pre)
    want = grad_reference(g, w, pre)
    assert (got != want).float().mean() <= MAX_DIFFERING
    r = F.relu(pre).double()
    exact = g.double() @ w.T.double()
    sums = d * 2**-24 * (g.double().abs() @ w.T.double().abs())  # the fp32 sum's error
    bound = 2 * r * (2**-7 * exact.abs() + sums) * (1 + 2**-7)  # and two roundings of 2⁻⁸

    def within(x: torch.Tensor) -> bool:
        return bool(((x.double() - 2 * r * exact).abs() <= bound).all())

    assert within(got) and within(want)
    assert not within(grad_reference(g, w.roll(1, 0), pre))
    assert not within(grad_reference(g[:, : d // 2], w[:, : d // 2], pre))


def test_available_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors need the interpreter; with it, the kernel can run; without triton, it says
    so, and the module imports all the same (triton is imported where it is used)."""
    assert available("cpu") is None
    monkeypatch.delenv("TRITON_INTERPRET")
    reason = available("cpu")
    assert reason is not None and "TRITON_INTERPRET=1" in reason
    n8 = torch.zeros(16, 16, dtype=E4M3)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        fused_up_relu2(n8, n8, 1.0, 1.0, 1.0)
    bf = torch.zeros(16, 16, dtype=BF16)
    with pytest.raises(RuntimeError, match=r"fused_relu2_grad: .*TRITON_INTERPRET"):
        fused_relu2_grad(bf, bf, bf)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    spec = importlib.util.find_spec("model.triton_mlp")
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh.available("cpu") == "triton is not installed"
