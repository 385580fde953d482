"""record_2026_07_17's training loss (model/record_loss.py, `record_loss_rows`) as one Triton
kernel: the loss and the e5m2 logit gradient G₈ in one launch over the bf16 logits, one program a
row.

With z a row's bf16 logits, A, B, C the cap, shift and divisor (record: 23, 5, 7.5), w the MTP
weights (K of them, S_w their sum), y_k the row's K shifted targets (−1: dropped) and
coef = `gradient_coefficient(A, C, g_s)` = fp32(fp32(1/C)·A)·fp32(1/g_s):

    σ = bf16(½ + ½·tanh(u/2)),  u = (z + B)/C     fp32, rounded to bf16 (nearest, ties even)
    ĉ = A·σ,  lse = logsumexp(ĉ)                    fp32
    loss = Σ_k w_k·(lse − ĉ[y_k])                    the kept terms only
    G₈ = e5m2_satfinite((((S_w·p − Σ_k w_k·1[y_k = j])·coef)·σ)·(1 − σ)),  p = exp(ĉ − lse)

S_w sums all K weights, also in the rows whose terms were dropped (the record's quirk,
model/record_loss.py); S_w and coef are computed by torch, by the same ops as there, and read
by the kernel from device memory (no host synchronisation). satfinite clamps to ±57,344
before rounding to the nearest e5m2; NaN stays NaN.

Each program reads its row twice. A first loop over the vocabulary in blocks keeps a running
maximum m and per-lane sums of exp(ĉ − m), rescaled when m grows (an online logsumexp), so
lse = m + ln(Σ). The picked values ĉ[y_k] are then recomputed from the K logits z[y_k] by the
same function as the row's (the same ops, so the same bits as ĉ at y_k), and the row's loss,
Σ_k over its kept terms, is written to an fp32 buffer that torch sums. A second loop
recomputes σ and ĉ from the logits and writes G₈, its ops in record_loss_rows' order.
Recomputing costs the tanh and exp again but no memory: keeping σ would write and read two
bytes a logit, as much traffic as reading the logits again.

Where it differs from record_loss.py, and why:
- lse: the running maximum and per-lane sums add the exponentials in another order than
  torch.logsumexp (the maximum first, then one sum), so lse can differ in its last bit, and
  p with it by about 2⁻¹⁹ (relative, lse ≈ 30): a G₈ byte changes only where that crosses an
  e5m2 rounding boundary. The loss is summed per row, then over rows, where record_loss.py
  sums all rows' terms at once: an fp32 rounding or so apart.
- exp, tanh and ln are written here from +, ×, fused multiply-add (explicit), correctly
  rounded division, floor and bit operations only, within 0.9, 1.5 and 0.7 ulp: Triton's own
  exp and log are the GPU's approximate ex2 and lg2 (off by tens of ulps where the argument
  is 30), and libdevice's functions cannot run in Triton's interpreter. σ then differs from
  torch's only where the last bit of tanh moves it across a bf16 rounding boundary.
- The kernel is launched without contracting a product and a sum into one fused
  multiply-add (`enable_fp_fusion=False`): torch rounds S_w·p before subtracting the one-hot
  term, and the interpreter (numpy) never contracts, so the interpreter and the compiled
  kernel compute the same fp32 operations.
- u = (z + B)/C is a correctly rounded division, as torch computes it on a CPU; torch on a GPU
  multiplies by fp32(1/C) instead (its kernel for a scalar divisor), so there the reference
  itself can move a σ by a bf16 step.
- bf16 and e5m2 roundings are done on the bits (to nearest, ties to even, as torch's casts;
  NaN to 0x7F with its sign, as torch's e5m2 cast), not by Triton's casts, which the
  interpreter does not round to nearest.
- The maximum and the sums call tl.reduce with triton.language's own combine functions rather
  than tl.max and tl.sum: those are themselves jit functions, decorated when triton.language
  is imported, so they cannot run in the interpreter if Triton was imported before
  TRITON_INTERPRET=1 was set (a test process); the interpreter recognises the combine
  functions and reduces with numpy.

Targets must lie in [0, V) or be −1 (as `gather` requires in record_loss.py; not checked here,
which would need a host synchronisation).
"""

from __future__ import annotations  # the kernel's tl.constexpr: Triton reads it as text

from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from model.config import HeadConfig
from model.record_grad import gradient_coefficient
from model.triton_code import TritonCode, available

if TYPE_CHECKING:
    import triton.language as tl  # bound at run time by _CODE.kernel (no Triton on import)

MAX_BLOCK = 4096  # logits a program handles at once (per loop step)
_CODE = TritonCode(globals())  # the kernel and its device functions (model/triton_code.py)
_device = _CODE.device


def record_loss_rows_triton(
    logits: Tensor,
    shifted: Tensor,
    weights: Tensor,
    cfg: HeadConfig,
    g_s: float,
    block: int | None = None,
) -> tuple[Tensor, Tensor]:
    """`record_loss_rows` in one kernel: (the loss summed over these rows (fp32, 0-d), G₈
    (rows × V, e5m2)) for bf16 logits (rows × V), their shifted targets (rows × K, −1 dropped)
    and the weights (K,). `block`: logits per loop step (a power of two; default: the
    vocabulary's, at most 4,096). RuntimeError where it cannot run (`available`)."""
    if logits.dtype != torch.bfloat16 or logits.dim() != 2:
        raise ValueError(
            f"logits must be bf16 (rows × V), got {logits.dtype} {tuple(logits.shape)}"
        )
    rows, vocab = logits.shape
    k = shifted.size(1)
    if shifted.shape != (rows, k) or weights.shape != (k,):
        raise ValueError(
            f"shifted (rows × K) and weights (K,) must match the logits' {rows} rows, got "
            f"{tuple(shifted.shape)} and {tuple(weights.shape)}"
        )
    cap, shift, divisor = cfg.softcap, cfg.softcap_shift, cfg.softcap_divisor or cfg.softcap / 4
    device = logits.device
    shifted = shifted.to(device=device, dtype=torch.int64)
    weights = weights.to(device=device, dtype=torch.float32)
    if block is None:
        block = min(MAX_BLOCK, 1 << max(vocab - 1, 1).bit_length())
    form = [float(cap), float(shift), float(divisor), float(g_s)]
    return ops().record_loss(logits, shifted, weights, form, block)


def _launch(
    logits: Tensor, shifted: Tensor, weights: Tensor, form: list[float], block: int
) -> tuple[Tensor, Tensor]:
    reason = available(logits.device)
    if reason is not None:
        raise RuntimeError(f"record_loss_rows_triton: {reason}")
    cap, shift, divisor, g_s = form
    rows, vocab = logits.shape
    k = shifted.size(1)
    device = logits.device
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    shifted, weights = shifted.contiguous(), weights.contiguous()
    # S_w and the coefficient by the torch ops record_loss_rows uses, so the same fp32 values;
    # passed as device scalars (no host synchronisation)
    s_w = weights.sum()
    coef = gradient_coefficient(cap, divisor, g_s, device)
    g8 = _outputs(logits)[1]
    row_loss = torch.empty(rows, dtype=torch.float32, device=device)
    if rows and vocab:
        _CODE.kernel("_record_loss_kernel")[(rows,)](
            logits, logits.stride(0), shifted, shifted.stride(0), weights, s_w, coef, row_loss,
            g8.view(torch.uint8), g8.stride(0), vocab, cap, shift, divisor,
            K=k, K_LANES=1 << max(k - 1, 0).bit_length(), BLOCK=block,
            num_warps=8 if block >= 2048 else 4,
            enable_fp_fusion=False,  # a·b + c rounded twice, as torch computes it
        )  # fmt: skip
    return row_loss.sum(), g8


def _outputs(logits: Tensor) -> tuple[Tensor, Tensor]:
    """The loss (0-d) and G₈, empty (also the op's shapes for torch.compile)."""
    total = logits.new_empty((), dtype=torch.float32)
    return total, logits.new_empty(logits.shape, dtype=torch.float8_e5m2)


_OPS: SimpleNamespace | None = None


def ops() -> SimpleNamespace:
    """The kernel as a torch op (`record_loss`), registered at the first call, opaque to
    torch.compile (model/triton_mlp.py's `ops` says why); the model registers it when built."""
    global _OPS
    if _OPS is None:
        op = torch.library.custom_op("gpt_speedrun::record_loss", mutates_args=())(_launch)
        op.register_fake(lambda logits, *_: _outputs(logits))
        _OPS = SimpleNamespace(record_loss=torch.ops.gpt_speedrun.record_loss.default)
    return _OPS


@_device
def _exp32(x):
    """e^x in fp32 within 0.9 ulp: x = k·ln 2 + r (|r| ≤ ln2/2, k·ln 2 subtracted in two
    parts by fused multiply-adds), e^r by its Taylor series to r⁷ (the next term is below
    0.2 ulp), times 2^k built from bits, as two factors so that a subnormal result is
    rounded once. 0 below −104 (e^x < 2⁻¹⁵⁰), inf above 89, NaN stays NaN."""
    x = tl.where(x > 89.0, 89.0, x)
    low = x < -104.0
    x = tl.where(low, -104.0, x)
    k = tl.floor(x * 1.4426950408889634 + 0.5)
    k = tl.where(k != k, 0.0, k)  # NaN: any k, the NaN goes through r
    r = tl.fma(k, -0.693145751953125, x)  # ln 2's leading bits: k·them is exact
    r = tl.fma(k, -1.4286068203094173e-06, r)  # the rest of ln 2
    q = tl.fma(r, 1.0 / 5040.0, 1.0 / 720.0)
    q = tl.fma(q, r, 1.0 / 120.0)
    q = tl.fma(q, r, 1.0 / 24.0)
    q = tl.fma(q, r, 1.0 / 6.0)
    q = tl.fma(q, r, 0.5)
    q = tl.fma(q, r, 1.0)
    p = tl.fma(q, r, 1.0)
    n = k.to(tl.int32)
    half = n >> 1
    s1 = ((half + 127) << 23).to(tl.float32, bitcast=True)
    s2 = ((n - half + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(low, 0.0, p * s1 * s2)


@_device
def _tanh32(v):
    """tanh(v) in fp32 within 1.5 ulp, odd: for |v| < 0.55 its Taylor series to v¹⁹ (the
    next term is below 0.01 ulp), above 1 − 2/(e^{2|v|} + 1) (|v| clamped to 10, where tanh
    is 1 in fp32). Near ±1 the last step rounds 1 − q to fp32's grid there, as a correctly
    rounded tanh does, so ½ + ½·tanh keeps torch's steps of 2⁻²⁵ for small σ."""
    a = tl.abs(v)
    a = tl.where(a > 10.0, 10.0, a)  # a comparison: NaN goes through
    s = a * a
    q = tl.fma(s, -443861162.0 / 1856156927625.0, 6404582.0 / 10854718875.0)
    q = tl.fma(q, s, -929569.0 / 638512875.0)
    q = tl.fma(q, s, 21844.0 / 6081075.0)
    q = tl.fma(q, s, -1382.0 / 155925.0)
    q = tl.fma(q, s, 62.0 / 2835.0)
    q = tl.fma(q, s, -17.0 / 315.0)
    q = tl.fma(q, s, 2.0 / 15.0)
    q = tl.fma(q, s, -1.0 / 3.0)
    small = tl.fma(a * s, q, a)
    big = 1.0 - tl.math.div_rn(tl.full(a.shape, 2.0, tl.float32), _exp32(a + a) + 1.0)
    t = tl.where(a < 0.55, small, big)
    return tl.where(v < 0.0, -t, t)


@_device
def _log32(x):
    """ln x in fp32 within 0.7 ulp for a finite positive normal x (here a sum of
    exponentials, ≥ 1): x = 2^e·m with m in [√½, √2), ln m = 2·atanh(f), f = (m − 1)/(m + 1)
    ≤ 0.172, by its series to f¹³; NaN stays NaN."""
    bits = x.to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127
    m = ((bits & 0x007FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    high = m > 1.4142135623730951
    m = tl.where(high, m * 0.5, m)
    e = tl.where(high, e + 1, e)
    f = tl.math.div_rn(m - 1.0, m + 1.0)
    s = f * f
    q = tl.fma(s, 1.0 / 13.0, 1.0 / 11.0)
    q = tl.fma(q, s, 1.0 / 9.0)
    q = tl.fma(q, s, 1.0 / 7.0)
    q = tl.fma(q, s, 1.0 / 5.0)
    q = tl.fma(q, s, 1.0 / 3.0)
    f2 = f + f
    ln_m = tl.fma(f2 * s, q, f2)
    ef = e.to(tl.float32)
    out = tl.fma(ef, 0.693145751953125, tl.fma(ef, 1.4286068203094173e-06, ln_m))
    return tl.where(x != x, x, out)


@_device
def _sigma(z, shift, divisor):
    """bf16(½ + ½·tanh(u/2)), u = (z + B)/C, as record_loss.capped_sigmoid, returned as
    fp32; the bf16 rounding on the bits (nearest, ties to even; σ ≤ 1 cannot carry into
    the sign)."""
    u = tl.math.div_rn(z + shift, divisor)
    s = _tanh32(u * 0.5) * 0.5 + 0.5
    bits = s.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(s != s, s, rounded.to(tl.float32, bitcast=True))


@_device
def _e5m2_satfinite(g):
    """The e5m2 byte of g clamped to ±57,344, as torch's cast rounds (nearest, ties to
    even): normal values on the bits, subnormal ones (below 2⁻¹⁴) by an fp32 addition of
    2⁷, whose ulp is e5m2's subnormal step 2⁻¹⁶. NaN: 0x7F with its sign, as torch."""
    g = tl.where(g > 57344.0, 57344.0, g)
    g = tl.where(g < -57344.0, -57344.0, g)  # comparisons: NaN goes through
    nan = g != g
    bits = g.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = tl.where(nan, 0, bits & 0x7FFFFFFF)
    odd = (mag >> 21) & 1
    normal = (mag - (112 << 23) + 0xFFFFF + odd) >> 21
    sub = (mag.to(tl.float32, bitcast=True) + 128.0).to(tl.int32, bitcast=True) - 0x43000000
    byte = tl.where(mag < (113 << 23), sub, normal)
    return (tl.where(nan, 0x7F, byte) | sign).to(tl.uint8)


def _loss_cost(grid: object, metadata: object, args: dict) -> dict:
    """The kernel's declared bytes: each row's bf16 logits read twice (the two loops), G₈
    written once (a byte a logit), the targets and the row's loss; no products."""
    rows, vocab = grid[0], args["vocab"]
    return {"bytes": rows * (vocab * (2 + 2 + 1) + args["K"] * 8 + 4)}


_CODE.costs["_record_loss_kernel"] = _loss_cost


@_device
def _record_loss_kernel(
    z_ptr, z_stride, y_ptr, y_stride, w_ptr, s_w_ptr, coef_ptr, loss_ptr, g_ptr, g_stride,
    vocab: tl.constexpr, cap, shift, divisor, K: tl.constexpr, K_LANES: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    # vocab is a constexpr (one per model, no extra compile): a loop bound the interpreter of
    # Triton 3.6 cannot take as a run-time scalar under NumPy 2 (it reads a 1-element array)
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_stride
    y_row = y_ptr + row * y_stride
    g_row = g_ptr + row * g_stride
    lanes = tl.arange(0, BLOCK)
    # Loop 1: running maximum m and per-lane Σ exp(ĉ − m), rescaled when m grows
    m = tl.full((), float("-inf"), tl.float32)
    acc = tl.full((BLOCK,), 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        cols = start + lanes
        inside = cols < vocab
        z = tl.load(z_row + cols, mask=inside, other=0.0).to(tl.float32)
        c = tl.where(inside, _sigma(z, shift, divisor) * cap, float("-inf"))
        m_new = tl.maximum(m, tl.reduce(c, 0, tl.standard._elementwise_max))  # tl.max
        acc = acc * _exp32(m - m_new) + _exp32(c - m_new)
        m = m_new
    lse = m + _log32(tl.reduce(acc, 0, tl.standard._sum_combine))  # tl.sum
    # The loss: ĉ[y_k] from the K logits z[y_k] (as a vector of K_LANES ≥ K lanes), by the same
    # ops as the row's ĉ, so the same bits
    ks = tl.arange(0, K_LANES)
    targets = tl.load(y_row + ks, mask=ks < K, other=-1)
    kept = targets >= 0
    z_k = tl.load(z_row + tl.where(kept, targets, 0), mask=kept, other=0.0).to(tl.float32)
    w_k = tl.load(w_ptr + ks, mask=kept, other=0.0)
    terms = (lse - _sigma(z_k, shift, divisor) * cap) * w_k
    loss = tl.reduce(terms, 0, tl.standard._sum_combine)
    tl.store(loss_ptr + row, loss)
    # Loop 2: G₈, in record_loss_rows' order
    s_w = tl.load(s_w_ptr)
    coef = tl.load(coef_ptr)
    for start in range(0, vocab, BLOCK):
        cols = start + lanes
        inside = cols < vocab
        z = tl.load(z_row + cols, mask=inside, other=0.0).to(tl.float32)
        sig = _sigma(z, shift, divisor)
        onehot = tl.full((BLOCK,), 0.0, tl.float32)
        for k in tl.static_range(K):  # Σ_k w_k·1[y_k = j] in k's order, as scatter_add_
            target = tl.load(y_row + k)
            weight = tl.where(target >= 0, tl.load(w_ptr + k), 0.0)
            onehot += tl.where(cols == target, weight, 0.0)
        g = _exp32(sig * cap - lse) * s_w - onehot
        g = g * coef * sig * (1.0 - sig)
        tl.store(g_row + cols, _e5m2_satfinite(g), mask=inside)
