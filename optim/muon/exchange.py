"""How distributed Muon splits its work between ranks and moves finished tensors between them.

Ownership: matrix i of a param group is orthogonalised by rank `owners[i]`, dealt round-robin
in order of decreasing Newton–Schulz cost (`assign_owners`), so every rank gets about the same
work and every rank computes the same assignment without talking to the others.

Exchanges (dist.parallelism ddp_all_reduce, ddp_all_gather, ddp_owners; optim/parallelism.py),
for W ranks and P Muon values of b bytes each:

- "all_reduce": each rank writes the updates it owns into a zero-filled flat buffer and one SUM
  all-reduce hands everyone everything (x + 0 = x exactly). A ring all-reduce sends
  ≈ 2·(W-1)/W·P·b bytes per rank.
- "all_gather": each rank packs only its own updates and an all-gather delivers every rank's
  pack, ≈ (W-1)/W·P·b per rank: half the all-reduce's bytes. (On gloo the all-gather is a ring
  of point-to-point transfers, which loopback TCP runs ~3x faster than gloo's all_gather.)
- "reduce_scatter": Muon's gradients skip DDP; each rank reduce-scatters its local gradients so
  that owners receive the sum of the matrices they own, updates those, and all-gathers the new
  parameters. Gradient reduction and exchange together cost ≈ 2·(W-1)/W·P·4 bytes per rank, the
  same as DDP's all-reduce of the gradients alone, so the update exchange is free. (On gloo
  both are rings of point-to-point transfers, like the all-gather above.)

Packing: a rank's tensors are laid end to end in index order, padded to the largest rank's
pack so that every rank's buffer has the same size (which gloo and NCCL both require); every
rank unpacks all buffers the same way from the shared ownership.
"""

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from optim.muon.newton_schulz import ns_flops

EXCHANGES = ("all_reduce", "all_gather", "reduce_scatter")
# The dist.parallelism that runs each
PARALLELISM_OF = {"all_reduce": "ddp_all_reduce", "all_gather": "ddp_all_gather",
                  "reduce_scatter": "ddp_owners"}  # fmt: skip


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


def owned_indices(owners: Sequence[int], world_size: int) -> list[list[int]]:
    """For each rank, the indices it owns, in index order."""
    owned: list[list[int]] = [[] for _ in range(world_size)]
    for i, owner in enumerate(owners):
        owned[owner].append(i)
    return owned


class RoundRobin:
    """One param group's ownership over a process group, and the collectives that move its
    matrices between ranks.

    Communication buffers are allocated on first use and reused every step: hundreds of MB
    allocated afresh each step cost more in page faults than the transfer itself on a CPU.
    Tensors returned by a collective are views into those buffers, valid until the same
    collective runs again; pass `reuse=False` for results that must outlive the step.
    """

    def __init__(
        self, shapes: Sequence[Sequence[int]], group: dist.ProcessGroup,
        owners: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        """`owners`: each matrix's rank, where a larger group's ownership is kept (a run of
        it exchanged on its own); default `assign_owners`."""
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.shapes = [torch.Size(s) for s in shapes]
        self.owners = list(owners) if owners is not None else assign_owners(self.shapes, self.world)
        self.owned = owned_indices(self.owners, self.world)
        self.mine = self.owned[self.rank]
        # Every rank's pack is padded to the largest (at least 1 value, so that a rank owning
        # nothing still sends a buffer): collectives need equal sizes on every rank.
        self.pack_size = max(1, *(sum(self.shapes[i].numel() for i in idx) for idx in self.owned))
        self._buffers: dict[tuple, Tensor] = {}
        # Neighbours on the ring of the point-to-point collectives, as global ranks.
        self._next = dist.get_global_rank(group, (self.rank + 1) % self.world)
        self._prev = dist.get_global_rank(group, (self.rank - 1) % self.world)

    def all_reduce(self, mine: dict[int, Tensor], dtype: torch.dtype) -> list[Tensor]:
        """Every rank's tensors on every rank: each fills its own slots of a zeroed buffer, SUM."""
        flat, views = self._zero_filled(mine, dtype)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        return views

    def _zero_filled(self, mine: dict[int, Tensor], dtype: torch.dtype) -> tuple[Tensor, list]:
        """The all-reduce buffer with my tensors in their slots and zeros elsewhere, and each
        matrix's view of it."""
        sizes = [s.numel() for s in self.shapes]
        flat = self._buffer("all_reduce", sum(sizes), dtype, _device_of(mine, self.group))
        slots = flat.split(sizes)
        views = [slot.view(shape) for slot, shape in zip(slots, self.shapes, strict=True)]
        for i, view in enumerate(views):
            if i in mine:
                view.copy_(mine[i])
            else:
                view.zero_()
        return flat, views

    def all_gather(
        self, mine: dict[int, Tensor], dtype: torch.dtype, reuse: bool = True
    ) -> list[Tensor]:
        """Every rank's tensors on every rank: each sends only its own, packed; all-gather."""
        device = _device_of(mine, self.group)
        get = self._buffer if reuse else _fresh
        recv = [get(f"ag_recv{r}", self.pack_size, dtype, device) for r in range(self.world)]
        self._pack(recv[self.rank], [mine[i] for i in self.mine])
        if dist.get_backend(self.group) == "gloo":
            self._ring_all_gather(recv)
        else:
            send = get("ag_send", self.pack_size, dtype, device)
            send.copy_(recv[self.rank])
            dist.all_gather(recv, send, group=self.group)
        return self._unpack_all(recv)

    def _unpack_all(self, recv: list[Tensor]) -> list[Tensor]:
        """Every matrix, in index order, from every rank's pack."""
        out: list[Tensor | None] = [None] * len(self.shapes)
        for r, idx in enumerate(self.owned):
            for i, t in zip(idx, self._unpack(recv[r], idx), strict=True):
                out[i] = t
        return out  # type: ignore[return-value]  # every index has exactly one owner

    def start(self, mine: dict[int, Tensor], dtype: torch.dtype, exchange: str) -> "Pending":
        """`all_gather` or `all_reduce` (`exchange`) started with the backend's own async
        collective: wait on the result to read every rank's tensors. The buffers are this
        object's, reused every step, as in the blocking forms."""
        if exchange == "all_reduce":
            flat, views = self._zero_filled(mine, dtype)
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            return Pending(work, lambda: views)
        device = _device_of(mine, self.group)
        recv = [self._buffer(f"ag_recv{r}", self.pack_size, dtype, device)
                for r in range(self.world)]  # fmt: skip
        send = self._buffer("ag_send", self.pack_size, dtype, device)
        self._pack(send, [mine[i] for i in self.mine])
        work = dist.all_gather(recv, send, group=self.group, async_op=True)
        return Pending(work, lambda: self._unpack_all(recv))

    def _ring_all_gather(self, bufs: list[Tensor]) -> None:
        """All-gather in place by passing packs around a ring of point-to-point transfers.

        Rank r starts with bufs[r] filled; in each of W-1 steps it sends the pack it received
        last to the next rank and receives a new one from the previous, (W-1)/W·P in all. On
        gloo this moves data ~3x faster than its own all_gather (scripts/bench/dist_muon.py).
        """
        for step in range(self.world - 1):
            self._ring_step(
                bufs[(self.rank - step) % self.world], bufs[(self.rank - step - 1) % self.world]
            )

    def reduce_scatter(self, tensors: Sequence[Tensor]) -> dict[int, Tensor]:
        """The SUM over ranks of each tensor, delivered to its owner only: {index: sum} of mine."""
        dtype, device = tensors[0].dtype, tensors[0].device
        size = self.pack_size
        send = [self._buffer(f"rs_send{r}", size, dtype, device) for r in range(self.world)]
        for buf, idx in zip(send, self.owned, strict=True):
            self._pack(buf, [tensors[i] for i in idx])
        if dist.get_backend(self.group) == "gloo":
            mine = self._ring_reduce_scatter(send)
        else:
            mine = self._buffer("rs_recv", size, dtype, device)
            dist.reduce_scatter(mine, send, op=dist.ReduceOp.SUM, group=self.group)
        return dict(zip(self.mine, self._unpack(mine, self.mine), strict=True))

    def _ring_reduce_scatter(self, packs: list[Tensor]) -> Tensor:
        """Reduce-scatter in place around a ring of point-to-point transfers; my summed pack.

        In step s rank r passes its running sum of pack (r-s-1) mod W on to the next rank and
        adds the previous rank's running sum of pack (r-s-2) mod W into its own; after W-1
        steps pack r holds the sum over all ranks: (W-1)/W·P values sent per rank, where
        gloo's own reduce_scatter sends P (scripts/bench/dist_muon.py).
        """
        incoming = self._buffer("rs_incoming", self.pack_size, packs[0].dtype, packs[0].device)
        for step in range(self.world - 1):
            self._ring_step(packs[(self.rank - step - 1) % self.world], incoming)
            packs[(self.rank - step - 2) % self.world].add_(incoming)
        return packs[self.rank]

    def _ring_step(self, outgoing: Tensor, incoming: Tensor) -> None:
        """Send `outgoing` to the next rank while receiving `incoming` from the previous one."""
        ops = [
            dist.P2POp(dist.isend, outgoing, self._next, self.group),
            dist.P2POp(dist.irecv, incoming, self._prev, self.group),
        ]
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    def _buffer(self, name: str, size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        key = (name, dtype, device)
        if key not in self._buffers:
            self._buffers[key] = _fresh(name, size, dtype, device)
        return self._buffers[key]

    def _pack(self, flat: Tensor, tensors: Sequence[Tensor]) -> None:
        offset = 0
        for t in tensors:
            flat[offset : offset + t.numel()].view_as(t).copy_(t)
            offset += t.numel()
        flat[offset:].zero_()  # padding: deterministic bytes on the wire

    def _unpack(self, flat: Tensor, indices: Sequence[int]) -> list[Tensor]:
        out, offset = [], 0
        for i in indices:
            n = self.shapes[i].numel()
            out.append(flat[offset : offset + n].view(self.shapes[i]))
            offset += n
        return out


class Pending:
    """A started exchange: `wait` blocks until it has arrived and returns its tensors."""

    def __init__(self, work: dist.Work | None, result: Callable[[], list[Tensor]]) -> None:
        self.work, self.result = work, result

    def wait(self) -> list[Tensor]:
        if self.work is not None:
            self.work.wait()
        return self.result()


def _fresh(name: str, size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.empty(size, dtype=dtype, device=device)


def _device_of(tensors: dict[int, Tensor], group: dist.ProcessGroup) -> torch.device:
    """Where the tensors live (a rank that owns none uses the group's device)."""
    return next(iter(tensors.values())).device if tensors else _group_device(group)


def check_exchange(exchange: str) -> None:
    """Raise ValueError unless `exchange` names one of the modes above."""
    if exchange not in EXCHANGES:
        raise ValueError(f"Muon exchange must be one of {EXCHANGES}, got {exchange!r}")


def check_supported(exchange: str, group: dist.ProcessGroup, dtypes: Sequence[torch.dtype]) -> None:
    """Fail now, naming the mode and backend, if the backend lacks a collective it needs.

    Runs the mode's collectives once on a few values of each dtype; every rank must call it.
    """
    check_exchange(exchange)
    world = dist.get_world_size(group)
    device = _group_device(group)
    rr = RoundRobin([(1, 2)] * world, group)  # one tiny matrix per rank, the real code paths
    try:
        for dtype in dtypes:
            mine = {i: torch.zeros(1, 2, dtype=dtype, device=device) for i in rr.mine}
            if exchange == "all_reduce":
                rr.all_reduce(mine, dtype)
            else:
                rr.all_gather(mine, dtype)
            if exchange == "reduce_scatter":
                rr.reduce_scatter([torch.zeros(1, 2, dtype=dtype, device=device)] * world)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        others = " | ".join(v for k, v in PARALLELISM_OF.items() if k != exchange)
        raise ValueError(
            f"dist.parallelism={PARALLELISM_OF[exchange]} is not supported by the "
            f"{dist.get_backend(group)} backend here ({e}); choose another: {others}"
        ) from e


def _group_device(group: dist.ProcessGroup) -> torch.device:
    """Where the group's collectives take tensors: the current GPU for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
