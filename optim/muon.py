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
(a) momentum, cheap and elementwise, (b) Newton–Schulz, (c) apply the updates. Without a process
group one process does all three for every matrix. With one (`process_group=`, passed
explicitly, never a silent fallback to the world group), matrix i is orthogonalised by rank
`owners[i]` (`optim/exchange.py`: cost-balanced round-robin) and `exchange` says how results
travel:

- "all_reduce" / "all_gather": DDP has already given every rank the same averaged gradients.
  Every rank runs (a) on all matrices, so momentum is replicated and checkpoints do not depend
  on the world size; (b) on its own; the finished updates are exchanged; every rank runs (c)
  on all matrices. All ranks stay bit-identical to a single process.
- "reduce_scatter": the Muon parameters are left out of DDP. `step` reduce-scatters the local
  gradients so each owner receives the average of its matrices, runs (a), (b) and (c) on those,
  and all-gathers the new parameters. Momentum then lives on the owner only; `state_dict()`
  gathers it, so it is a collective that every rank must call, and returns the same
  world-size-independent state as the other modes; `load_state_dict` keeps each rank's share.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.optim.optimizer import ParamsT

from optim.exchange import RoundRobin, check_exchange, check_supported
from optim.muon_settings import MuonConfig, check_settings, lr_scale_factor
from optim.newton_schulz import orthogonalise


def advance_momentum(buf: Tensor, g: Tensor, group: dict[str, Any]) -> None:
    """Phase (a) for one matrix: `buf` takes gradient `g` in place. Elementwise, so a shard
    of `buf` and `g` gives that shard of the whole result."""
    if group["momentum_form"] == "ema":
        buf.lerp_(g, 1 - group["momentum"])
    else:
        buf.mul_(group["momentum"]).add_(g)


def momentum_update(buf: Tensor, g: Tensor, group: dict[str, Any]) -> Tensor:
    """The update to orthogonalise, after `advance_momentum`: the buffer itself without
    Nesterov (later phases only read it), else the look-ahead mix of `g` and `buf`."""
    if not group["nesterov"]:
        return buf
    m = group["momentum"]
    return g.lerp(buf, m) if group["momentum_form"] == "ema" else g.add(buf, alpha=m)


def apply_update(p: Tensor, update: Tensor, group: dict[str, Any], shape: Sequence[int]) -> None:
    """Phase (c) for one matrix `p` (or a dim-0 shard of one) of global `shape`: decoupled
    weight decay, then the orthogonal step scaled for the whole matrix's shape."""
    lr = group["lr"]
    p.mul_(1 - lr * group["weight_decay"])
    # A tall matrix's update is a transposed view; adding it to a row-major parameter walks
    # memory column-wise, 2-3x slower on a CPU than transposing it first.
    p.add_(update.contiguous(), alpha=-lr * lr_scale_factor(shape[-2:], group["lr_scale"]))


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters; see the module docstring for the update.

    Every hyperparameter lives in the param group, so a schedule may set `group["lr"]` and
    `group["momentum"]` before each step. The defaults are `MuonConfig`'s, so a standalone
    Muon and a configured run start from the same values.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = MuonConfig.lr,
        momentum: float = MuonConfig.momentum,
        nesterov: bool = MuonConfig.nesterov,
        momentum_form: str = MuonConfig.momentum_form,
        ns_steps: int = MuonConfig.ns_steps,
        ns_coefficients: str = MuonConfig.ns_coefficients,
        lr_scale: str = MuonConfig.lr_scale,
        ns_form: str = MuonConfig.ns_form,
        weight_decay: float = MuonConfig.weight_decay,
        eps: float = MuonConfig.eps,
        ns_dtype: torch.dtype = torch.bfloat16,
        process_group: dist.ProcessGroup | None = None,
        exchange: str = MuonConfig.exchange,
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "nesterov": nesterov,
            "momentum_form": momentum_form,
            "ns_steps": ns_steps,
            "ns_coefficients": ns_coefficients,
            "lr_scale": lr_scale,
            "ns_form": ns_form,
            "weight_decay": weight_decay,
            "eps": eps,
        }
        check_exchange(exchange)
        self.process_group = process_group
        self.exchange = exchange
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
        # Precision of Newton–Schulz: a property of the hardware, not of the param groups.
        self.ns_dtype = ns_dtype
        self._exchange_cache: dict[tuple, RoundRobin] = {}  # per group: owners, comm buffers
        super().__init__(params, defaults)
        if process_group is not None:
            # Collective: a mode the backend can't run fails here, not at the first step.
            param_dtypes = {p.dtype for g in self.param_groups for p in g["params"]}
            check_supported(exchange, process_group, sorted({ns_dtype, *param_dtypes}, key=str))

    @property
    def owner_only(self) -> bool:
        """True when each rank keeps the momentum of the matrices it owns only."""
        return self.exchange == "reduce_scatter" and self.world_size > 1

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (the constructor adds its groups this way too), validating it first."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            check_settings(group, "Muon ")
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(
                        f"Muon only takes matrices (2-D, or stacks of them), got a parameter "
                        f"of shape {tuple(p.shape)}; give embeddings, gains and biases to AdamW"
                    )
        except ValueError:
            self.param_groups.pop()  # leave the optimizer as it was
            raise

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One Muon step; `closure`, if given, recomputes and returns the loss (with grads)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            if self.owner_only:
                self._step_owner_only(index, group)
                continue
            with_grad = [i for i, p in enumerate(group["params"]) if p.grad is not None]
            params = [group["params"][i] for i in with_grad]
            if not params:
                continue
            rr = self._round_robin(index, group, with_grad)
            mine = rr.mine if rr is not None else range(len(params))
            updates = self._momentum(group, params, [p.grad for p in params], set(mine))
            ortho = self._orthogonalise(group, updates)
            if rr is not None and self.exchange == "all_gather":
                ortho = dict(enumerate(rr.all_gather(ortho, self.ns_dtype)))
            elif rr is not None:
                ortho = dict(enumerate(rr.all_reduce(ortho, self.ns_dtype)))
            self._apply(group, dict(enumerate(params)), ortho)
        return loss

    def _step_owner_only(self, index: int, group: dict[str, Any]) -> None:
        """The "reduce_scatter" step: average my matrices' gradients, update them, share them."""
        params = group["params"]
        missing = [i for i, p in enumerate(params) if p.grad is None]
        if missing:
            # Ownership and the collectives cover the whole group, so every rank must bring a
            # gradient for every matrix (a rank skipping one would desynchronise the others).
            raise RuntimeError(
                f"Muon exchange=reduce_scatter needs a gradient for every parameter on every "
                f"rank; parameters {missing} of group {group.get('name', '?')!r} have none"
            )
        rr = self._round_robin(index, group, range(len(params)))
        grads = rr.reduce_scatter([p.grad for p in params])
        for g in grads.values():
            g.div_(self.world_size)  # the SUM over ranks -> the average DDP would have given
        mine = {i: params[i] for i in rr.mine}
        updates = self._momentum(
            group, list(mine.values()), [grads[i] for i in mine], set(range(len(mine)))
        )
        ortho = self._orthogonalise(group, dict(zip(mine, updates.values(), strict=True)))
        self._apply(group, mine, ortho)
        for i, value in enumerate(rr.all_gather(mine, params[0].dtype)):
            if rr.owners[i] != self.rank:
                params[i].copy_(value)

    def _round_robin(
        self, index: int, group: dict[str, Any], members: Sequence[int]
    ) -> RoundRobin | None:
        """The ownership and exchange buffers of these members of group `index` (None alone)."""
        if self.process_group is None or self.world_size == 1:
            return None
        key = (index, tuple(members))
        if key not in self._exchange_cache:
            shapes = [group["params"][i].shape for i in members]
            self._exchange_cache[key] = RoundRobin(shapes, self.process_group)
        return self._exchange_cache[key]

    def _momentum(
        self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor], want: set[int]
    ) -> dict[int, Tensor]:
        """Phase (a): advance each momentum buffer; return the (Nesterov) update of those in
        `want` (by position), the ones this rank orthogonalises."""
        updates = {}
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            advance_momentum(state["momentum_buffer"], g, group)
            if i in want:
                updates[i] = momentum_update(state["momentum_buffer"], g, group)
        return updates

    def _orthogonalise(
        self, group: dict[str, Any], updates: dict[int, Tensor]
    ) -> dict[int, Tensor]:
        """Phase (b): Newton–Schulz of each update, batched by shape, in `ns_dtype`."""
        g = group
        return orthogonalise(
            updates, g["ns_coefficients"], g["ns_steps"], g["eps"], self.ns_dtype, g["ns_form"]
        )

    def _apply(
        self, group: dict[str, Any], params: dict[int, Tensor], ortho: dict[int, Tensor]
    ) -> None:
        """Phase (c): decoupled weight decay, then the shape-scaled orthogonal step."""
        for i, p in params.items():
            apply_update(p, ortho[i], group, p.shape)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer state, with every momentum buffer, whatever the mode and world size.

        With exchange="reduce_scatter" on several ranks this gathers the owners' buffers, so
        every rank must call it (a rank-0-only call would wait forever for the others).
        """
        sd = super().state_dict()
        if not self.owner_only or not self._any_rank_has_state():
            return sd
        for index, group in enumerate(self.param_groups):
            params = group["params"]
            mine = {
                i: self.state[p]["momentum_buffer"]
                for i, p in enumerate(params)
                if "momentum_buffer" in self.state[p]
            }
            rr = self._round_robin(index, group, range(len(params)))
            buffers = rr.all_gather(mine, params[0].dtype, reuse=False)
            # state_dict() numbers the parameters of all groups in order: group `index` holds
            # the numbers listed in its packed "params".
            numbers = sd["param_groups"][index]["params"]
            for number, buf in zip(numbers, buffers, strict=True):
                sd["state"].setdefault(number, {})["momentum_buffer"] = buf
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state saved by any mode on any world size; keep only my share if owner-only."""
        super().load_state_dict(state_dict)
        if not self.owner_only:
            return
        for index, group in enumerate(self.param_groups):
            rr = self._round_robin(index, group, range(len(group["params"])))
            for p, owner in zip(group["params"], rr.owners, strict=True):
                if owner != self.rank:
                    self.state[p].pop("momentum_buffer", None)

    def _any_rank_has_state(self) -> bool:
        """Whether any rank holds momentum yet (a rank may own no matrix at all)."""
        has = any("momentum_buffer" in s for s in self.state.values())
        device = next(p.device for g in self.param_groups for p in g["params"])
        flag = torch.tensor([float(has)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.process_group)
        return bool(flag.item())
