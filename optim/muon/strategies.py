"""The ways a Muon step is shared between ranks, behind one interface (`Strategy`).

`Muon.step` (optim/muon/optimizer.py) runs one skeleton for every param group: momentum →
orthogonalise → apply. A strategy answers the three questions that differ between
distributed arrangements:

- `gradients`: which matrices' momentum this rank advances, from which gradient (its own
  averaged copy, a gradient reduced to its owner, or its local shard), and which of them it
  orthogonalises;
- `orthogonalise`: how the Newton–Schulz results reach the ranks that apply them (locally, an
  exchange of finished updates, shards sent to an owner and back, or tensor-parallel);
- `finish`: anything after the update (owners sending their new parameters).

This module holds the strategies for whole (replicated) parameters: `Strategy` itself (one
process), `Replicated` (dist.parallelism=ddp_all_gather or ddp_all_reduce) and `OwnerOnly`
(ddp_owners). The sharded ones (fsdp_gather, fsdp_tp) are in optim/muon/fsdp_strategies.py. Every
strategy gives the parameters a single process would, bit for bit (tests/e2e/test_dist_muon.py).
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from optim.muon.exchange import RoundRobin, check_supported

NewtonSchulz = Callable[[dict[int, Tensor]], dict[int, Tensor]]
Group = dict[str, Any]  # a param group: "params" and its settings


def require_every_gradient(group: Group, index: int, who: str) -> None:
    """Raise naming the parameters of param group `index` without a gradient. Where ownership
    and the collectives cover the whole group, a rank skipping a matrix would desynchronise
    every exchange, so a missing gradient is an error, not a skip."""
    missing = [i for i, p in enumerate(group["params"]) if p.grad is None]
    if missing:
        raise RuntimeError(
            f"{who} needs a gradient for every parameter on every rank; parameters {missing} "
            f"of group {group.get('name', index)!r} have none"
        )


class Strategy:
    """The interface, and the one-process way: every matrix with a gradient, orthogonalised
    here."""

    owner_only = False  # momentum lives with each matrix's owner only (state_dict gathers)
    reduces_gradients = False  # averages its own gradients across ranks (DDP must not)
    sharded = False  # the parameters are FSDP2 dim-0 shards
    eager_state = False  # every momentum buffer exists from construction (sharded runs)

    def __init__(self, newton_schulz: NewtonSchulz) -> None:
        self.newton_schulz = newton_schulz

    def check_param(self, p: Tensor) -> None:
        """Raise ValueError if `p` can't be stepped this way."""

    def setup(self, groups: list[dict[str, Any]], ns_dtype: torch.dtype) -> None:
        """Called once all groups are added (a collective for distributed strategies)."""

    def gradients(self, index: int, group: Group) -> tuple[dict[int, Tensor], set[int]] | None:
        """For param group `index`: {i: the gradient matrix i's momentum takes on this rank},
        and the i this rank orthogonalises (the update of the others is not needed here); None
        to skip the group (no matrix has a gradient: the same on every rank)."""
        grads = {i: p.grad for i, p in enumerate(group["params"]) if p.grad is not None}
        return (grads, set(grads)) if grads else None

    def order(self, index: int, group: Group, grads: dict[int, Tensor]) -> list[int]:
        """The order the momentum takes the matrices of `grads` in (one whose exchange starts
        during the momentum, `taken`, wants its first bucket's matrices first)."""
        return list(grads)

    def taken(self, index: int, group: Group, i: int, updates: dict[int, Tensor]) -> None:
        """Matrix i's momentum is done: its gradient is read for the last time, and its
        update (if this rank orthogonalises it) is updates[i]."""

    def orthogonalise(
        self, index: int, group: Group, updates: dict[int, Tensor]
    ) -> dict[int, Tensor]:
        """{i: the orthogonalised update this rank applies to matrix i (or its rows)}."""
        return self.newton_schulz(updates)

    def finish(self, index: int, group: Group) -> None:
        """After the update."""


class _RoundRobin(Strategy):
    """Ownership of each group's matrices over a process group (`RoundRobin`), cached by
    which matrices take part."""

    def __init__(
        self, newton_schulz: NewtonSchulz, group: dist.ProcessGroup, exchange: str
    ) -> None:
        super().__init__(newton_schulz)
        self.group, self.exchange = group, exchange
        self.world = dist.get_world_size(group)
        self._cache: dict[tuple, RoundRobin] = {}

    def setup(self, groups: list[dict[str, Any]], ns_dtype: torch.dtype) -> None:
        # Collective: a mode the backend can't run fails here, not at the first step.
        dtypes = {ns_dtype, *(p.dtype for g in groups for p in g["params"])}
        check_supported(self.exchange, self.group, sorted(dtypes, key=str))

    def round_robin(self, index: int, params: list[Tensor], members: Sequence[int]) -> RoundRobin:
        key = (index, tuple(members))
        if key not in self._cache:
            self._cache[key] = RoundRobin([params[i].shape for i in members], self.group)
        return self._cache[key]


class Replicated(_RoundRobin):
    """ddp_all_gather | ddp_all_reduce: DDP has averaged every gradient, every rank advances
    every momentum (replicated state), orthogonalises the matrices it owns, and the finished
    updates are exchanged, so every rank applies all of them.

    With `overlap` the exchange goes run by run (`runs`: matrices that share no Newton–Schulz
    batch with the others): each run's collective starts, async, as soon as its matrices are
    orthogonalised and travels while the next run computes; the largest run goes first, so
    the one exchange left to wait for at the end is the smallest. Ownership is the whole
    group's either way, and a run's Newton–Schulz alone gives the bits of one call over all,
    so both ways give the same bits."""

    def __init__(self, newton_schulz: NewtonSchulz, group: dist.ProcessGroup, exchange: str,
                 ns_dtype: torch.dtype, overlap: str = "auto",
                 runs: Callable[[dict[int, Tensor]], list[list[int]]] | None = None,
                 ) -> None:  # fmt: skip
        super().__init__(newton_schulz, group, exchange)
        self.ns_dtype = ns_dtype
        # Gloo's async all-gather is slower than the blocking ring (optim/muon/exchange.py).
        self.overlap = overlap == "async" or (
            overlap == "auto" and dist.get_backend(group) == "nccl"
        )
        if self.overlap and runs is None:
            raise ValueError("an overlapped exchange needs the Newton–Schulz runs (`runs`)")
        self.runs = runs
        self._members: dict[int, list[int]] = {}
        self._run_exchanges: dict[tuple, list[tuple[list[int], RoundRobin]]] = {}

    def gradients(self, index: int, group: Group) -> tuple[dict[int, Tensor], set[int]] | None:
        params = group["params"]
        members = [i for i, p in enumerate(params) if p.grad is not None]
        if not members:  # DDP gives every rank the same gradients: all skip alike
            return None
        self._members[index] = members
        rr = self.round_robin(index, params, members)
        return {i: params[i].grad for i in members}, {members[k] for k in rr.mine}

    def orthogonalise(
        self, index: int, group: Group, updates: dict[int, Tensor]
    ) -> dict[int, Tensor]:
        members = self._members[index]
        if self.overlap:
            return self._overlapped(index, group["params"], members, updates)
        rr = self.round_robin(index, group["params"], members)
        position = {i: k for k, i in enumerate(members)}
        mine = {position[i]: o for i, o in self.newton_schulz(updates).items()}
        share = rr.all_gather if self.exchange == "all_gather" else rr.all_reduce
        return dict(zip(members, share(mine, self.ns_dtype), strict=True))

    def _overlapped(self, index: int, params: list[Tensor], members: list[int],
                    updates: dict[int, Tensor]) -> dict[int, Tensor]:  # fmt: skip
        pending = []
        for run, rr in self._exchanges_by_run(index, params, members):
            ortho = self.newton_schulz({i: updates[i] for i in run if i in updates})
            mine = {k: ortho[i] for k, i in enumerate(run) if i in ortho}
            pending.append((run, rr.start(mine, self.ns_dtype, self.exchange)))
        out: dict[int, Tensor] = {}
        for run, exchange in pending:
            out.update(zip(run, exchange.wait(), strict=True))
        return out

    def _exchanges_by_run(
        self, index: int, params: list[Tensor], members: list[int]
    ) -> list[tuple[list[int], RoundRobin]]:
        """Each run of the group's matrices (largest first) with its own exchange, which
        keeps the whole group's owners."""
        key = (index, tuple(members))
        if key not in self._run_exchanges:
            owner = dict(zip(members, self.round_robin(index, params, members).owners,
                             strict=True))  # fmt: skip
            runs = self.runs({i: params[i] for i in members})  # type: ignore[misc]
            runs.sort(key=lambda run: (-sum(params[i].numel() for i in run), run[0]))
            self._run_exchanges[key] = [
                (run, RoundRobin([params[i].shape for i in run], self.group,
                                 [owner[i] for i in run]))
                for run in runs
            ]  # fmt: skip
        return self._run_exchanges[key]


class OwnerOnly(_RoundRobin):
    """ddp_owners: Muon's gradients skip DDP. Each owner receives the average of
    its matrices' gradients (one reduce-scatter), keeps their momentum, updates them, and
    all-gathers the new parameters. `state_dict` gathers the owners' momentum, so it is a
    collective and its result does not depend on the world size."""

    owner_only = True
    reduces_gradients = True

    def __init__(self, newton_schulz: NewtonSchulz, group: dist.ProcessGroup) -> None:
        super().__init__(newton_schulz, group, "reduce_scatter")

    def gradients(self, index: int, group: Group) -> tuple[dict[int, Tensor], set[int]]:
        params = group["params"]
        require_every_gradient(group, index, "Muon under dist.parallelism=ddp_owners")
        rr = self.round_robin(index, params, range(len(params)))
        grads = rr.reduce_scatter([p.grad for p in params])
        for g in grads.values():
            g.div_(self.world)  # the SUM over ranks -> the average DDP would have given
        return grads, set(grads)

    def finish(self, index: int, group: Group) -> None:
        params = group["params"]
        rr = self.round_robin(index, params, range(len(params)))
        mine = {i: params[i] for i in rr.mine}
        for i, value in enumerate(rr.all_gather(mine, params[0].dtype)):
            if rr.owners[i] != rr.rank:
                params[i].copy_(value)

    def owned(self, index: int, params: list[Tensor]) -> list[bool]:
        """Whether this rank owns each matrix of param group `index`."""
        rr = self.round_robin(index, params, range(len(params)))
        return [owner == rr.rank for owner in rr.owners]

    def gather_buffers(
        self, index: int, params: list[Tensor], mine: dict[int, Tensor]
    ) -> list[Tensor]:
        """Every matrix's momentum buffer on every rank, from the owners' `mine`."""
        rr = self.round_robin(index, params, range(len(params)))
        return rr.all_gather(mine, params[0].dtype, reuse=False)

    def any_rank(self, has: bool, device: torch.device) -> bool:
        """Whether `has` holds on any rank (a collective)."""
        flag = torch.tensor([float(has)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())
