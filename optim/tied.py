"""The token table tied to the LM head until a split (record_2026_07_17, #51 and #53):
`optim.tie_embed_head_until`.

E (`embed.weight`) and W (`lm_head.weight`) start equal (model.embed.tied_init: E = Wᵀ in the
record's storage; here both are (vocab, d), so the transpose is the identity). While tied, on
each of Adam's updates (optim/adam.py, the sum of `update_every` gradients):

    g_W ← g_W + g_Eᵀ          (both already summed over the pair, in that order)
    W takes its Adam step      (the head group's settings, whatever they are)
    E ← Wᵀ                     (E's moments and update count stay as they were: idle)

The update that brings W's update count to T = (tie_embed_head_until + 1) / update_every is the
last tied one (record_2026_07_17: s = 921, T = 461); right after it E's Adam state becomes W's (m, v
and the count, transposed), and from the next update on the two are stepped apart.

With optim.tie_sum=step (record_medium_2025_12_31) E's gradient joins W's at every step instead,
before the pair is summed (`join_step`): (g_W + g_E)_{s−1} + (g_W + g_E)_s, the summed gradient of
the one tensor that serves as both head and table in that record; the rest is the same.

Whether the split happened is read from W's update count, which a checkpoint holds, so a run
resumed on either side of it goes on exactly (nothing of the tie is saved). A step the loop
skips (train.on_nonfinite=skip) adds no update, so the split then comes that much later in
steps, still after the T-th update. Gradients are averaged over ranks before the optimizer
(DDP, or FSDP's reduce-scatter of equal dim-0 shards of E and W), so the tie sees the same
sums on every rank and on any number of ranks.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

Ready = list[tuple[Tensor, Tensor, dict, dict]]  # (p, its summed gradient, state, group)

# The keys of Adam's state that carry over at the split: the moments and the update count,
# not the gradient sum of a pair (zero right after an update anyway).
_PAIR_KEYS = ("grad_sum", "pending")


def as_embed(x: Tensor) -> Tensor:
    """A head-shaped tensor in E's storage: Wᵀ in the record, the identity here (both are
    (vocab, d)); one place, so a transposed head would change only this."""
    return x


class TiedEmbedHead:
    """The tie of one Adam instance's E and W (see the module docstring); Adam calls `before`
    with the parameters whose update is due, and `after` once they moved."""

    def __init__(
        self, embed: Tensor, head: Tensor, split_update: int, per_step: bool = False
    ) -> None:
        if embed.shape != head.shape:
            raise ValueError(
                f"optim.tie_embed_head_until ties embed.weight {tuple(embed.shape)} to "
                f"lm_head.weight {tuple(head.shape)}: they must have the same shape"
            )
        self.embed, self.head = embed, head
        self.split_update = split_update
        self.per_step = per_step  # optim.tie_sum=step: `join_step` on every step's gradients
        self._moved: dict | None = None  # W's state while a tied update is in flight

    @torch.no_grad()
    def join_step(self, ready: Ready, state: Any) -> Ready:
        """optim.tie_sum=step: this step's gradients (p, g, …) with E's added to W's and E's zero,
        while tied, so that the steps' sum is Σ_s (g_W + g_E)_s, one tensor's summed gradient
        (record_medium_2025_12_31); the sum of E's zeros then joins W's at the update unchanged."""
        if count(state[self.head]) >= self.split_update:
            return ready
        g_embed = next((g for p, g, _, _ in ready if p is self.embed), None)
        if g_embed is None:
            return ready
        out = []
        for p, g, st, group in ready:
            if p is self.head:
                g = g + as_embed(g_embed)
            elif p is self.embed:
                g = torch.zeros_like(g)
            out.append((p, g, st, group))
        return out

    @torch.no_grad()
    def before(self, ready: Ready, state: Any) -> Ready:
        """The updates to make: while tied, without E's and with E's summed gradient added to
        W's. `state`: Adam's state (by parameter), for W's update count."""
        self._moved = None
        if count(state[self.head]) >= self.split_update:
            return ready  # split: two tensors like any others
        mine = [r for r in ready if r[0] is self.embed or r[0] is self.head]
        if not mine:
            return ready
        if len(mine) != 2:  # they take a gradient every step, so their sums fill together
            raise RuntimeError("the tied embedding and head reached an update apart")
        g_embed = next(g for p, g, _, _ in mine if p is self.embed)
        out = []
        for p, g, st, group in ready:
            if p is self.head:
                out.append((p, g + as_embed(g_embed), st, group))
                self._moved = st
            elif p is not self.embed:
                out.append((p, g, st, group))
        return out

    @torch.no_grad()
    def after(self, state: Any, target: Callable[[Tensor], Tensor] = lambda p: p) -> None:
        """E ← Wᵀ after a tied update; after the T-th, E's Adam state ← W's (once).
        `target`: what this rank updates of a parameter (its rows under
        dist.parallelism=ddp_row_shards, where E and W are cut alike and E's rows are gathered with
        the rest)."""
        if self._moved is None:
            return
        target(self.embed).copy_(as_embed(target(self.head)))
        if count(self._moved) == self.split_update:
            mine = state[self.embed]
            for key, value in self._moved.items():
                if key in _PAIR_KEYS:
                    continue
                value = as_embed(value) if value.ndim else value
                if key in mine:
                    mine[key].copy_(value)  # in place: DCP and offload hold these tensors
                else:
                    mine[key] = value.clone()
        self._moved = None


def count(state: dict) -> int:
    """A tensor's Adam update count t (0 before its first update)."""
    return int(state["step"]) if "step" in state else 0


def attach(
    parts: list[torch.optim.Optimizer], named: dict, until: int, every: int, per_step: bool = False
) -> None:
    """Tie `embed.weight` to `lm_head.weight` (the token table and the head, by name in the
    param groups `named`) in the Adam part of `parts` that steps both; raises ValueError
    naming optim.tie_embed_head_until when they are missing or not both optim/adam.py's."""
    found = {n: p for group in named.values() for n, p in group}
    embed, head = found.get("embed.weight"), found.get("lm_head.weight")
    if embed is None or head is None:
        raise ValueError(
            "optim.tie_embed_head_until ties embed.weight to lm_head.weight: the model has "
            f"{'no embed.weight' if embed is None else 'no lm_head.weight'}"
        )
    for opt in parts:
        held = [p for g in opt.param_groups for p in g["params"]]
        both = any(p is embed for p in held) and any(p is head for p in held)
        if both and hasattr(opt, "tie"):  # optim/adam.py's Adam (torch's AdamW has no slot)
            opt.tie = TiedEmbedHead(embed, head, (until + 1) // every, per_step)
            return
    raise ValueError(
        "optim.tie_embed_head_until needs embed.weight and lm_head.weight stepped by one "
        "optim/adam.py Adam (the tie runs inside its update)"
    )
