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

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.optim.optimizer import ParamsT

from optim.exchange import EXCHANGES, RoundRobin, check_exchange, check_supported
from optim.newton_schulz import COEFFICIENT_SETS, NS_DTYPES, coefficient_set, orthogonalise

# `lr_scale`: the factor on the LR of a (rows, cols) matrix.
LR_SCALES: dict[str, Callable[[int, int], float]] = {
    "original": lambda rows, cols: math.sqrt(max(1.0, rows / cols)),  # Keller Jordan's
    "match_rms_adamw": lambda rows, cols: 0.2 * math.sqrt(max(rows, cols)),  # Moonshot's
    "none": lambda rows, cols: 1.0,
}


@dataclass
class MuonConfig:
    """The `optim.muon` settings; their defaults are also `Muon`'s constructor defaults."""

    lr: float = 0.02  # base LR before the shape scale below
    momentum: float = 0.95  # momentum after warmup
    momentum_warmup_start: float = 0.85  # momentum at step 0, raised linearly to `momentum`
    momentum_warmup_steps: int = 300  # steps of that linear warmup; 0 = constant momentum
    nesterov: bool = True  # Nesterov-style lookahead on the momentum buffer
    ns_steps: int = 5  # Newton-Schulz iterations (polar_express has 5 tuned steps)
    # classic: Keller Jordan's quintic | polar_express: per-iteration (optim/newton_schulz.py)
    ns_coefficients: str = field(default="classic", metadata={"choices": COEFFICIENT_SETS})
    # LR factor by shape: original = max(1, rows/cols)**0.5 | match_rms_adamw = 0.2*sqrt(max) | none
    lr_scale: str = field(default="original", metadata={"choices": LR_SCALES})
    weight_decay: float = 0.0  # decoupled: p *= 1 - lr * weight_decay
    eps: float = 1e-7  # added to the Frobenius norm before normalising
    # Newton–Schulz precision: bf16 | fp32 | auto = bf16 on CUDA and on CPUs with native bf16,
    # fp32 elsewhere (emulated bf16 matmuls are several times slower than fp32)
    ns_dtype: str = field(default="auto", metadata={"choices": NS_DTYPES})
    # How ranks share Newton–Schulz work (optim/exchange.py; one process ignores it):
    # all_gather: each rank sends its own updates (fastest in scripts/bench_dist_muon.py) |
    # all_reduce: updates summed into a zeroed buffer (twice the bytes) | reduce_scatter: Muon
    # gradients skip DDP and go to their owners, updated parameters are gathered (least traffic
    # in all; momentum then lives on the owner and state_dict() is a collective)
    exchange: str = field(default="all_gather", metadata={"choices": EXCHANGES})

    def validate(self) -> None:
        """Raise ValueError naming the `optim.muon.*` key that is wrong."""
        check_settings(vars(self), "optim.muon.")
        if not 0.0 <= self.momentum_warmup_start < 1.0:
            raise ValueError(
                f"optim.muon.momentum_warmup_start must be in [0, 1), got "
                f"{self.momentum_warmup_start}"
            )
        if self.momentum_warmup_steps < 0:
            raise ValueError("optim.muon.momentum_warmup_steps must be >= 0")


def check_settings(settings: Mapping[str, Any], where: str) -> None:
    """Muon's rules for its hyperparameters, for a param group ("Muon ") and for the config
    ("optim.muon."): raise ValueError naming the first bad one, prefixed by `where`."""
    if not settings["lr"] >= 0:
        raise ValueError(f"{where}lr must be >= 0, got {settings['lr']}")
    if not 0 <= settings["momentum"] < 1:
        raise ValueError(f"{where}momentum must be in [0, 1), got {settings['momentum']}")
    steps = settings["ns_steps"]
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"{where}ns_steps must be an integer >= 1, got {steps!r}")
    for key, check in (("ns_coefficients", coefficient_set), ("lr_scale", _lr_scale)):
        try:
            check(settings[key])
        except ValueError as e:
            raise ValueError(f"{where}{e}") from None
    if not settings["weight_decay"] >= 0:
        raise ValueError(f"{where}weight_decay must be >= 0, got {settings['weight_decay']}")
    if not settings["eps"] > 0:
        raise ValueError(f"{where}eps must be > 0, got {settings['eps']}")


def _lr_scale(name: str) -> Callable[[int, int], float]:
    if name not in LR_SCALES:
        raise ValueError(f"lr_scale must be one of {sorted(LR_SCALES)}, got {name!r}")
    return LR_SCALES[name]


def lr_scale_factor(shape: Sequence[int], lr_scale: str) -> float:
    """The factor multiplying the LR of a matrix of `shape` (rows, cols) under `lr_scale`."""
    rows, cols = shape
    return _lr_scale(lr_scale)(rows, cols)


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
        ns_steps: int = MuonConfig.ns_steps,
        ns_coefficients: str = MuonConfig.ns_coefficients,
        lr_scale: str = MuonConfig.lr_scale,
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
            "ns_steps": ns_steps,
            "ns_coefficients": ns_coefficients,
            "lr_scale": lr_scale,
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
                if p.ndim != 2:
                    raise ValueError(
                        f"Muon only takes 2-D parameters, got one of shape {tuple(p.shape)}; "
                        "give embeddings, gains and biases to AdamW"
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
        momentum = group["momentum"]
        updates = {}
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(g, 1 - momentum)
            if i in want:
                # Without Nesterov the update *is* the buffer: later phases only read it.
                updates[i] = g.lerp(buf, momentum) if group["nesterov"] else buf
        return updates

    def _orthogonalise(
        self, group: dict[str, Any], updates: dict[int, Tensor]
    ) -> dict[int, Tensor]:
        """Phase (b): Newton–Schulz of each update, batched by shape, in `ns_dtype`."""
        return orthogonalise(
            updates, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype
        )

    def _apply(
        self, group: dict[str, Any], params: dict[int, Tensor], ortho: dict[int, Tensor]
    ) -> None:
        """Phase (c): decoupled weight decay, then the shape-scaled orthogonal step."""
        lr = group["lr"]
        for i, p in params.items():
            p.mul_(1 - lr * group["weight_decay"])
            # A tall matrix's update is a transposed view; adding it to a row-major parameter
            # walks memory column-wise, 2-3x slower on a CPU than transposing it first.
            update = ortho[i].contiguous()
            p.add_(update, alpha=-lr * lr_scale_factor(p.shape, group["lr_scale"]))

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
