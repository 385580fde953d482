"""Record D's training loss (model/record_loss.py, `record_loss_rows`) as one Triton kernel: the
loss and the e5m2 logit gradient G₈ in one launch over the bf16 logits, one program a row.

With z a row's bf16 logits, A, B, C the cap, shift and divisor (record: 23, 5, 7.5), w the MTP
weights (K of them, S_w their sum), y_k the row's K shifted targets (−1: dropped) and
coef = `gradient_coefficient(A, C, g_s)` = fp32(fp32(1/C)·A)·fp32(1/g_s):

    σ = bf16(½ + ½·tanh(u/2)),  u = (z + B)/C     fp32, rounded to bf16 (nearest, ties even)
    ĉ = A·σ,  lse = logsumexp(ĉ)                    fp32
    loss = Σ_k w_k·(lse − ĉ[y_k])                    the kept terms only
    G₈ = e5m2_satfinite((((S_w·p − Σ_k w_k·1[y_k = j])·coef)·σ)·(1 − σ)),  p = exp(ĉ − lse)

S_w sums all K weights, also in the rows whose terms were dropped (the record's quirk,
model/record_loss.py). satfinite clamps to ±57,344 before rounding to the nearest e5m2, NaN
stays NaN. Each program reads its row twice: a first loop over the vocabulary in blocks keeps
a running maximum m and per-lane sums of exp(ĉ − m), rescaled when m grows (an online
logsumexp), so lse = m + log(Σ); a second loop recomputes σ and ĉ from the logits (cheaper
than storing them: two bytes a logit either way, and the row is read, not written) and writes
G₈. The picked values ĉ[y_k] are recomputed from the single logits z[y_k] by the same function
as the row's, so they are the same bits as the row's ĉ at y_k. Each row's loss goes to an fp32
buffer, summed by torch.

Where it differs from record_loss.py, and why:
- lse: the running maximum and per-lane sums add the exponentials in another order than
  torch.logsumexp (maximum first, then one sum), so lse can differ in its last bit; p then
  moves by about 2⁻¹⁹ (relative, for lse ≈ 30), which crosses an e5m2 rounding boundary for
  about one logit in 10⁵ of such a row. The loss is summed per row (Σ_k in k's order), then
  over rows by torch, where record_loss.py sums all rows' terms at once: an fp32 rounding
  apart.
- exp, tanh and log: written here from +, ×, fused multiply-add, correctly rounded division
  and bit operations only (below), not taken from the GPU's approximate instructions
  (Triton's exp and log are ex2.approx and lg2.approx, off by up to tens of ulps where the
  argument is 30) nor from libdevice (which the Triton interpreter cannot run). They are
  within about one ulp of torch's, so σ differs from torch's only where tanh's last bit
  moves σ across a bf16 rounding boundary (about once in 2¹⁶ such cases). The same
  arithmetic runs in the interpreter (numpy, in fp32) and compiled on a GPU, the kernel is
  launched without contracting a product and a sum into one fused multiply-add (they would
  round once instead of twice), so the unit test's bound measured in the interpreter holds
  on a GPU.
- u = (z + B)/C is a correctly rounded division, as torch computes it on a CPU; torch on a
  GPU multiplies by fp32(1/C) instead (its kernel for a scalar divisor), so there the
  reference itself moves a few σ by a bf16 step.
- bf16 and e5m2 roundings are done on the bits (round to nearest, ties to even, as torch's
  casts do) rather than by Triton's casts, which the interpreter does not round to nearest.

Targets must lie in [0, V) or be −1 (as `gather` requires in record_loss.py; not checked here,
which would need a host synchronisation).
"""

from __future__ import annotations  # the kernel's tl.constexpr: Triton reads it as text

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from model.config import HeadConfig
from model.record_loss import gradient_coefficient

if TYPE_CHECKING:
    import triton.language as tl  # bound at run time by _kernel (importing this needs no Triton)

E5M2_MAX = 57344.0  # the largest finite e5m2 value: satfinite clamps to it
MAX_BLOCK = 4096  # logits a program handles at once (per loop step)
_DEVICE: dict[str, Callable] = {}  # the kernel and its device functions, undecorated (_device)


def available(device: torch.device | str | None = None) -> str | None:
    """Why `record_loss_rows_triton` cannot run here (on `device`, default: CUDA if present),
    None when it can: it needs Triton, and a CUDA device or, for CPU tensors, Triton's
    interpreter (TRITON_INTERPRET=1)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if _interpreting():
        return None
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    if kind != "cuda":
        return (
            f"{kind} tensors need Triton's interpreter (TRITON_INTERPRET=1); compiled, the "
            "kernel runs on CUDA"
        )
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return None


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
    vocabulary's, at most 4,096)."""
    reason = available(logits.device)
    if reason is not None:
        raise RuntimeError(f"record_loss_rows_triton: {reason}")
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
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    shifted = shifted.to(device=device, dtype=torch.int64).contiguous()
    weights = weights.to(device=device, dtype=torch.float32).contiguous()
    # S_w and the coefficient by the torch ops record_loss_rows uses, so the same fp32 values;
    # passed as device scalars (no host synchronisation)
    s_w = weights.sum()
    coef = gradient_coefficient(cap, divisor, g_s, device)
    g8 = torch.empty((rows, vocab), dtype=torch.float8_e5m2, device=device)
    row_loss = torch.empty(rows, dtype=torch.float32, device=device)
    if block is None:
        block = min(MAX_BLOCK, 1 << max(vocab - 1, 1).bit_length())
    if rows and vocab:
        _kernel(_interpreting())[(rows,)](
            logits, logits.stride(0), shifted, shifted.stride(0), weights, s_w, coef, row_loss,
            g8.view(torch.uint8), g8.stride(0), vocab, float(cap), float(shift), float(divisor),
            K=k, BLOCK=block, num_warps=8 if block >= 2048 else 4,
            enable_fp_fusion=False,  # a·b + c rounded twice, as torch computes it
        )  # fmt: skip
    return row_loss.sum(), g8


def _interpreting() -> bool:
    """TRITON_INTERPRET as Triton reads it when a kernel is decorated."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def _device(fn: Callable) -> Callable:
    """Marks `fn` as Triton code, decorated with triton.jit when the kernel is built."""
    _DEVICE[fn.__name__] = fn
    return fn


@functools.cache
def _jitted(interpret: bool) -> dict[str, Callable]:
    """The kernel and its device functions decorated, once per mode (`interpret`: the cache's
    key; Triton reads TRITON_INTERPRET when it decorates)."""
    import triton

    return {name: triton.jit(fn) for name, fn in _DEVICE.items()}


def _kernel(interpret: bool) -> Callable:
    """The kernel for this mode. Triton, compiled or interpreted, looks the functions a kernel
    calls (and triton.language) up among its module's globals, so they are bound there, to
    this mode's decorated functions, before each launch."""
    global tl
    import triton.language as tl

    jitted = _jitted(interpret)
    globals().update(jitted)
    return jitted["_record_loss_kernel"]


@_device
def _exp32(x):
    """e^x in fp32 within about an ulp: x = k·ln 2 + r (|r| ≤ ln2/2, k·ln 2 subtracted in
    two parts by fused multiply-adds), e^r by its Taylor series to r⁷ (the next term is
    below 0.2 ulp), times 2^k built from bits, as two factors so that a subnormal result
    is rounded once. 0 below −104 (e^x < 2⁻¹⁵⁰), inf above 89, NaN stays NaN."""
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
    """tanh(v) in fp32 within about an ulp, odd: for |v| < 0.55 its Taylor series to v¹⁹
    (the next term is below 0.01 ulp), above 1 − 2/(e^{2|v|} + 1) (|v| clamped to 10,
    where tanh is 1 in fp32)."""
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
    """ln x in fp32 for a positive normal x (the sums of exponentials, ≥ 1), within about
    an ulp: x = 2^e·m with m in [√½, √2), ln m = 2·atanh(f), f = (m − 1)/(m + 1) ≤ 0.172,
    by its series to f¹³; NaN stays NaN."""
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


@_device
def _record_loss_kernel(
    z_ptr, z_stride, y_ptr, y_stride, w_ptr, s_w_ptr, coef_ptr, loss_ptr, g_ptr, g_stride,
    vocab, cap, shift, divisor, K: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_stride
    y_row = y_ptr + row * y_stride
    g_row = g_ptr + row * g_stride
    lanes = tl.arange(0, BLOCK)
    # Loop 1: running maximum m and per-lane Σ exp(ĉ − m), rescaled when m grows
    m = tl.full((), float("-inf"), tl.float32)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, vocab, BLOCK):
        cols = start + lanes
        inside = cols < vocab
        z = tl.load(z_row + cols, mask=inside, other=0.0).to(tl.float32)
        c = tl.where(inside, _sigma(z, shift, divisor) * cap, float("-inf"))
        m_new = tl.maximum(m, tl.max(c, axis=0))
        acc = acc * _exp32(m - m_new) + _exp32(c - m_new)
        m = m_new
    lse = m + _log32(tl.sum(acc, axis=0))
    # The loss: ĉ[y_k] from the one logit, by the same ops as the row's ĉ
    loss = tl.zeros((), tl.float32)
    for k in tl.static_range(K):
        target = tl.load(y_row + k)
        kept = target >= 0
        z_k = tl.load(z_row + tl.where(kept, target, 0)).to(tl.float32)
        picked = _sigma(z_k, shift, divisor) * cap
        loss += (lse - picked) * tl.where(kept, tl.load(w_ptr + k), 0.0)
    tl.store(loss_ptr + row, loss)
    # Loop 2: G₈, in record_loss_rows' order
    s_w = tl.load(s_w_ptr)
    coef = tl.load(coef_ptr)
    for start in range(0, vocab, BLOCK):
        cols = start + lanes
        inside = cols < vocab
        z = tl.load(z_row + cols, mask=inside, other=0.0).to(tl.float32)
        sig = _sigma(z, shift, divisor)
        onehot = tl.zeros((BLOCK,), tl.float32)
        for k in tl.static_range(K):  # Σ_k w_k·1[y_k = j] in k's order, as scatter_add_
            y_k = tl.load(y_row + k)
            w_k = tl.where(y_k >= 0, tl.load(w_ptr + k), 0.0)
            onehot += tl.where(cols == y_k, w_k, 0.0)
        g = _exp32(sig * cap - lse) * s_w - onehot
        g = g * coef * sig * (1.0 - sig)
        tl.store(g_row + cols, _e5m2_satfinite(g), mask=inside)
