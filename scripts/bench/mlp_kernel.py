"""Benchmark record_2026_07_17's FP8 up projection and ReLU², and their backward's ∂pre: the torch
path against the Triton kernels.

From the same n₈ and c_fc₈ (model/mlp_fp8.py's quantisation of an RMS-normed n, T×d bf16,
and of c_fc ~ U(±√3/√d), 4d×d), each computes pre, post, post₈ and the layer's max post:

- torch: `scaled_mm` (model/fp8.py: torch._scaled_mm, fp32 accumulation), then mlp_fp8.py's
  F.relu(pre).square(), the e4m3 cast of min(post/s_act, 448) and post.amax(), as separate
  passes, eager and under torch.compile (as the trainer compiles: emulate_precision_casts);
- triton: `fused_up_relu2` (model/triton_mlp.py: one launch) and the amax of its tile maxima.

s_act is the delayed scale a step later would use, 1.8·m/448 with m eager torch's max post.
record_2026_07_17's shape per rank by default: T = 16,384 tokens, d = 768, 4d = 3,072. Prints each
one's milliseconds (medians of --reps, repetitions interleaved, each the mean of --inner calls),
the fused kernel's TFLOP/s, the ratio triton/torch, `torch._scaled_mm` alone for scale, and
whether they agree (tests/unit/test_triton_mlp.py's bounds, exit status 1 past them): pre
within one bf16 step on at most 10⁻³ of its values (the GEMMs sum in other orders; on Hopper
they also differ in how often they promote the tensor cores' partial sums to fp32), post, post₈
and the maximum equal to what torch's ops give from the kernel's own pre, bit for bit.

The backward's ∂pre = 2·(g·c_projᵀ)·ReLU(pre) (mlp_fp8.py's backward) from the kernel's pre, a
random g (T×d) and c_proj ~ U(±√3/√4d) (d×4d, (out, in)): torch's bf16 GEMM then ·2·ReLU(pre),
eager and compiled, against `fused_relu2_grad` (one launch); they agree where at most 10⁻³ of
∂pre differs and every value of both lies within the fp32 sums' error and two bf16 roundings
of the float64 product (tests/unit/test_triton_mlp.py's bound).

    python scripts/bench/mlp_kernel.py                      # 16,384 × 768 → 3,072
    python scripts/bench/mlp_kernel.py --blocks 128 256 128 --warps 8 --stages 3

Needs a CUDA GPU with FP8 (sm_89 or later). `--device cpu` under TRITON_INTERPRET=1 runs the
same code at a toy size (`--tokens 64 --d 32 --reps 1 --inner 1 --no-compile`): the script's
own check before a GPU session, whose times mean nothing (the kernels' correctness on a CPU is
tests/unit/test_triton_mlp.py's).
"""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from model.fp8 import scaled_mm
from model.mlp_fp8 import E4M3_MAX, _e4m3, amax_scale, bf16_scale
from model.triton_mlp import (
    BLOCKS,
    NUM_STAGES,
    NUM_WARPS,
    fused_relu2_grad,
    fused_up_relu2,
)
from scripts.bench.kernel_timing import device_name, interleaved_ms, kernel_device

MAX_DIFFERING = 1e-3  # as tests/unit/test_triton_mlp.py: the share of pre that may differ
ACT_HEADROOM = 1.8  # mlp.fp8_act_headroom: s_act = 1.8·m/448

Outputs = tuple[Tensor, Tensor, Tensor, Tensor]  # pre, post, post₈, max post


def operands(tokens: int, d: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(n₈ (T×d), c_fc₈ᵀ (d×4d, a transposed view of a row-major 4d×d), a/448, s_up) by
    mlp_fp8.py's forward's ops."""
    gen = torch.Generator(device).manual_seed(0)
    x = torch.randn(tokens, d, generator=gen, device=device)
    n = (x / x.square().mean(-1, keepdim=True).sqrt()).bfloat16()
    bound = 3**0.5 / d**0.5
    c_fc = ((torch.rand(4 * d, d, generator=gen, device=device) * 2 - 1) * bound).bfloat16()
    a = n.abs().amax().float()
    n8 = _e4m3(n.float() * E4M3_MAX / a)
    s_up = bf16_scale(c_fc.abs().amax())
    fc8_t = _e4m3(c_fc.T.float() / s_up)  # strides (1, d): c_fc₈ row-major, as _scaled_mm takes
    return n8, fc8_t, a / E4M3_MAX, s_up


def torch_path(n8: Tensor, fc8_t: Tensor, a_scale: Tensor, s_up: Tensor, s_act: Tensor) -> Outputs:
    """mlp_fp8.py's forward from n₈ to post₈ and the max post."""
    pre = scaled_mm(n8, fc8_t, a_scale, s_up, torch.bfloat16)
    post = F.relu(pre).square()
    post8 = _e4m3(post.float() / s_act, E4M3_MAX)
    return pre, post, post8, post.amax()


def epilogue(pre: Tensor, s_act: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """post, post₈ and max post from pre by torch's ops (torch_path's)."""
    post = F.relu(pre).square()
    return post, _e4m3(post.float() / s_act, E4M3_MAX), post.amax()


def same(a: Tensor, b: Tensor) -> bool:
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


def agreement(name: str, got: Outputs, want: Outputs, s_act: Tensor) -> bool:
    """Prints how `got` differs from `want` (eager torch's) and whether its post, post₈ and max
    are torch's from its own pre; whether within the bounds."""
    pre, post, post8, top = got
    differs = int((pre.view(torch.int16) != want[0].view(torch.int16)).sum())
    steps = int((pre.view(torch.int16).int() - want[0].view(torch.int16).int()).abs().max())
    own = epilogue(pre, s_act)
    consistent = same(post, own[0]) and same(post8, own[1]) and same(top.float(), own[2].float())
    rows = pre.view(torch.int16).eq(want[0].view(torch.int16)).all(dim=1)
    post8_differs = int((post8[rows].view(torch.uint8) != want[2][rows].view(torch.uint8)).sum())
    ok = differs <= MAX_DIFFERING * pre.numel() and steps <= 1 and consistent
    print(
        f"{name} vs eager torch: pre differs in {differs:,} of {pre.numel():,} "
        f"({differs / pre.numel():.1e}), by at most {steps} bf16 step(s); max post "
        f"{top.item():.6g} vs {want[3].item():.6g}; post₈ bytes differing in rows of equal pre: "
        f"{post8_differs}; post, post₈, max from its own pre by torch's ops: "
        f"{'the same bits' if consistent else 'DIFFERENT'} | {'agree' if ok else 'DISAGREE'}"
    )
    return ok


def grad_torch(g: Tensor, proj_t: Tensor, pre: Tensor) -> Tensor:
    """mlp_fp8.py's backward's ∂pre (proj_t: c_proj as (4d, d))."""
    return (g @ proj_t.T).mul_(2).mul_(F.relu(pre))


def grad_agreement(name: str, got: Tensor, want: Tensor, g: Tensor, proj_t: Tensor, pre: Tensor):
    """Prints how ∂pre `got` differs from eager torch's and whether both lie within the sums'
    error bound of the float64 product; whether within the bounds."""
    differs = int((got != want).sum())
    r = F.relu(pre).double()
    exact = g.double() @ proj_t.T.double()
    sums = g.size(1) * 2**-24 * (g.double().abs() @ proj_t.T.double().abs())
    bound = 2 * r * (2**-7 * exact.abs() + sums) * (1 + 2**-7)
    inside = [bool(((x.double() - 2 * r * exact).abs() <= bound).all()) for x in (got, want)]
    ok = differs <= MAX_DIFFERING * got.numel() and all(inside)
    print(
        f"∂pre {name} vs eager torch: differs in {differs:,} of {got.numel():,} "
        f"({differs / got.numel():.1e}); within the sums' bound: {name} {inside[0]}, torch "
        f"{inside[1]} | {'agree' if ok else 'DISAGREE'}"
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16384, help="T, tokens per rank")
    parser.add_argument("--d", type=int, default=768, help="model width (the MLP's 4d wide)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--inner", type=int, default=10, help="calls per timed repetition")
    parser.add_argument(
        "--blocks", type=int, nargs=3, default=list(BLOCKS), metavar=("M", "N", "K"),
        help="the kernel's tile (rows, columns) and K-block",
    )  # fmt: skip
    parser.add_argument("--warps", type=int, default=NUM_WARPS)
    parser.add_argument("--stages", type=int, default=NUM_STAGES)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile's form")
    parser.add_argument("--device", default="cuda", help="cpu: a toy check, interpreted")
    args = parser.parse_args()
    device = kernel_device("mlp_kernel.py", args.device, "tests/unit/test_triton_mlp.py")
    n8, fc8_t, a_scale, s_up = operands(args.tokens, args.d, device)
    w8 = fc8_t.T  # c_fc₈ (4d×d, row-major)
    first = torch_path(n8, fc8_t, a_scale, s_up, torch.ones((), device=device))
    s_act = amax_scale(first[3], ACT_HEADROOM)  # the next step's delayed scale
    blocks = tuple(args.blocks)

    def triton_path() -> Outputs:
        pre, post, post8, tiles = fused_up_relu2(
            n8, w8, a_scale, s_up, s_act, blocks, args.warps, args.stages
        )
        return pre, post, post8, tiles.amax()

    fns: dict[str, Callable[[], object]] = {
        "torch eager": lambda: torch_path(n8, fc8_t, a_scale, s_up, s_act),
        "triton": triton_path,
        "_scaled_mm alone": lambda: scaled_mm(n8, fc8_t, a_scale, s_up, torch.bfloat16),
    }
    if not args.no_compile:
        # as trainer/launch/compile.py compiles the model: bf16 roundings kept (without, inductor
        # divides and takes the max of the unrounded fp32 squares: other post₈ and max)
        compiled = torch.compile(torch_path, options={"emulate_precision_casts": True})
        fns["torch compiled"] = lambda: compiled(n8, fc8_t, a_scale, s_up, s_act)
    results = {name: fn() for name, fn in fns.items()}  # compiles, warms caches
    ms = interleaved_ms(fns, args.reps, args.inner, device)
    width = 4 * args.d
    tflops = 2 * args.tokens * width * args.d / (ms["triton"] * 1e-3) / 1e12
    print(
        f"{device_name(device)}: T = {args.tokens:,}, d = {args.d}, 4d = {width:,}; "
        f"tile {blocks}, {args.warps} warps, {args.stages} stages; s_act = {s_act.item():.4g}; "
        f"medians of {args.reps} × {args.inner} calls"
    )
    print(" | ".join(f"{name} {t:.3f} ms" for name, t in ms.items()))
    print(f"triton: {tflops:.0f} TFLOP/s (FP8 GEMM FLOPs only)")
    for name in ("torch eager", "torch compiled"):
        if name in ms:
            print(f"triton / {name}: {ms['triton'] / ms[name]:.2f}")
    want = results["torch eager"]
    ok = agreement("triton", results["triton"], want, s_act)
    if "torch compiled" in results:
        agreement("torch compiled", results["torch compiled"], want, s_act)

    # The backward's ∂pre, from the kernel's pre
    gen = torch.Generator(device).manual_seed(1)
    pre = results["triton"][0]
    g = torch.randn(args.tokens, args.d, generator=gen, device=device).bfloat16()
    bound = 3**0.5 / width**0.5
    c_proj = (torch.rand(args.d, width, generator=gen, device=device) * 2 - 1) * bound
    proj_t = c_proj.bfloat16().T  # (4d, d): the (out, in) c_proj's view, as the backward's
    grad_fns: dict[str, Callable[[], object]] = {
        "torch eager": lambda: grad_torch(g, proj_t, pre),
        "triton": lambda: fused_relu2_grad(g, proj_t, pre),
        "bf16 GEMM alone": lambda: g @ proj_t.T,
    }
    if not args.no_compile:
        compiled_grad = torch.compile(grad_torch, options={"emulate_precision_casts": True})
        grad_fns["torch compiled"] = lambda: compiled_grad(g, proj_t, pre)
    grads = {name: fn() for name, fn in grad_fns.items()}
    grad_ms = interleaved_ms(grad_fns, args.reps, args.inner, device)
    print("∂pre: " + " | ".join(f"{name} {t:.3f} ms" for name, t in grad_ms.items()))
    for name in ("torch eager", "torch compiled"):
        if name in grad_ms:
            print(f"∂pre triton / {name}: {grad_ms['triton'] / grad_ms[name]:.2f}")
    ok = grad_agreement("triton", grads["triton"], grads["torch eager"], g, proj_t, pre) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
