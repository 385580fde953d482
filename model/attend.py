"""softmax(scale·q·kᵀ + mask)·v, by the kernel the mask calls for: SDPA (causal, or a dense mask),
FlexAttention (a block mask; a YaRN scale that changes during a run enters through a
score_mod), or the varlen flash kernel (segments, model/varlen.py). Outside a compiled model on
CUDA, FlexAttention is compiled on its own: uncompiled, it would materialise every score."""

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from model.masks import Mask
from model.varlen import Segments, attend_varlen


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Mask | None, scale: float | Tensor | None
) -> Tensor:
    """softmax(scale·q·kᵀ)·v over (B, H, T, D) tensors, causal or under `mask`. A 0-d tensor
    `scale` (YaRN's, which changes during a run) stays a tensor up to FlexAttention, through a
    score_mod, so a compiled model neither syncs nor recompiles. SDPA takes only a float
    scale, so there the tensor multiplies q: the bf16 q times the fp32 scale, rounded once to
    q's dtype (one more rounding than the kernel's own scaling, none that a host sync or a
    graph break would cost; the scale itself is not rounded to bf16 first). Varlen segments
    (model/varlen.py) go to the varlen kernel, with a Python float scale."""
    if isinstance(mask, Segments):  # model.attention.impl=varlen: scale is a Python float
        return attend_varlen(q, k, v, mask, scale)
    if isinstance(scale, Tensor) and (mask is None or isinstance(mask, Tensor)):
        q, scale = q * scale.to(torch.promote_types(q.dtype, torch.float32)), 1.0
    elif isinstance(scale, Tensor):
        # The kernel's scores are fp32, and a float scale enters it as fp32: so does this one.
        # A float64 scale (YaRN's table is float64) would promote the scores, the running
        # softmax state and the accumulator to float64, which Triton's flex kernel refuses.
        s = scale.to(torch.float32)

        def scaled(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return score * s

        return _flex(q)(q, k, v, block_mask=mask, scale=1.0, score_mod=scaled)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if isinstance(mask, Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return _flex(q)(q, k, v, block_mask=mask, scale=scale)


# Graphs the standalone FlexAttention may compile: one per shape, mask kind and score_mod, so
# record #89 eager needs about 4 per stage (long, short, paired long, paired short) and 4 more
# per evaluation length. Past dynamo's default of 8 it would fall back, silently, to the eager
# kernel that materialises every score: 48 GiB more at stage 2 on an H200, out of memory.
FLEX_RECOMPILES = 64


@functools.cache
def _flex_compiled() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return compiled_alone(flex_attention, FLEX_RECOMPILES)


def compiled_alone(fn: Callable, recompiles: int, backend: str | Callable = "inductor") -> Callable:
    """`fn` compiled on its own (static shapes), allowed `recompiles` graphs, and failing
    (fullgraph) rather than running uncompiled once it would need more."""
    compiled = torch.compile(fn, dynamic=False, fullgraph=True, backend=backend)

    def call(*args, **kwargs):
        # dynamo reads the limit at each cache miss: patched around the call, it is this
        # function's alone (a global setting would change the model's own compile)
        with torch._dynamo.config.patch(recompile_limit=recompiles):
            return compiled(*args, **kwargs)

    return call


def _flex(q: Tensor) -> Callable:
    """FlexAttention as it should run here. Inside a compiled model it is traced with it. On
    CUDA outside one it is compiled on its own: uncompiled, it materialises the whole score
    matrix (~58 GB per layer at 49,152 tokens). Elsewhere (CPU tests) the plain function."""
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type == "cuda" and not torch.compiler.is_compiling():
        return _flex_compiled()
    if q.device.type == "cpu" and torch.is_grad_enabled() and q.requires_grad:
        raise ValueError(
            "model.attention.impl=flex can't train on a CPU (FlexAttention has no CPU backward "
            "in this torch); use model.attention.impl=auto or sdpa there"
        )
    return flex_attention
