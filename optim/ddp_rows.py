"""Whole tensors' rows shared out between ranks (`dist.parallelism=ddp_row_shards`), and the two
collectives that move them: gradients to their rows' owners, updated rows back to everyone.

Rank r of W owns rows [r·c, (r + 1)·c) ∩ [0, R) of a tensor of R rows, c = ⌈R/W⌉ (the cut of
`torch.chunk`, optim/fsdp_rows.py's `row_counts`): the last ranks short or empty. A Muon
bank's rows are its matrices, an Adam table's its rows.

`RowExchange` packs a list of same-dtype tensors into one flat buffer, rank-major (rank r's
segment holds its rows of every tensor, each padded to c rows), so that each direction is one
collective:

- `reduce`: the local gradients packed and summed by `reduce_scatter_tensor`, and each rank
  divides the sum of its own rows by W: the average over ranks, at 1/W of the bytes of
  dividing the whole packed buffer first. DDP divides each gradient before its all-reduce;
  for W a power of two the two agree bit for bit (a division by 2ᵏ is exact, so
  a/W + b/W = (a + b)/W), which every record's W (1, 2, 8) is;
- `gather`: each rank's updated rows packed into its segment, `all_gather_into_tensor`, and
  every tensor's rows copied into place on every rank.

Both run asynchronously: `reduce` and `gather` return at once, `wait_reduced` and `unpack`
wait. Per step a rank sends (W − 1)/W of the packed values each way: for parameters updated
every step that is what DDP's all-reduce of the gradients alone costs, and the update is
spread over the ranks instead of repeated on each.

`Comm` is the seam between this and `torch.distributed`: `ProcessComm` runs the collectives
over a process group; `LocalView` runs none and computes rank r's share of a W-rank step as if
every rank held this process's gradients, so one GPU can time the per-GPU step of a W-GPU run
without the communication (scripts/bench/gpu.py --world).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor


class Comm(Protocol):
    """The collectives a sharded step needs; each returns a handle to wait on (or None)."""

    world: int
    rank: int
    local: bool  # no other rank exists (LocalView): the others' rows keep their values

    def reduce_scatter(self, out: Tensor, inp: Tensor) -> "dist.Work | None": ...
    def all_gather(self, out: Tensor, inp: Tensor) -> "dist.Work | None": ...
    def all_reduce(self, t: Tensor) -> "dist.Work | None": ...


class ProcessComm:
    """`Comm` over a process group, asynchronous (the group passed explicitly)."""

    local = False

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def reduce_scatter(self, out: Tensor, inp: Tensor) -> dist.Work | None:
        # torch 2.13 names it reduce_scatter_single (the old name warns); older ones lack it
        fn = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        return fn(out, inp, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def all_gather(self, out: Tensor, inp: Tensor) -> dist.Work | None:
        fn = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        return fn(out, inp, group=self.group, async_op=True)

    def all_reduce(self, t: Tensor) -> dist.Work | None:
        return dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group, async_op=True)


class LocalView:
    """Rank `rank`'s share of a `world`-rank step, computed in one process with no
    communication, as if every rank held this process's gradients (their sum is then
    `world` times them) and the other ranks' rows stayed as they are."""

    local = True

    def __init__(self, world: int, rank: int = 0) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, {world}), got {rank}")
        self.world, self.rank = world, rank

    def reduce_scatter(self, out: Tensor, inp: Tensor) -> None:
        out.copy_(inp.view(self.world, -1)[self.rank]).mul_(self.world)

    def all_gather(self, out: Tensor, inp: Tensor) -> None:
        out.view(self.world, -1)[self.rank].copy_(inp)

    def all_reduce(self, t: Tensor) -> None:
        t.mul_(self.world)


@dataclass(frozen=True)
class Sum:
    """a + b, added as it is packed for a reduction (one pass: not written back to a)."""

    a: Tensor
    b: Tensor


def wait(handle: "dist.Work | None") -> None:
    if handle is not None:
        handle.wait()


@dataclass(frozen=True)
class Rows:
    """How one tensor's R rows (of `size` values each) are cut: c per rank, and this rank's
    [start, stop)."""

    rows: int
    size: int
    chunk: int
    start: int
    stop: int

    @property
    def mine(self) -> int:
        """How many rows this rank owns (0 on a rank past the end)."""
        return self.stop - self.start


def cut(rows: int, size: int, world: int, rank: int) -> Rows:
    """`Rows` of a tensor of `rows` rows of `size` values on rank `rank` of `world`."""
    chunk = -(-rows // world)
    start = min(rows, rank * chunk)
    return Rows(rows, size, chunk, start, min(rows, start + chunk))


class RowExchange:
    """The rows of a fixed list of same-dtype tensors, their buffers and their two
    collectives (see the module docstring). Buffers are allocated once and reused; the
    padding rows are zeros that nothing writes."""

    def __init__(
        self, shapes: Sequence[Sequence[int]], dtype: torch.dtype, device: torch.device,
        comm: Comm,
    ) -> None:  # fmt: skip
        self.comm, self.world, self.rank = comm, comm.world, comm.rank
        self.cuts = []
        for shape in shapes:
            size = 1
            for s in shape[1:]:
                size *= s
            self.cuts.append(cut(shape[0], size, self.world, self.rank))
        self.shapes = [torch.Size(s) for s in shapes]
        self.offsets, total = [], 0
        for c in self.cuts:
            self.offsets.append(total)
            total += c.chunk * c.size
        self.segment = max(total, 1)
        self.dtype, self.device = dtype, device
        self._reducing: dist.Work | None = None
        self._gathering: dist.Work | None = None
        self._gathered_pending = False  # LocalView's gathers have no handle
        self._summed = False  # `received` holds a sum not yet divided by W

    # Each direction's buffers are made on its first use: an exchange that only reduces
    # (AdamShards gathers some tensors straight into place) holds no gather buffers.
    @cached_property
    def send(self) -> Tensor:
        return self._zeros(self.world * self.segment)

    @cached_property
    def received(self) -> Tensor:
        return self._zeros(self.segment)

    @cached_property
    def out(self) -> Tensor:
        return self._zeros(self.segment)

    @cached_property
    def gathered(self) -> Tensor:
        return self._zeros(self.world * self.segment)

    def _zeros(self, n: int) -> Tensor:
        return torch.zeros(n, dtype=self.dtype, device=self.device)

    def _slots(self, flat: Tensor, i: int) -> Tensor:
        """Tensor i's rows in a rank-major buffer, as (W, c, size): rank r's c rows."""
        c, off = self.cuts[i], self.offsets[i]
        return flat.view(self.world, self.segment)[:, off : off + c.chunk * c.size].view(
            self.world, c.chunk, c.size
        )

    def _mine(self, flat: Tensor, i: int) -> Tensor:
        """Tensor i's rows of this rank in a one-segment buffer, as (mine, *shape[1:])."""
        c, off = self.cuts[i], self.offsets[i]
        return flat[off : off + c.mine * c.size].view(c.mine, *self.shapes[i][1:])

    def prime(self, targets: Sequence[Tensor | Sequence[Tensor]]) -> None:
        """Pack `targets` (as `unpack` takes them) into the gather buffer: under a local
        comm (`LocalView`) the other ranks' rows are then their current values."""
        for i, t in enumerate(targets):
            slots, c = self._slots(self.gathered, i), self.cuts[i]
            if isinstance(t, (list, tuple)):
                for j, row in enumerate(t):
                    slots[j // c.chunk, j % c.chunk].copy_(row.reshape(-1))
            else:
                _copy_rows(slots, t.reshape(c.rows, c.size), c, to_slots=True)

    def reduce(self, tensors: Sequence[Tensor | Sum | Sequence[Tensor]]) -> None:
        """Start the reduction of `tensors` (each whole, a `Sum` of two whole ones, or a list
        of its rows): pack, divide by W, reduce-scatter."""
        dsts, srcs = [], []
        for i, t in enumerate(tensors):
            slots, c = self._slots(self.send, i), self.cuts[i]
            if isinstance(t, Sum):
                _copy_rows(slots, t.a.reshape(c.rows, c.size), c, to_slots=True,
                           plus=t.b.reshape(c.rows, c.size))  # fmt: skip
            elif isinstance(t, (list, tuple)):
                for j, row in enumerate(t):
                    dsts.append(slots[j // c.chunk, j % c.chunk])
                    srcs.append(row.reshape(-1))
            else:
                _copy_rows(slots, t.reshape(c.rows, c.size), c, to_slots=True)
        if dsts:
            torch._foreach_copy_(dsts, srcs)
        self._reducing = self.comm.reduce_scatter(self.received, self.send)
        self._summed = True

    def reduced(self) -> list[Tensor]:
        """Wait for `reduce`; this rank's rows of each tensor's average, (mine, *shape[1:])
        views of the receive buffer (valid until the next `reduce`)."""
        wait(self._reducing)
        self._reducing = None
        if self._summed and self.world > 1:  # the sum's own rows only: 1/W of the buffer
            self.received.div_(self.world)
        self._summed = False
        return [self._mine(self.received, i) for i in range(len(self.cuts))]

    def gather(self, mine: Sequence[Tensor]) -> None:
        """Start sharing this rank's updated rows `mine` (one (mine, ...) tensor each)."""
        dsts, srcs = [], []
        for i, t in enumerate(mine):
            if self.cuts[i].mine:
                dsts.append(self._mine(self.out, i))
                srcs.append(t.reshape(self._mine(self.out, i).shape))
        if dsts:
            torch._foreach_copy_(dsts, srcs)
        self._gathering = self.comm.all_gather(self.gathered, self.out)
        self._gathered_pending = True

    @property
    def gathering(self) -> bool:
        """Whether a `gather` is waiting for its `unpack`."""
        return self._gathering is not None or self._gathered_pending

    def unpack(self, targets: Sequence[Tensor | Sequence[Tensor]]) -> None:
        """Wait for `gather`, then copy every rank's rows into `targets` (each whole tensor,
        or a list of its rows)."""
        wait(self._gathering)
        self._gathering, self._gathered_pending = None, False
        dsts, srcs = [], []
        for i, t in enumerate(targets):
            slots, c = self._slots(self.gathered, i), self.cuts[i]
            if isinstance(t, (list, tuple)):
                for j, row in enumerate(t):
                    dsts.append(row.reshape(-1))
                    srcs.append(slots[j // c.chunk, j % c.chunk])
            else:
                _copy_rows(slots, t.reshape(c.rows, c.size), c, to_slots=False)
        if dsts:
            torch._foreach_copy_(dsts, srcs)


def _copy_rows(slots: Tensor, whole: Tensor, c: Rows, to_slots: bool,
               plus: Tensor | None = None) -> None:  # fmt: skip
    """Copy between a (W, c, size) slot view and a (rows, size) tensor, into the slots or out
    of them (into them, whole + `plus` where given); the padding rows are left as they are."""
    full = c.rows // c.chunk if c.chunk else 0  # ranks holding c rows
    rest = c.rows - full * c.chunk

    def parts(t: Tensor) -> list[Tensor]:
        out = [t[: full * c.chunk].view(full, c.chunk, c.size)]
        return [*out, t[full * c.chunk :]] if rest else out

    targets = [slots[:full]] + ([slots[full, :rest]] if rest else [])
    if plus is not None:
        for s, w, q in zip(targets, parts(whole), parts(plus), strict=True):
            torch.add(w, q, out=s)
        return
    for s, w in zip(targets, parts(whole), strict=True):
        (s if to_slots else w).copy_(w if to_slots else s)


def gather_rows(mine: Tensor, rows: int, comm: Comm) -> Tensor:
    """The whole (rows, ...) tensor whose rows [r·c, (r + 1)·c) rank r holds as `mine` (a
    checkpoint's gather: synchronous). Under `LocalView` the other ranks' rows are zeros."""
    c = cut(rows, 1, comm.world, comm.rank)
    padded = torch.zeros((c.chunk, *mine.shape[1:]), dtype=mine.dtype, device=mine.device)
    padded[: c.mine].copy_(mine)
    out = torch.zeros((comm.world * c.chunk, *mine.shape[1:]), dtype=mine.dtype,
                      device=mine.device)  # fmt: skip
    send, recv = padded.view(-1), out.view(-1)
    if not mine.is_floating_point():  # an int16 state (a master's low halves) goes as bytes
        send, recv = send.view(torch.uint8), recv.view(torch.uint8)
    wait(comm.all_gather(recv, send))
    return out[:rows]
