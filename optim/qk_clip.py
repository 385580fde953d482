"""QK-clip: after each optimizer step, shrink W_q and W_k of the heads whose logits ran too high.

The MuonClip rule of Kimi K2 (Kimi Team, "Kimi K2: Open Agentic Intelligence", 2025). For each
attention head h, let S_h be the largest pre-softmax logit scale·q·kᵀ it produced over the step
(every micro-batch, every position its mask allows, after QK-norm and rotary). When S_h > τ,

    W_q[h] <- √(τ/S_h)·W_q[h],   W_k[h] <- √(τ/S_h)·W_k[h]     (the rows of head h)

so that the same inputs would give the head logits scaled by τ/S_h: a maximum of exactly τ.
Heads at or below τ are left untouched.

With QK-norm on (model.attention.qk_norm, the default) q and k are RMS-normalised before the logits,
which removes any scale of W_q and W_k: the clip still rescales the weights, but the next
logits come out the same, so it bounds nothing there (the norm already bounds the logits by
scale·head_dim). The rule only acts on the logits with model.attention.qk_norm=false.

Usage, on every rank alike (apply() is a collective when a process group is given):

    clip = QKClip(model, tau, process_group)
    clip.start()                    # once: attention layers record their maxima from now on
    ... forward/backward over the step's micro-batches; optimizer.step() ...
    stats = clip.apply()            # after every step: clip, reset, numbers to log

QK-clip reaches the attention layers through a small interface, so that it needs nothing of
the model but this: a module of `model` that has `scale_qk` is an attention layer, with

    n_head: int                     # its heads
    track_max_logit: bool           # the switch: fold each training forward's maxima in
    max_logit: Tensor | None        # (n_head,) fp32, the running max per head
    reset_max_logit() -> None       # max_logit <- -inf for every head
    scale_qk(factors) -> None       # head h's rows of W_q and W_k *= factors[h], in the rows
                                    # this rank holds (FSDP2 shards scale their own)
"""

import torch
import torch.distributed as dist
from torch import nn


class QKClip:
    """Clips every attention layer of `model` at max logit `tau` (see the module doc)."""

    def __init__(
        self, model: nn.Module, tau: float, process_group: dist.ProcessGroup | None = None,
        heads: list[str] | None = None,
    ) -> None:  # fmt: skip
        """`heads` (optim.muon.qk_clip_heads): the heads that may be clipped, each "L" (every
        head of attention layer L, in model order) or "L.h" (head h of it); None or empty:
        every head. The others are tracked and logged but never scaled."""
        if tau <= 0:
            raise ValueError(f"qk_clip: tau must be positive, got {tau}")
        self.layers = [m for m in model.modules() if hasattr(m, "scale_qk")]
        if not self.layers:
            raise ValueError("qk_clip: the model has no attention layer to clip (scale_qk)")
        self.tau = float(tau)
        self.group = process_group
        self.allowed = head_mask(heads or [], [m.n_head for m in self.layers])

    def start(self) -> None:
        """Record each training forward's per-head max logits from now on, starting afresh."""
        for attn in self.layers:
            attn.track_max_logit = True
        self.reset()

    def stop(self) -> None:
        """Stop recording: forward is then exactly as without QK-clip."""
        for attn in self.layers:
            attn.track_max_logit = False

    def reset(self) -> None:
        """Forget the maxima recorded so far (e.g. after a step that was skipped)."""
        for attn in self.layers:
            attn.reset_max_logit()

    @torch.no_grad()
    def apply(self) -> dict[str, float | int]:
        """Clip the heads whose max logit since the last call exceeded tau, reset the maxima,
        and return {"qk_clip/max_logit": the largest over all heads, "qk_clip/clipped_heads"}."""
        if any(attn.max_logit is None for attn in self.layers):
            raise RuntimeError("qk_clip: call QKClip.start() before the step's forward passes")
        maxima = torch.stack([attn.max_logit for attn in self.layers])  # (layers, heads)
        if self.group is not None:  # every rank must clip alike, by the maxima of all batches
            dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=self.group)
        over = (maxima > self.tau) & self.allowed.to(maxima.device)
        factors = torch.where(over, (self.tau / maxima).sqrt(), torch.ones_like(maxima))
        for attn, f in zip(self.layers, factors, strict=True):
            attn.scale_qk(f)
        self.reset()
        top, clipped = torch.stack([maxima.max(), over.sum().float()]).tolist()
        return {"qk_clip/max_logit": top, "qk_clip/clipped_heads": int(clipped)}


def head_mask(heads: list[str], per_layer: list[int]) -> torch.Tensor:
    """(layers, heads) bool: True where `heads` ("L" or "L.h" entries; empty: all) lets a head
    be clipped; a ValueError names an entry that is not a layer, or a head of it."""
    if not heads:
        return torch.ones(len(per_layer), max(per_layer), dtype=torch.bool)
    mask = torch.zeros(len(per_layer), max(per_layer), dtype=torch.bool)
    for entry in heads:
        layer, _, head = str(entry).partition(".")
        ok = layer.isdigit() and int(layer) < len(per_layer)
        ok = ok and (not head or (head.isdigit() and int(head) < per_layer[int(layer)]))
        if not ok:
            raise ValueError(
                f"optim.muon.qk_clip_heads: {entry!r} is not a head of this model: give "
                f'"L" (layer L < {len(per_layer)}) or "L.h" (head h < its heads)'
            )
        if head:
            mask[int(layer), int(head)] = True
        else:
            mask[int(layer), : per_layer[int(layer)]] = True
    return mask
