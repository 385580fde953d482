"""Muon's strategies for FSDP2-sharded matrices: `ShardedOwners` and `ShardedTP`.

Under an fsdp `dist.parallelism` (fsdp_gather, fsdp_tp) a rank holds only a dim-0 shard of each
matrix and of its gradient (`optim/fsdp_rows.py`), but Newton–Schulz needs the whole matrix. A
step, per param group:

(a) momentum on the local shards, in fp32 (elementwise: shards of the whole result);
(b) one packed `all_to_all_single` per bucket sends every shard of matrix i, cast to the
    Newton–Schulz dtype, to the rank that owns i (`assign_owners`: cost-balanced, the same
    on every rank); the owner puts the shards in place and runs the same batched
    Newton–Schulz as one process (`orthogonalise`);
(c) the inverse `all_to_all_single` returns to every rank its rows of each result, and each
    rank applies weight decay and the update to its shard, with the LR scale of the *global*
    shape.

That is `fsdp_gather` (`ShardedOwners`). It takes any layout whose pieces are blocks
(optim/blocks.py): FSDP2's rows, HSDP's (exchanged within each replica group), and FSDP beside
tensor parallelism on a 2-D mesh, where a row-parallel weight is cut into blocks of rows and
columns and a column-parallel one into rows twice over; each piece goes to the owner as a box
and comes back as one. Matrices cut among different ranks are planned apart
(optim/muon/exchange_plan.py). `fsdp_tp` (`ShardedTP`)
replaces (b) and (c) with
tensor-parallel Newton–Schulz on the row shards in place (`orthogonalise_row_shards`: per
iteration one all_reduce of the cols×cols Gram matrices of all 2-D matrices of a shape; the
dim-0 shards of a stacked weight are whole matrices, orthogonalised locally). No rank holds a
whole matrix; the results equal one process's up to rounding, bitwise only for stacked
weights. It suits tall matrices; a wide one needs the Gram matrix of its long side.

A bucket is one Newton–Schulz shape class (a 768×3072 and a 3072×768 share one), or with
optim.muon.exchange_chunk a run of at most that many of its matrices, so each bucket is one
batched Newton–Schulz; optim.muon.exchange_in_flight bounds how many buckets' exchanges are
live at once, and so their buffers. The momentum runs bucket by bucket, and each bucket's
shards leave (async) as soon as its last matrix's momentum is done, so the first exchange
travels while the rest of the momentum is computed; the owners orthogonalise bucket k while
later buckets are still in flight, and each result goes back (async) as soon as it is ready.
Each gradient is dropped once its momentum has read it (optim.muon.free_grads), so the
gradients' memory is free before the exchange's buffers are taken. Expert stacks
(optim.muon.expert_keys) take no exchange: a dim-0 shard of an (E, out, in) stack is whole
experts, orthogonalised on the rank that holds them while the first buckets are in flight.
No rank ever materialises a whole parameter: owners see whole *updates*, of the matrices they
own only.

A rank holds P/W values and sends the (W-1)/W of them that other ranks own, then receives as
many back: 2·(W-1)/W²·P·b bytes per rank per step (b: the Newton–Schulz dtype's size). For
W=2 that equals the replicated all_gather exchange, (W-1)/W·P·b; for more ranks it is
about 2/W of it. Because every cast, concatenation and Newton–Schulz runs on the same values
in the same order as in one process, the parameters stay bitwise equal to single-process
Muon given the same averaged gradients (tests/e2e/test_sharded_muon.py). Momentum buffers are
DTensors sharded like their parameters, created with the optimizer, so every rank has its
state from the start.
"""

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from optim.blocks import boxes, exchange_group, slices
from optim.config import MuonConfig
from optim.fsdp_rows import is_dtensor, local, shard_group
from optim.muon.exchange_plan import Bucket, ExchangePlan, GroupPlan, SubPlan
from optim.muon.newton_schulz import chosen_coefficients
from optim.muon.stacks import is_expert_stack
from optim.muon.strategies import Group, NewtonSchulz, Strategy, require_every_gradient
from optim.muon.tp_newton_schulz import check_tp_form, orthogonalise_row_shards


class ShardedOwners(Strategy):
    """fsdp_gather: each matrix's shards go to its owner, which orthogonalises the
    whole matrix; its rows come back (the module docstring)."""

    sharded = True
    eager_state = True

    early_sends = True  # buckets sent as soon as their momentum is done (ShardedTP: none)

    def __init__(
        self, newton_schulz: NewtonSchulz, ns_dtype: torch.dtype, in_flight: int = 0,
        chunk: int = 0, free_grads: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(newton_schulz)
        self.ns_dtype = ns_dtype
        self.in_flight = in_flight  # buckets whose exchange buffers may be live at once; 0: all
        self.chunk = chunk  # matrices per bucket (ExchangePlan)
        self.free_grads = free_grads  # drop each gradient once its momentum has taken it
        self._plans: dict[int, GroupPlan] = {}
        self._sent: dict[int, tuple] = {}  # bucket j's exchange, started during the momentum
        self._pending: dict[int, int] = {}  # bucket j -> its matrices whose momentum is to come
        self.peak_bytes = 0  # the most exchange-buffer bytes live at once, over every step
        # ... and with the bytes of the local gradients still held then: what freeing each
        # gradient once taken (free_grads) saves at the exchange's peak
        self.peak_held_bytes = 0

    def check_param(self, p: Tensor) -> None:
        if is_dtensor(p):  # its exchange group, made now: a collective on every rank alike
            exchange_group(p)

    def gradients(self, index: int, group: Group) -> tuple[dict[int, Tensor], set[int]]:
        params = group["params"]
        require_every_gradient(group, index, "sharded Muon")
        return {i: local(p.grad) for i, p in enumerate(params)}, set(range(len(params)))

    def order(self, index: int, group: Group, grads: dict[int, Tensor]) -> list[int]:
        """Bucket by bucket, expert stacks last: the first bucket's shards can leave while
        the momentum of the others is computed (`taken`)."""
        gp = self._plan(index, group["params"])
        limit = (self.in_flight or len(gp.buckets)) if self.early_sends else 0
        self._sent = {}
        self._pending = {j: len(b.indices) for j, (_, b) in enumerate(gp.buckets[:limit])}
        return [sp.members[k] for sp, b in gp.buckets for k in b.indices] + gp.kept

    def taken(self, index: int, group: Group, i: int, updates: dict[int, Tensor]) -> None:
        if self.free_grads:
            group["params"][i].grad = None
        gp = self._plan(index, group["params"])
        j = gp.bucket_of.get(i)
        if j in self._pending:
            self._pending[j] -= 1
            if not self._pending[j]:  # the bucket's last matrix: its shards can go
                sp, bucket = gp.buckets[j]
                shards = {k: updates[sp.members[k]] for k in bucket.indices}
                self._sent[j] = self._to_owners(sp, bucket, shards)

    def orthogonalise(
        self, index: int, group: Group, updates: dict[int, Tensor]
    ) -> dict[int, Tensor]:
        """Shards to owners, whole-matrix Newton–Schulz, rows back: this rank's rows of each
        orthogonalised matrix.

        A bucket's exchange is live from the send of its shards until its rows are back in
        place. With `in_flight` = k > 0 at most k buckets are live at once: the (k+1)-th is
        sent only once the oldest is unpacked, so the buffers of at most k buckets exist
        together (0: every bucket's at once). Every bucket computes the same values either
        way; only when each exchange starts and is waited for differs."""
        every = group["params"]
        gp = self._plan(index, every)
        n = len(gp.buckets)
        limit = self.in_flight or n
        outgoing: dict[int, tuple] = {}
        returning: dict[int, tuple] = {}
        out: dict[int, Tensor] = {}
        unpacked = 0
        for j in range(min(limit, n)):  # started during the momentum, unless it was not
            outgoing[j] = self._sent.pop(j, None) or self._send(gp, j, updates)
        here = self.newton_schulz({i: updates[i] for i in gp.kept}) if gp.kept else {}
        held = sum(local(p.grad).nbytes for p in every if p.grad is not None)
        for j, (sp, bucket) in enumerate(gp.buckets):
            arrived = outgoing.pop(j)
            _wait(arrived[0])
            ortho = self.newton_schulz(self._assemble(sp.plan, bucket, arrived[1]))
            returning[j] = self._to_shards(sp, bucket, ortho, arrived[1].device)
            self._count([*outgoing.values(), *returning.values(), arrived], held)
            del arrived, ortho
            if j + limit < n:  # room for the next send once the oldest is home
                self._unpack(gp, unpacked, returning.pop(unpacked), every, out)
                unpacked += 1
                outgoing[j + limit] = self._send(gp, j + limit, updates)
        for j in range(unpacked, n):
            self._unpack(gp, j, returning.pop(j), every, out)
        return {**out, **here}

    def _send(self, gp: GroupPlan, j: int, updates: dict[int, Tensor]) -> tuple:
        sp, bucket = gp.buckets[j]
        return self._to_owners(sp, bucket, {k: updates[sp.members[k]] for k in bucket.indices})

    def _unpack(
        self, gp: GroupPlan, j: int, exchange: tuple, every: list[Tensor], out: dict
    ) -> None:
        """Bucket j's pieces, back from their owners, into `out` by group index (views of
        the buffer)."""
        sp, bucket = gp.buckets[j]
        work, received, _ = exchange
        _wait(work)
        offset = 0
        for owner in range(sp.plan.world):
            for k in sp.plan.owned_by(bucket, owner):
                i = sp.members[k]
                n = sp.plan.numel(k, sp.plan.rank)
                out[i] = received[offset : offset + n].view(local(every[i]).shape)
                offset += n

    def _count(self, live: list[tuple], held: int) -> None:
        """Track the peak bytes of the exchange buffers live now (each exchange's send and
        receive buffers: one tensor in one process), alone and with `held` gradient bytes."""
        buffers = {id(t): t for _, received, send in live for t in (received, send)}
        total = sum(t.numel() * t.element_size() for t in buffers.values())
        self.peak_bytes = max(self.peak_bytes, total)
        self.peak_held_bytes = max(self.peak_held_bytes, total + held)

    def _plan(self, index: int, every: list[Tensor]) -> GroupPlan:
        """Param group `index`'s plan, made at its first step (a collective: each exchange
        group gathers its ranks' boxes)."""
        if index not in self._plans:
            # An expert stack cut only along its expert dim is whole experts: they are
            # orthogonalised where they live, while the other matrices' exchanges are in
            # flight (optim/muon/stacks.py); one cut across its matrices is exchanged.
            kept = [i for i, p in enumerate(every) if is_expert_stack(p) and _whole_matrices(p)]
            by_group: dict[dist.ProcessGroup | None, list[int]] = {}
            for i, p in enumerate(every):
                if i not in kept:
                    by_group.setdefault(exchange_group(p) if is_dtensor(p) else None, []).append(i)
            subplans = []
            for pg, members in by_group.items():  # in the order of their first matrix
                world, rank = (dist.get_world_size(pg), dist.get_rank(pg)) if pg else (1, 0)
                params = [every[i] for i in members]
                plan = ExchangePlan([p.shape for p in params], world, rank, self.chunk,
                                    boxes(params, pg))  # fmt: skip
                subplans.append(SubPlan(plan, pg, members))
            buckets = [(sp, b) for sp in subplans for b in sp.plan.buckets]
            bucket_of = {sp.members[k]: j for j, (sp, b) in enumerate(buckets) for k in b.indices}
            self._plans[index] = GroupPlan(subplans, buckets, kept, bucket_of)
        return self._plans[index]

    def _to_owners(self, sp: SubPlan, bucket: Bucket, updates: Mapping[int, Tensor]) -> tuple:
        """Start sending my piece of each matrix in `bucket` to its owner, packed by owner."""
        device = updates[bucket.indices[0]].device
        send = torch.empty(sum(bucket.send), dtype=self.ns_dtype, device=device)
        offset = 0
        for dest in range(sp.plan.world):
            for k in sp.plan.owned_by(bucket, dest):
                n = updates[k].numel()
                send[offset : offset + n].view_as(updates[k]).copy_(updates[k])
                offset += n
        return self._all_to_all(sp.group, send, bucket.recv, bucket.send)

    def _assemble(self, plan: ExchangePlan, bucket: Bucket, received: Tensor) -> dict:
        """The whole update of each matrix I own: the pieces from every rank, in rank order,
        each in its box."""
        whole = {
            k: torch.empty(plan.shapes[k], dtype=self.ns_dtype, device=received.device)
            for k in bucket.mine
        }
        offset = 0
        for src in range(plan.world):
            for k in bucket.mine:
                b, n = plan.boxes[k][src], plan.numel(k, src)
                whole[k][slices(b)].copy_(received[offset : offset + n].view(b[1]))
                offset += n
        return whole

    def _to_shards(
        self, sp: SubPlan, bucket: Bucket, ortho: dict[int, Tensor], device: torch.device
    ) -> tuple:
        """Start sending every rank its piece of each orthogonalised matrix I own."""
        plan = sp.plan
        send = torch.empty(sum(bucket.recv), dtype=self.ns_dtype, device=device)
        offset = 0
        for dest in range(plan.world):
            for k in bucket.mine:
                b, n = plan.boxes[k][dest], plan.numel(k, dest)
                send[offset : offset + n].view(b[1]).copy_(ortho[k][slices(b)])
                offset += n
        return self._all_to_all(sp.group, send, bucket.send, bucket.recv)

    def _all_to_all(
        self, group: dist.ProcessGroup | None, send: Tensor, recv_splits: list[int],
        send_splits: list[int],
    ) -> tuple:  # fmt: skip
        if group is None:
            return None, send, send
        received = torch.empty(sum(recv_splits), dtype=send.dtype, device=send.device)
        work = dist.all_to_all_single(
            received, send, recv_splits, send_splits, group=group, async_op=True
        )
        return work, received, send  # the send buffer stays referenced until the wait


class ShardedTP(ShardedOwners):
    """fsdp_tp: tensor-parallel Newton–Schulz of the row shards, in place
    (`orthogonalise_row_shards`); no rank holds a whole matrix."""

    early_sends = False  # no exchange to start: each iteration all-reduces Gram matrices

    def __init__(self, newton_schulz: NewtonSchulz, ns_dtype: torch.dtype, hp: MuonConfig) -> None:
        super().__init__(newton_schulz, ns_dtype, free_grads=hp.free_grads)
        check_tp_form(hp.ns_form)
        self.hp = hp
        self.group: dist.ProcessGroup | None = None
        self._has_params = False

    def check_param(self, p: Tensor) -> None:
        group = None
        if is_dtensor(p):  # dim-0 rows on one mesh dim (HSDP: within the shard group)
            try:
                group = shard_group(p)
            except ValueError as e:
                raise ValueError(
                    f"dist.parallelism=fsdp_tp orthogonalises dim-0 row shards: {e}; "
                    "fsdp_gather exchanges any blocks"
                ) from e
        if self._has_params and group is not self.group:
            raise ValueError("every parameter of a sharded Muon must be sharded on the same mesh")
        self.group, self._has_params = group, True

    def orthogonalise(
        self, index: int, group: Group, updates: dict[int, Tensor]
    ) -> dict[int, Tensor]:
        if self.group is None:
            return self.newton_schulz(updates)
        hp = self.hp.for_group(group)
        shapes = [p.shape for p in group["params"]]
        return orthogonalise_row_shards(
            updates, shapes, self.group, chosen_coefficients(hp), hp.ns_steps, hp.eps,
            self.ns_dtype, hp.ns_form,
        )  # fmt: skip


def _whole_matrices(p: Tensor) -> bool:
    """Whether every rank's piece of stack `p` is whole matrices (cut on leading dims only)."""
    if not is_dtensor(p):
        return True
    cut = [x.dim for x in p.placements if hasattr(x, "dim")]  # Shard and _StridedShard
    return all(d < p.ndim - 2 for d in cut)


def _wait(work: dist.Work | None) -> None:
    if work is not None:
        work.wait()
