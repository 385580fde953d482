"""Muon: momentum, then orthogonalise the update of each hidden weight matrix.

For every 2-D parameter W with gradient g (Keller Jordan's Muon, 2024; the same update as
`torch.optim.Muon`):

    buf  <- lerp(buf, g, 1 - momentum)                  # EMA momentum
    u    <- lerp(g, buf, momentum) if nesterov else buf
    O    <- NewtonSchulz(u)                             # ≈ U Vᵀ of u = U S Vᵀ, see newton_schulz.py
    W    <- W · (1 - lr · weight_decay)                 # decoupled weight decay
    W    <- W - lr · scale(shape) · O

`scale` makes the update size comparable across shapes and is named by `lr_scale`:
"original" = max(1, rows/cols)**0.5 (Keller's), "match_rms_adamw" = 0.2·sqrt(max(rows, cols))
(Moonshot's "Muon is Scalable for LLM Training", which lets Muon reuse AdamW's LR), "none" = 1.

What differs from `torch.optim.Muon` is speed: Newton–Schulz runs once per *shape*, batched over
all matrices of that shape (tall ones transposed to their wide side first, so a 3072×768 and a
768×3072 share a batch), instead of once per matrix, and with the operand layout that CPU bf16
matmuls are fastest with (see `zeropower`). `scripts/bench_optim.py` measures the difference.

A step has three phases, so that a distributed mode can split the expensive one:
(a) momentum for every parameter (cheap and elementwise; every rank does it, so momentum is
replicated and checkpoints do not depend on the world size), (b) Newton–Schulz for the
parameters this rank owns (`assign_owners`: size-balanced round-robin), (c) apply the updates.
Without a process group one process owns everything. With one (`process_group=`, passed
explicitly), every rank receives the same DDP-averaged gradients, runs (a) on all matrices and
(b) on its own, and the finished updates are exchanged between (b) and (c) (`exchange`):
all ranks then apply identical updates and stay bit-identical to a single process.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.optim.optimizer import ParamsT

from optim.config import LR_SCALES
from optim.newton_schulz import NORM_SCALE, ns_coefficients, zeropower

# How finished updates travel between ranks. all_reduce: each rank fills the slots of the
# matrices it owns in a zeroed flat buffer, and one SUM all-reduce hands everyone everything
# (≈ 2·(W-1)/W·P values sent per rank). all_gather: each rank sends only its own updates, packed
# (≈ (W-1)/W·P), and unpacks the others' by the ownership every rank computes alike.
EXCHANGES = ("all_reduce", "all_gather")


def lr_scale_factor(shape: Sequence[int], lr_scale: str) -> float:
    """The factor multiplying the LR of a matrix of `shape` (rows, cols) under `lr_scale`."""
    rows, cols = shape
    if lr_scale == "original":
        return math.sqrt(max(1.0, rows / cols))
    if lr_scale == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if lr_scale == "none":
        return 1.0
    raise ValueError(f"unknown lr_scale {lr_scale!r}; expected one of {LR_SCALES}")


def ns_flops(shape: Sequence[int], steps: int) -> int:
    """FLOPs of `steps` Newton–Schulz iterations on one matrix: steps·(4m²n + 2m³), m ≤ n."""
    m, n = sorted(shape)
    return steps * (4 * m * m * n + 2 * m**3)


def assign_owners(shapes: Sequence[Sequence[int]], world_size: int) -> list[int]:
    """The rank that orthogonalises each matrix: round-robin in order of decreasing cost.

    Sorting by Newton–Schulz cost (ties by index, so every rank computes the same order) and
    dealing the matrices out in turn gives each rank about the same work, where dealing them
    out in model order could hand one rank all the large ones.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    order = sorted(range(len(shapes)), key=lambda i: (-ns_flops(shapes[i], 1), i))
    owners = [0] * len(shapes)
    for position, i in enumerate(order):
        owners[i] = position % world_size
    return owners


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters; see the module docstring for the update.

    Every hyperparameter lives in the param group, so a schedule may set `group["lr"]` and
    `group["momentum"]` before each step; `group["initial_lr"]` keeps the LR the group was
    built with, which schedules multiply.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        ns_coefficients: str = "classic",
        lr_scale: str = "original",
        weight_decay: float = 0.0,
        eps: float = 1e-7,
        ns_dtype: torch.dtype = torch.bfloat16,
        process_group: dist.ProcessGroup | None = None,
        exchange: str = "all_reduce",
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "ns_coefficients": ns_coefficients,
            "lr_scale": lr_scale,
            "weight_decay": weight_decay,
            "eps": eps,
        }
        # Round-robin ownership: with a process group each rank orthogonalises its share of the
        # matrices and the finished updates are exchanged; without one this process owns all.
        # The group is passed explicitly: never a silent fallback to the world group.
        if exchange not in EXCHANGES:
            raise ValueError(f"Muon exchange must be one of {EXCHANGES}, got {exchange!r}")
        self.process_group = process_group
        self.exchange = exchange
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
        # Precision of Newton–Schulz: a property of the hardware, not of the param groups.
        self.ns_dtype = ns_dtype
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (the constructor adds its groups this way too), validating it first."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            _check_group(group)
        except ValueError:
            self.param_groups.pop()  # leave the optimizer as it was
            raise
        group.setdefault("initial_lr", group["lr"])

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One Muon step; `closure`, if given, recomputes and returns the loss (with grads)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            updates = self._momentum(group, params)
            owners = assign_owners([p.shape for p in params], self.world_size)
            mine = [i for i, owner in enumerate(owners) if owner == self.rank]
            ortho = self._orthogonalise(group, updates, mine)
            if self.world_size > 1 and self.exchange == "all_gather":
                ortho = self._all_gather(updates, ortho, owners)
            elif self.world_size > 1:
                ortho = self._all_reduce(updates, ortho)
            self._apply(group, params, ortho)
        return loss

    def _momentum(self, group: dict[str, Any], params: list[Tensor]) -> list[Tensor]:
        """Phase (a): advance every momentum buffer; return the (Nesterov) update of each."""
        momentum = group["momentum"]
        updates = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - momentum)
            # Without Nesterov the update *is* the buffer: later phases only read it.
            updates.append(p.grad.lerp(buf, momentum) if group["nesterov"] else buf)
        return updates

    def _orthogonalise(
        self, group: dict[str, Any], updates: list[Tensor], indices: list[int]
    ) -> dict[int, Tensor]:
        """Phase (b): Newton–Schulz of `updates[i]` for i in `indices`, one batch per shape.

        Returns `ns_dtype` matrices in each parameter's own orientation, keyed by index.
        """
        by_shape: dict[tuple[int, int], list[int]] = {}
        for i in indices:
            m, n = sorted(updates[i].shape)
            by_shape.setdefault((m, n), []).append(i)
        coefficients = ns_coefficients(group["ns_coefficients"], group["ns_steps"])
        norm_scale = NORM_SCALE[group["ns_coefficients"]]
        ortho = {}
        for (m, n), batch in by_shape.items():
            # Copying into one stack casts each update and never writes to it (it may be
            # the momentum buffer itself).
            X = torch.empty(
                (len(batch), m, n), dtype=self.ns_dtype, device=updates[batch[0]].device
            )
            for j, i in enumerate(batch):
                X[j].copy_(_wide(updates[i]))
            out = zeropower(X, coefficients, group["eps"], norm_scale, self.ns_dtype)
            for j, i in enumerate(batch):
                ortho[i] = out[j].mT if _is_tall(updates[i]) else out[j]
        return ortho

    def _all_reduce(self, updates: list[Tensor], mine: dict[int, Tensor]) -> dict[int, Tensor]:
        """Give every rank every finished update: one all-reduce of a zero-filled flat buffer.

        Each rank writes the updates it owns into their slots and leaves the rest zero; the
        SUM then holds every update exactly (x + 0 = x), so all ranks stay bit-identical.
        """
        sizes = [u.numel() for u in updates]
        flat = torch.zeros(sum(sizes), dtype=self.ns_dtype, device=updates[0].device)
        slots = flat.split(sizes)
        for i, o in mine.items():
            slots[i].view_as(o).copy_(o)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group)
        return {i: slots[i].view(u.shape) for i, u in enumerate(updates)}

    def _all_gather(
        self, updates: list[Tensor], mine: dict[int, Tensor], owners: list[int]
    ) -> dict[int, Tensor]:
        """Give every rank every finished update: each rank sends only the ones it owns.

        Rank r packs its updates (in index order) into one buffer, padded to the largest
        rank's size so that all buffers match; every rank unpacks all buffers the same way.
        """
        owned = [[i for i, o in enumerate(owners) if o == r] for r in range(self.world_size)]
        sizes = [sum(updates[i].numel() for i in idx) for idx in owned]
        device = updates[0].device
        send = torch.zeros(max(sizes), dtype=self.ns_dtype, device=device)
        offset = 0
        for i in owned[self.rank]:
            n = updates[i].numel()
            send[offset : offset + n].view_as(mine[i]).copy_(mine[i])
            offset += n
        recv = [torch.empty_like(send) for _ in range(self.world_size)]
        dist.all_gather(recv, send, group=self.process_group)
        ortho = {}
        for rank, idx in enumerate(owned):
            offset = 0
            for i in idx:
                n = updates[i].numel()
                ortho[i] = recv[rank][offset : offset + n].view(updates[i].shape)
                offset += n
        return ortho

    def _apply(self, group: dict[str, Any], params: list[Tensor], ortho: dict[int, Tensor]) -> None:
        """Phase (c): decoupled weight decay, then the shape-scaled orthogonal step."""
        lr = group["lr"]
        for i, p in enumerate(params):
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(ortho[i], alpha=-lr * lr_scale_factor(p.shape, group["lr_scale"]))


def _is_tall(t: Tensor) -> bool:
    return t.size(0) > t.size(1)


def _wide(t: Tensor) -> Tensor:
    return t.mT if _is_tall(t) else t


def _check_group(group: dict[str, Any]) -> None:
    """Raise ValueError naming the first bad hyperparameter or parameter of a group."""
    if not group["lr"] >= 0:
        raise ValueError(f"Muon lr must be >= 0, got {group['lr']}")
    if not 0 <= group["momentum"] < 1:
        raise ValueError(f"Muon momentum must be in [0, 1), got {group['momentum']}")
    steps = group["ns_steps"]
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"Muon ns_steps must be an integer >= 1, got {steps!r}")
    if group["ns_coefficients"] not in NORM_SCALE:
        raise ValueError(
            f"Muon ns_coefficients must be one of {sorted(NORM_SCALE)}, "
            f"got {group['ns_coefficients']!r}"
        )
    if group["lr_scale"] not in LR_SCALES:
        raise ValueError(f"Muon lr_scale must be one of {LR_SCALES}, got {group['lr_scale']!r}")
    if not group["weight_decay"] >= 0:
        raise ValueError(f"Muon weight_decay must be >= 0, got {group['weight_decay']}")
    if not group["eps"] > 0:
        raise ValueError(f"Muon eps must be > 0, got {group['eps']}")
    for p in group["params"]:
        if p.ndim != 2:
            raise ValueError(
                f"Muon only takes 2-D parameters, got one of shape {tuple(p.shape)}; "
                "give embeddings, gains and biases to AdamW"
            )
