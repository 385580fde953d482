"""Causal self-attention, with the records' options on its values, weights and mask.

For input u (already RMS-normalised), per head of size D:

    q, k, v = u·W_qᵀ, u·W_kᵀ, u·W_vᵀ      (or slices 0, 1, 2 of one merged 3×d×d weight, or of
                                           the 2025-11 record's 4×d×d W_q, W_k, W_v, W_o)
    v <- (1−λ)·v + λ·v₁                    value residual: v₁ = block 0's raw v, λ fixed or learned
    v <- α·v + β·ve                        value embeddings: ve = VE_t[tokens] in layers with a
                                           table, v <- α·v in the other attention layers
    q, k <- rotary(RMSNorm(q)), rotary(RMSNorm(k))   QK-norm (unless model.qk_norm=false), rotary
    y = softmax(scale·q·kᵀ + mask)·v       scale 1/√D, or model.attn_scale (0.12 in 2025-01),
                                           or YaRN's scale of the stage (model/yarn.py)
    y_h <- y_h·σ(u[:k]·G[h]ᵀ)               sparse output gate per head (model.attn_gate)
    out = y·W_oᵀ                            heads concatenated in order

The mask is causal, or the document / sliding-window rule of `model/masks.py`.

QK-clip (`optim/qk_clip.py`) needs each head's largest logit scale·q·kᵀ over a step: with
`track_max_logit` on, each training forward folds it into `max_logit` (see `max_logits`).
"""

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig
from model.layers import linear, rms_norm
from model.masks import Mask
from model.plan import LayerSpec
from model.rotary import Rotary
from model.scalars import ScalarLayout


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Mask | None, scale: float | Tensor | None
) -> Tensor:
    """softmax(scale·q·kᵀ)·v over (B, H, T, D) tensors, causal or under `mask`. A 0-d tensor
    `scale` (YaRN's, which changes during a run) stays a tensor up to FlexAttention, through a
    score_mod, so a compiled model neither syncs nor recompiles. SDPA takes only a float
    scale, so there the tensor multiplies q (in q's dtype: one more rounding in bf16, none
    that a host sync or a graph break would cost)."""
    if isinstance(scale, Tensor) and (mask is None or isinstance(mask, Tensor)):
        q, scale = q * scale.to(q.dtype), 1.0
    elif isinstance(scale, Tensor):
        s = scale

        def scaled(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return score * s

        return _flex(q)(q, k, v, block_mask=mask, scale=1.0, score_mod=scaled)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if isinstance(mask, Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return _flex(q)(q, k, v, block_mask=mask, scale=scale)


@functools.cache
def _flex_compiled() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex(q: Tensor) -> Callable:
    """FlexAttention as it should run here. Inside a compiled model it is traced with it. On
    CUDA outside one it is compiled on its own: uncompiled, it materialises the whole score
    matrix (~58 GB per layer at 49,152 tokens). Elsewhere (CPU tests) the plain function."""
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type == "cuda" and not torch.compiler.is_compiling():
        return _flex_compiled()
    if q.device.type == "cpu" and torch.is_grad_enabled() and q.requires_grad:
        raise ValueError(
            "model.attention_impl=flex can't train on a CPU (FlexAttention has no CPU backward "
            "in this torch); use model.attention_impl=auto or sdpa there"
        )
    return flex_attention


# Query rows per chunk are chosen so that one chunk's logits hold at most this many values
# (256 MiB in fp32): tracking needs bounded memory whatever the sequence length.
TRACK_CHUNK = 2**26


def allowed_keys(
    mask: Mask | None, start: int, stop: int, lo: int, hi: int, device: torch.device
) -> Tensor:
    """Where queries [start, stop) may attend to keys [lo, hi) under `mask`, as a boolean tensor
    that broadcasts against (B, H, stop − start, hi − lo) logits."""
    if mask is None:
        rows = torch.arange(start, stop, device=device)[:, None]
        return rows >= torch.arange(lo, hi, device=device)[None, :]
    if isinstance(mask, Tensor):
        part = mask[..., start:stop, lo:hi]
        # An additive float mask forbids its −inf entries; a finite bias is not part of q·kᵀ.
        return part if part.dtype == torch.bool else part > float("-inf")
    from torch.nn.attention.flex_attention import create_mask

    def shifted(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return mask.mask_mod(b, h, q + start, kv + lo)

    B, H = mask.shape[:2]
    return create_mask(shifted, B, H, stop - start, hi - lo, device=device)


@torch.no_grad()
def max_logits(q: Tensor, k: Tensor, mask: Mask | None, scale: float | None) -> Tensor:
    """Per head, the largest scale·q·kᵀ over the batch and every (query, key) pair that `mask`
    allows, as `attend` computes it (q, k: (B, H, T, D); scale None = 1/√D), in fp32.

    Queries go in chunks of TRACK_CHUNK logits; each chunk multiplies only the band of keys
    its mask allows anywhere (causal: keys up to its last query; a window: the window), so a
    short window costs its band rather than the whole causal triangle.
    """
    B, H, T, D = q.shape
    scale = scale if scale is not None else D**-0.5
    rows = max(1, TRACK_CHUNK // (B * H * T))
    starts = range(0, T, rows)
    if mask is None:
        bands = [(0, min(s + rows, T)) for s in starts]
    else:
        # Every chunk's first and last allowed key first, then one host sync for all of them.
        ends = []
        for s in starts:
            seen = allowed_keys(mask, s, min(s + rows, T), 0, T, q.device).flatten(0, -2).any(0)
            ends += [seen.int().argmax(), T - seen.flip(0).int().argmax()]
        flat = torch.stack(ends).tolist()
        bands = list(zip(flat[::2], flat[1::2], strict=True))
    best = torch.full((H,), float("-inf"), dtype=torch.float32, device=q.device)
    with torch.autocast(q.device.type, enabled=False):  # fp32 logits, as attention's accumulators
        q, k = q.float(), k.float()
        for s, (lo, hi) in zip(starts, bands, strict=True):
            stop = min(s + rows, T)
            logits = q[:, :, s:stop] @ k[:, :, lo:hi].transpose(-1, -2) * scale
            ok = allowed_keys(mask, s, stop, lo, hi, q.device)
            logits.masked_fill_(~ok, float("-inf"))
            best = torch.maximum(best, logits.amax(dim=(0, 2, 3)))
    return best


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: LayerSpec, layer: int) -> None:
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.scale = cfg.attn_scale or None  # None: SDPA's own 1/√D
        self.qk_norm = cfg.qk_norm
        self._fold: Callable | None = None  # set while QK-clip tracks (`track_max_logit`)
        # A plain attribute, not a buffer: DDP broadcasts buffers from rank 0 before every
        # forward, which would overwrite each rank's maxima between micro-batches.
        self.max_logit: Tensor | None = None  # (n_head,) fp32, the running max per head
        self.window = spec.window
        self.value_embed = spec.value_embed
        self.value_residual = cfg.value_residual
        self.layer = layer  # its place in the packed scalars
        d = cfg.n_embd
        if cfg.merged_qkvo:
            # The record's 768 × 3,072 parameter read in memory order as four (out, in)
            # matrices is this (4, d, d) stack: the same memory, and Muon/NorMuon treat each
            # slice as its own matrix, as the record does.
            self.qkvo = nn.Parameter(torch.empty(4, d, d))
            self.qkvo.role = "matrix"  # type: ignore[attr-defined]  # a hidden matrix per slice
        elif cfg.merged_qkv:
            self.qkv = nn.Parameter(torch.empty(3, d, d))
            self.qkv.role = "matrix"  # type: ignore[attr-defined]  # a hidden matrix per slice
        else:
            self.q, self.k, self.v = linear(cfg, d, d), linear(cfg, d, d), linear(cfg, d, d)
        if not cfg.merged_qkvo:
            self.o = linear(cfg, d, d)
        if cfg.value_residual == "learned":
            self.value_lambda = nn.Parameter(torch.tensor(cfg.value_residual_lambda))
        self.fixed_lambda = cfg.value_residual_lambda
        self.has_value_mix = bool(cfg.value_embeds)
        if cfg.value_embeds and not cfg.packed_scalars:
            self.value_mix = nn.Parameter(torch.tensor([0.5, 0.5]))  # (α, β)
        self.gate_channels = cfg.gate_channels
        if cfg.attn_gate:  # (heads × k), an nn.Linear as the record's (bf16 in a bf16 model)
            self.gate = linear(cfg, cfg.gate_channels, cfg.n_head)

    def reset_max_logit(self) -> None:
        """Forget the tracked maxima (QK-clip's interface, optim/qk_clip.py)."""
        device = next(self.parameters()).device
        self.max_logit = torch.full(
            (self.n_head,), float("-inf"), dtype=torch.float32, device=device
        )

    @torch.no_grad()
    def scale_qk(self, factors: Tensor) -> None:
        """Multiply head h's rows of W_q and of W_k by factors[h] (QK-clip's interface), in
        the rows this rank holds."""
        per_row = factors.repeat_interleave(self.head_dim)[:, None]  # (d, 1): one per row
        if hasattr(self, "qkvo"):  # v's and o's rows stay as they are
            ones = torch.ones_like(per_row)
            scale_rows(self.qkvo, torch.stack([per_row, per_row, ones, ones]))
        elif hasattr(self, "qkv"):  # dim 0 is the q/k/v slice; v's rows stay as they are
            scale_rows(self.qkv, torch.stack([per_row, per_row, torch.ones_like(per_row)]))
        else:
            scale_rows(self.q.weight, per_row)
            scale_rows(self.k.weight, per_row)

    def qkv_weights(self) -> list[Tensor]:
        """The three hidden matrices, for initialisation: merged, one tensor that is drawn at
        once (with qkvo its first three slices, so W_o draws nothing)."""
        if hasattr(self, "qkvo"):
            return [self.qkvo[:3]]
        if hasattr(self, "qkv"):
            return [self.qkv]
        return [self.q.weight, self.k.weight, self.v.weight]

    def out_weight(self) -> Tensor:
        """W_o, zero at initialisation."""
        return self.qkvo[3] if hasattr(self, "qkvo") else self.o.weight

    def forward(self, x: Tensor, rotary: Rotary, ctx: "Context") -> Tensor:
        B, T, C = x.shape
        shape = (B, T, self.n_head, self.head_dim)
        if hasattr(self, "qkvo"):
            w = self.qkvo.to(x.dtype)
            q, k, v = F.linear(x, w[:3].flatten(0, 1)).view(B, T, 3, -1).unbind(2)
            q, k, v = q.reshape(shape), k.reshape(shape), v.reshape(shape)
        elif hasattr(self, "qkv"):
            q, k, v = F.linear(x, self.qkv.flatten(0, 1).to(x.dtype)).view(B, T, 3, -1).unbind(2)
            q, k, v = q.reshape(shape), k.reshape(shape), v.reshape(shape)
        else:
            q, k, v = self.q(x).view(shape), self.k(x).view(shape), self.v(x).view(shape)
        v = self._mix_values(v, ctx)
        # QK-norm bounds the attention logits, which lets the records run higher LRs stably.
        if self.qk_norm:
            q, k = rms_norm(q), rms_norm(k)
        q, k = rotary(q, ctx.yarn_stage).transpose(1, 2), rotary(k, ctx.yarn_stage).transpose(1, 2)
        v = v.transpose(1, 2)
        mask = ctx.masks[self.window] if ctx.masks is not None else None
        scale = ctx.attn_scale if ctx.attn_scale is not None else self.scale
        if self._fold is not None and self.training:  # evaluation is no part of a step
            self._fold(q, k, mask, scale)
        y = attend(q, k, v, mask, scale)
        if hasattr(self, "gate"):  # σ(u[:k]·G[h]ᵀ) per position and head: (B, T, H)
            g = torch.sigmoid(self.gate(x[..., : self.gate_channels]))
            y = y * g.transpose(1, 2)[..., None]
        y = y.transpose(1, 2).reshape(B, T, C)
        if hasattr(self, "qkvo"):
            return F.linear(y, w[3])
        return self.o(y)

    @property
    def track_max_logit(self) -> bool:
        """QK-clip's switch: fold each training forward's max logits into `max_logit`."""
        return self._fold is not None

    @track_max_logit.setter
    def track_max_logit(self, on: bool) -> None:
        # A loop of chunks with host-side bounds: eager, never traced by torch.compile. The
        # wrapper is made here, not at import: it imports torch._dynamo (half a second).
        self._fold = torch.compiler.disable(self._fold_max_logit) if on else None

    def _fold_max_logit(
        self, q: Tensor, k: Tensor, mask: Mask | None, scale: float | Tensor | None
    ) -> None:
        m = max_logits(q.detach(), k.detach(), mask, scale)
        self.max_logit = m if self.max_logit is None else torch.maximum(self.max_logit, m)

    def _mix_values(self, v: Tensor, ctx: "Context") -> Tensor:
        if self.value_residual != "off":
            if ctx.v1 is None:  # block 0: remember its raw values (the mix is then an identity)
                ctx.v1 = v
            lam = self.value_lambda if self.value_residual == "learned" else self.fixed_lambda
            v = (1 - lam) * v + lam * ctx.v1
        if self.has_value_mix:
            mix = (
                self.value_mix
                if ctx.layout is None
                else ctx.packed[ctx.layout.value_mix(self.layer)]
            )
            alpha, beta = mix[0], mix[1]
            if self.value_embed is None:
                v = alpha * v
            else:
                v = alpha * v + beta * ctx.value_embeds[self.value_embed].view_as(v)
        return v


class Context:
    """What every block of one forward shares: x0, value embeddings, masks, block 0's values;
    the packed scalars and their layout (model.packed_scalars), the YaRN stage and its
    attention scale (0-d tensors)."""

    def __init__(
        self,
        x0: Tensor | None,
        value_embeds: dict[int, Tensor],
        masks: dict[str | None, Mask] | None,
        packed: Tensor | None = None,
        layout: ScalarLayout | None = None,
        yarn_stage: Tensor | None = None,
        attn_scale: Tensor | None = None,
    ) -> None:
        self.x0, self.value_embeds, self.masks = x0, value_embeds, masks
        self.packed, self.layout = packed, layout
        self.yarn_stage, self.attn_scale = yarn_stage, attn_scale
        self.v1: Tensor | None = None


def scale_rows(w: Tensor, factors: Tensor) -> None:
    """w[r] *= factors[r] for the dim-0 rows of `w` this rank holds: all of them, or an FSDP2
    DTensor's local shard, which FSDP2 cuts as `torch.chunk` cuts dim 0."""
    from torch.distributed.tensor import DTensor  # here: QK-clip only (a costly import)

    if isinstance(w, DTensor):
        pieces = factors.chunk(w.device_mesh.size())
        rank = w.device_mesh.get_local_rank()
        w.to_local().mul_((pieces[rank] if rank < len(pieces) else factors[:0]).to(w.dtype))
    else:
        w.mul_(factors.to(w.dtype))


def init_bound(cfg: ModelConfig, fan_in: int) -> float:
    """Half-width of the uniform init with std model.init_std/√fan_in."""
    # Written as √(3/fan_in)·init_std so that init_std=1 draws exactly the default model.
    return (3.0 / fan_in) ** 0.5 * cfg.init_std
