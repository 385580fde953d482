"""Causal self-attention, with the records' options on its values, weights and mask.

For input u (already RMS-normalised), per head of size D:

    q, k, v = u·W_qᵀ, u·W_kᵀ, u·W_vᵀ      (or slices 0, 1, 2 of one merged 3×d×d weight, or of
                                           the 2025-11 record's 4×d×d W_q, W_k, W_v, W_o;
                                           record_2026_07_17's u·(λ⁰·W_qkv)ᵀ: weight_lambdas)
    v <- mixes(v)                          value residual, value embeddings (model/values.py)
    v <- v + aux                           the MUDD layer, instead of the mixes (model/mudd.py)
    q, k <- rotary(RMSNorm(q)), rotary(RMSNorm(k))   QK-norm (unless attention.qk_norm=false)
    k_t[c] <- k_(t−1)[c]                   key offset, long-window layers (attention.key_offset),
                                           c the channels the rotary leaves unrotated
    y = softmax(scale·q·kᵀ + mask)·v       scale 1/√D, or model.attention.scale (0.12 in
                                           2025-01), or YaRN's scale of the stage (model/yarn.py)
    y_h <- parts after the heads           model/points.py: learnable XSA (model/xsa.py)
    (paired layers: rotary at 2t / 2t+1, heads h and h + H/2 in one slot over 2T positions,
     no key offset, no XSA; model.attention.paired, model/paired.py)
    y_h <- y_h·σ(u[:k]·G[h]ᵀ)               sparse output gate per head (model.attention.gate)
    out = y·W_oᵀ                            heads in order (the 2026-07 record: y·(λ¹·W_o)ᵀ)

The mask is causal, or the document / sliding-window rule of `model/masks.py`. QK-clip
(`optim/qk_clip.py`) needs each head's largest logit scale·q·kᵀ over a step: with
`track_max_logit` on, each training forward folds it into `max_logit` (model/max_logit.py).
"""

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.attend import attend
from model.config import ModelConfig
from model.context import Context
from model.heads import Heads, PairedHeads
from model.layers import declare, linear, rms_norm
from model.masks import Mask
from model.max_logit import max_logits
from model.plan import LayerSpec
from model.points import Points
from model.rotary import Rotary, static_spans
from model.scalars import WEIGHT_LAMBDAS_INIT
from model.values import ValueMix


class CausalSelfAttention(nn.Module, ABC):
    """The attention core: project, mix the values, QK-norm, place the heads, the kernel, the
    parts after the heads, the gate, project out. Where its weights live is the subclass's
    (`build_attention`): q, k, v, o as four linears, one (3, d, d) W_qkv beside o, or one
    (4, d, d) W_qkvo; an option that is off is None here and never called."""

    def __init__(self, cfg: ModelConfig, spec: LayerSpec, layer: int) -> None:
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.qk_norm = cfg.attention.qk_norm
        self._fold: Callable | None = None  # set while QK-clip tracks (`track_max_logit`)
        # A plain attribute, not a buffer: DDP broadcasts buffers from rank 0 before every
        # forward, which would overwrite each rank's maxima between micro-batches.
        self.max_logit: Tensor | None = None  # (n_head,) fp32, the running max per head
        self.window = spec.window
        self.paired = spec.paired
        self.mask_key = spec.mask_key
        self.varlen = cfg.attention.impl == "varlen"
        # the key offset is the normal long-window layers' (a paired layer has none), on the
        # channels the rotary leaves unrotated
        key_offset = cfg.attention.key_offset and spec.window == "long" and not spec.paired
        offset = static_spans(cfg.attention.rope, cfg.head_dim) if key_offset else ()
        self.heads = PairedHeads() if spec.paired else Heads(offset)
        self.layer = layer  # its place in the packed scalars
        att = cfg.attention
        self.out_uniform = att.out_init == "uniform"
        # (λ⁰, λ¹): in the packed vector with record_2026_07_17's layout, else this module's own.
        self.packed_lambdas = att.weight_lambdas and cfg.numerics.packed_scalars
        self.weight_lambdas: nn.Parameter | None = None
        if att.weight_lambdas and not self.packed_lambdas:
            self.weight_lambdas = nn.Parameter(torch.tensor(WEIGHT_LAMBDAS_INIT))
            self.weight_lambdas.role = "scalar"  # type: ignore[attr-defined]  # Adam, not Muon
        # The value mixes' parameters are this module's (value_lambda, value_mix), as the
        # optimizer's groups and the checkpoints name them; their formulas are model/values.py's.
        # The MUDD layer's values take its aux instead (model/mudd.py).
        self.values = None if spec.mudd else ValueMix.build(self, cfg, spec, layer)
        self.gate_channels = cfg.gate_channels
        self.gate: nn.Module | None = None
        if att.gate:  # (heads × k), an nn.Linear as the record's (bf16 in a bf16 model)
            self.gate = linear(cfg, cfg.gate_channels, cfg.n_head)

    # The weight layout's part: each subclass below implements all six (an ABC, so a layout
    # that forgets one fails when it is built, not when it is first called).
    @abstractmethod
    def project(self, x: Tensor, lam: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (B, T, d) each: x·W_qkvᵀ, or x·(λ⁰·W_qkv)ᵀ with the 0-d fp32 λ⁰ times the
        weight in x's dtype (a 0-d tensor does not promote, so the product is rounded once
        to it, as the record's)."""
        ...

    @abstractmethod
    def project_out(self, y: Tensor, lam: Tensor | None) -> Tensor:
        """y·W_oᵀ, or y·(λ¹·W_o)ᵀ rounded to the weight's dtype as λ⁰·W_qkv is."""
        ...

    @abstractmethod
    def qk_rows(self) -> list[tuple[Tensor, int]]:
        """(tensor, slices) whose rows are W_q's and W_k's: QK-clip scales them."""
        ...

    @abstractmethod
    def qkv_weights(self) -> list[Tensor]:
        """The hidden matrices drawn uniformly at initialisation: merged, one tensor that is
        drawn at once (with qkvo its first three slices, so W_o draws nothing, unless
        attention.out_init=uniform draws all four)."""
        ...

    @abstractmethod
    def out_weight(self) -> Tensor:
        """W_o."""
        ...

    @abstractmethod
    def matrices(self) -> list[nn.Parameter]:
        """The hidden matrices as parameters (the bf16 cast of record_2026_07_17's)."""
        ...

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
        for w, slices in self.qk_rows():  # a merged weight: dim 0 is the slice, v's and o's
            if slices:  # rows stay as they are
                ones = [torch.ones_like(per_row)] * (slices - 2)
                scale_rows(w, torch.stack([per_row, per_row, *ones]))
            else:
                scale_rows(w, per_row)

    @torch.no_grad()
    def reset_lambdas(self) -> None:
        """(λ⁰, λ¹) at their start, where this module holds them."""
        if self.weight_lambdas is not None:
            self.weight_lambdas.copy_(torch.tensor(WEIGHT_LAMBDAS_INIT))

    def _lambdas(self, points: Points) -> tuple[Tensor, Tensor] | tuple[None, None]:
        """(λ⁰, λ¹) of this layer (attention.weight_lambdas), 0-d fp32; Nones when off."""
        if self.packed_lambdas:
            lam = points.scalars.weight_lambdas(self.layer)
        elif self.weight_lambdas is not None:
            lam = self.weight_lambdas
        else:
            return None, None
        return lam[0], lam[1]

    def forward(self, x: Tensor, rotary: Rotary, ctx: Context, points: Points,
                aux: Tensor | None = None) -> Tensor:  # fmt: skip
        """`points`: the parts by where they act (model/points.py); `aux` (B, T, H, D): added
        to the values instead of their mixes (the MUDD layer)."""
        B, T, _ = x.shape
        # heads from the projection's width: a tensor-parallel rank's H/T are a whole model's
        shape = (B, T, -1, self.head_dim)
        lam_in, lam_out = self._lambdas(points)
        q, k, v = (t.reshape(shape) for t in self.project(x, lam_in))
        if self.values is not None:
            v = self.values(self, v, ctx, points, x)
        if aux is not None:
            v = v + aux
        # QK-norm bounds the attention logits, which lets the records run higher LRs stably.
        if self.qk_norm:
            q, k = rms_norm(q), rms_norm(k)
        mask, scale = ctx.mask(self.mask_key), ctx.attn_scale
        if ctx.kv is None:
            q, k, v = self.heads.arrange(q, k, v, rotary, ctx.yarn_stage)
            own_v = v
        else:  # generation: the new tokens after the cached ones (model/kv_cache.py)
            q, k, own_v = self.heads.arrange(q, k, v, rotary, ctx.yarn_stage, ctx.kv.start)
            (k, v), mask = ctx.kv.extend(self.layer, k, own_v), ctx.kv.mask
        if self._fold is not None and self.training:  # evaluation is no part of a step
            self._fold(q, k, mask, scale)
        y = self.heads.restore(attend(q, k, v, mask, scale))  # (B, H, T, D)
        for part in points.after_heads:  # XSA's (model/xsa.py)
            y = part.after_heads(y, own_v, self.layer)
        if self.gate is not None:  # σ(u[:k]·G[h]ᵀ) per position and head: (B, T, H)
            g = torch.sigmoid(self.gate(x[..., : self.gate_channels]))
            y = y * g.transpose(1, 2)[..., None]
        return self.project_out(y.transpose(1, 2).reshape(B, T, -1), lam_out)

    @property
    def track_max_logit(self) -> bool:
        """QK-clip's switch: fold each training forward's max logits into `max_logit`."""
        return self._fold is not None

    @track_max_logit.setter
    def track_max_logit(self, on: bool) -> None:
        if on and self.varlen:  # the flash kernel returns no logits, and no mask to read
            raise ValueError(
                "QK-clip (optim.muon.qk_clip) reads each head's logits through a mask; "
                "model.attention.impl=varlen has none: use model.attention.impl=auto or flex"
            )
        if on and self.paired:  # a slot's logits mix two heads: no per-head maximum
            raise ValueError(
                f"QK-clip tracks per-head logits; layer {self.layer} pairs heads "
                "(model.attention.paired): turn one off"
            )
        # A loop of chunks with host-side bounds: eager, never traced by torch.compile. The
        # wrapper is made here, not at import: it imports torch._dynamo (half a second).
        self._fold = torch.compiler.disable(self._fold_max_logit) if on else None

    def _fold_max_logit(
        self, q: Tensor, k: Tensor, mask: Mask | None, scale: float | Tensor | None
    ) -> None:
        m = max_logits(q.detach(), k.detach(), mask, scale)
        self.max_logit = m if self.max_logit is None else torch.maximum(self.max_logit, m)


class SeparateAttention(CausalSelfAttention):
    """W_q, W_k, W_v, W_o: four `nn.Linear`s (`q`, `k`, `v`, `o`), each its own Muon matrix."""

    def __init__(self, cfg: ModelConfig, spec: LayerSpec, layer: int) -> None:
        super().__init__(cfg, spec, layer)
        d = cfg.n_embd
        self.q, self.k, self.v = linear(cfg, d, d), linear(cfg, d, d), linear(cfg, d, d)
        self.o = linear(cfg, d, d)

    def project(self, x: Tensor, lam: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        if lam is None:
            return self.q(x), self.k(x), self.v(x)
        w = torch.cat([self.q.weight, self.k.weight, self.v.weight])
        return _split3(F.linear(x, w.to(x.dtype) * lam))

    def project_out(self, y: Tensor, lam: Tensor | None) -> Tensor:
        return self.o(y) if lam is None else F.linear(y, self.o.weight.to(y.dtype) * lam)

    def qk_rows(self) -> list[tuple[Tensor, int]]:
        return [(self.q.weight, 0), (self.k.weight, 0)]

    def qkv_weights(self) -> list[Tensor]:
        out = [self.q.weight, self.k.weight, self.v.weight]
        return [*out, self.o.weight] if self.out_uniform else out

    def out_weight(self) -> Tensor:
        return self.o.weight

    def matrices(self) -> list[nn.Parameter]:
        return [self.q.weight, self.k.weight, self.v.weight, self.o.weight]


class MergedQKVAttention(CausalSelfAttention):
    """W_q, W_k, W_v as the slices of one (3, d, d) `qkv` (each slice its own Muon matrix),
    W_o an `nn.Linear` `o` (model.attention.merged_qkv)."""

    def __init__(self, cfg: ModelConfig, spec: LayerSpec, layer: int) -> None:
        super().__init__(cfg, spec, layer)
        d = cfg.n_embd
        self.qkv = nn.Parameter(torch.empty(3, d, d))
        declare(self.qkv, "matrix", stack_of="q, k, v")  # a hidden matrix per slice
        self.o = linear(cfg, d, d)

    def project(self, x: Tensor, lam: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        w = self.qkv.flatten(0, 1).to(x.dtype)
        return _split3(F.linear(x, w if lam is None else w * lam))

    def project_out(self, y: Tensor, lam: Tensor | None) -> Tensor:
        return self.o(y) if lam is None else F.linear(y, self.o.weight.to(y.dtype) * lam)

    def out_weight(self) -> Tensor:
        return self.o.weight

    def qk_rows(self) -> list[tuple[Tensor, int]]:
        return [(self.qkv, 3)]

    def qkv_weights(self) -> list[Tensor]:
        return [self.qkv, self.o.weight] if self.out_uniform else [self.qkv]

    def matrices(self) -> list[nn.Parameter]:
        return [self.qkv, self.o.weight]


class MergedQKVOAttention(CausalSelfAttention):
    """W_q, W_k, W_v, W_o as the slices of one (4, d, d) `qkvo` (model.attention.merged_qkvo).
    The record's 768 × 3,072 parameter read in memory order as four (out, in) matrices is
    this stack: the same memory, and Muon/NorMuon treat each slice as its own matrix, as the
    record does."""

    def __init__(self, cfg: ModelConfig, spec: LayerSpec, layer: int) -> None:
        super().__init__(cfg, spec, layer)
        d = cfg.n_embd
        self.qkvo = nn.Parameter(torch.empty(4, d, d))
        declare(self.qkvo, "matrix", stack_of="q, k, v, o")  # a hidden matrix per slice

    def project(self, x: Tensor, lam: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        w = self.qkvo[:3].flatten(0, 1).to(x.dtype)
        return _split3(F.linear(x, w if lam is None else w * lam))

    def project_out(self, y: Tensor, lam: Tensor | None) -> Tensor:
        w = self.qkvo[3].to(y.dtype)
        return F.linear(y, w if lam is None else w * lam)

    def qk_rows(self) -> list[tuple[Tensor, int]]:
        return [(self.qkvo, 4)]

    def qkv_weights(self) -> list[Tensor]:
        return [self.qkvo if self.out_uniform else self.qkvo[:3]]

    def out_weight(self) -> Tensor:
        return self.qkvo[3]

    def matrices(self) -> list[nn.Parameter]:
        return [self.qkvo]


def build_attention(cfg: ModelConfig, spec: LayerSpec, layer: int) -> CausalSelfAttention:
    """Layer `layer`'s attention in the weight layout the config names."""
    att = cfg.attention
    if att.merged_qkvo:
        return MergedQKVOAttention(cfg, spec, layer)
    if att.merged_qkv:
        return MergedQKVAttention(cfg, spec, layer)
    return SeparateAttention(cfg, spec, layer)


def _split3(qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(B, T, 3d) -> q, k, v (B, T, d) each."""
    B, T, _ = qkv.shape
    return qkv.view(B, T, 3, -1).unbind(2)


def scale_rows(w: Tensor, factors: Tensor) -> None:
    """w[r] *= factors[r] for the dim-0 rows of `w` this rank holds: all of them, or an FSDP2
    DTensor's local shard, which FSDP2 cuts as `torch.chunk` cuts dim 0 over its shard dim."""
    from torch.distributed.tensor import DTensor, Shard  # here: QK-clip only (a costly import)

    if isinstance(w, DTensor):
        # the mesh dim that cuts the rows (HSDP's other dim replicates them)
        dim = next(k for k, placement in enumerate(w.placements) if placement == Shard(0))
        pieces = factors.chunk(w.device_mesh.size(dim))
        rank = w.device_mesh.get_local_rank(dim)
        w.to_local().mul_((pieces[rank] if rank < len(pieces) else factors[:0]).to(w.dtype))
    else:
        w.mul_(factors.to(w.dtype))


def init_bound(cfg: ModelConfig, fan_in: int, std: float = 0.0) -> float:
    """Half-width of the uniform init with std `std`/√fan_in (0: model.init_std)."""
    # Written as √(3/fan_in)·init_std so that init_std=1 draws exactly the default model.
    return (3.0 / fan_in) ** 0.5 * (std or cfg.init_std)
