"""Adam's tensors shared out between ranks (`dist.parallelism=ddp_row_shards`): which are cut into
rows, which are averaged whole, and the collectives around the update.

- A tensor of at least `SHARD_MIN_VALUES` values and at least W rows (record_2026_07_17's token and
  value tables, the bigram table and the head: 415M of its 415.3M Adam values) is cut into
  rows (optim/ddp_rows.py): its gradient is reduce-scattered, rank r keeps the moments of its
  rows only, updates those rows, and they are all-gathered after the update: straight into
  the parameter where its rows split evenly over the ranks (every record table at W = 8),
  through a packed buffer otherwise.
- Every other tensor (scalars, gates, lambdas) is averaged whole by one all-reduce of a packed
  buffer and updated on every rank alike (record #52: the collectives of many small pieces
  would cost more than the update they would spread).

Where Adam updates every k-th step only (optim.adamw.update_every = k > 1), each rank sums
its own gradients over the k steps and the sum is reduced once, at the update (optim/adam.py),
as the records do: the steps between move nothing over the wire. The rank's partial sum is
optimizer state; `stacked` gathers every rank's for a checkpoint taken inside the k steps.
"""

from collections.abc import Sequence

import torch
from torch import Tensor

from optim.ddp_rows import Comm, RowExchange, Rows, Sum, cut, gather_rows, wait

# A tensor this large (and with at least as many rows as ranks) is cut into rows.
SHARD_MIN_VALUES = 1 << 16


class AdamShards:
    """The sharded and the whole-averaged tensors of one Adam instance, their exchanges,
    and each tensor's rows on this rank (see the module docstring)."""

    def __init__(self, params: Sequence[Tensor], comm: Comm) -> None:
        self.comm, self.world = comm, comm.world
        self.params = list(params)
        self.rows: dict[Tensor, Rows] = {}
        by_dtype: dict[torch.dtype, list[Tensor]] = {}
        small: dict[torch.dtype, list[Tensor]] = {}
        for p in self.params:
            if p.ndim and p.shape[0] >= self.world and p.numel() >= SHARD_MIN_VALUES:
                self.rows[p] = cut(p.shape[0], p[0].numel(), self.world, comm.rank)
                by_dtype.setdefault(p.dtype, []).append(p)
            else:
                small.setdefault(p.dtype, []).append(p)
        # Each dtype's gradients go through one packed reduce-scatter; the updated rows come
        # back by one packed all-gather, except a tensor whose rows split evenly over the
        # ranks: it is gathered straight into the parameter (no copy out of a buffer)
        self.exchanges = [
            (ps, RowExchange([p.shape for p in ps], dtype, ps[0].device, comm))
            for dtype, ps in by_dtype.items()
        ]
        evenly = [p for ps in by_dtype.values() for p in ps if self._gathers_in_place(p)]
        self.direct = [(p, torch.zeros_like(self.target(p))) for p in evenly]
        in_place = {p for p, _ in self.direct}
        self.packed = [
            (kept, RowExchange([p.shape for p in kept], kept[0].dtype, kept[0].device, comm))
            for kept in ([p for p in ps if p not in in_place] for ps in by_dtype.values())
            if kept
        ]
        if comm.local:
            for ps, ex in self.packed:
                ex.prime([p.detach() for p in ps])
        self._direct_handles: list = []
        self.small = [
            (ps, torch.zeros(sum(p.numel() for p in ps), dtype=dtype, device=ps[0].device))
            for dtype, ps in small.items()
        ]
        self._reducing: list = []
        self._started = False

    def _gathers_in_place(self, p: Tensor) -> bool:
        """Whether `p`'s rows split evenly over the ranks in one contiguous block each: then
        the all-gather's output is the parameter itself."""
        return p.is_contiguous() and p.shape[0] % self.world == 0

    def target(self, p: Tensor) -> Tensor:
        """What this rank updates of `p`: its rows (a view of the parameter), or all of it."""
        rows = self.rows.get(p)
        return p.detach() if rows is None else p.detach()[rows.start : rows.stop]

    def start(self, sources: dict[Tensor, Tensor | Sum] | None = None) -> None:
        """Start every reduction: the sharded tensors' rows, the small ones' all-reduce; of
        `sources[p]` in place of each gradient where given (the sum over k steps, or a `Sum`
        of its last two terms, added as it is packed)."""
        if self._started:
            return
        sources = sources or {}

        def grad(p: Tensor) -> Tensor | Sum:
            return sources[p] if p in sources else grad_or_zeros(p)

        def whole(p: Tensor) -> Tensor:  # a small tensor's Sum added in place (a few values)
            g = grad(p)
            return g.a.add_(g.b) if isinstance(g, Sum) else g

        for ps, ex in self.exchanges:
            ex.reduce([grad(p) for p in ps])
        self._reducing = []
        for ps, flat in self.small:
            torch._foreach_copy_(_pieces(flat, ps), [whole(p).reshape(-1) for p in ps])
            if self.world > 1:
                flat.div_(self.world)
            self._reducing.append(self.comm.all_reduce(flat))
        self._started = True

    def gradients(self) -> dict[Tensor, Tensor]:
        """Wait for the reductions: {parameter: the average of its gradient over ranks, its
        rows only where it is sharded} (views of the exchange buffers)."""
        self.start()
        self._started = False
        out = {}
        for ps, ex in self.exchanges:
            out.update(zip(ps, ex.reduced(), strict=True))
        for handle in self._reducing:
            wait(handle)
        for ps, flat in self.small:
            for p, piece in zip(ps, _pieces(flat, ps), strict=True):
                out[p] = piece.view(p.shape)
        return out

    def gather(self) -> None:
        """Start sharing every rank's updated rows: straight into each parameter whose rows
        split evenly (from a copy of this rank's rows: the collective's input and output
        do not overlap), through a packed buffer for the others."""
        for p, rows in self.direct:
            rows.copy_(self.target(p))
            out = p.detach().view(-1)
            self._direct_handles.append(self.comm.all_gather(out, rows.view(-1)))
        for ps, ex in self.packed:
            ex.gather([self.target(p) for p in ps])

    def finish(self) -> None:
        """Wait for the gathers; every sharded tensor whole again on every rank."""
        for handle in self._direct_handles:
            wait(handle)
        self._direct_handles = []
        for ps, ex in self.packed:
            if ex.gathering:
                ex.unpack([p.detach() for p in ps])

    def whole(self, p: Tensor, value: Tensor) -> Tensor:
        """A row-shaped state tensor of `p` gathered whole from its owners (a collective);
        any other state as it is."""
        rows = self.rows.get(p)
        if rows is None or value.ndim == 0:
            return value
        return gather_rows(value, rows.rows, self.comm)

    def stacked(self, value: Tensor) -> Tensor:
        """Every rank's `value` (a whole-shaped tensor of its own), stacked in rank order
        (a collective; under `LocalView` the other ranks' are zeros)."""
        flat = value.detach().reshape(-1).contiguous()
        out = torch.zeros(self.world * flat.numel(), dtype=flat.dtype, device=flat.device)
        if self.comm.local:
            out[self.comm.rank * flat.numel() : (self.comm.rank + 1) * flat.numel()] = flat
        else:
            wait(self.comm.all_gather(out, flat))
        return out.view(self.world, *value.shape)

    def mine(self, p: Tensor, value: Tensor) -> Tensor:
        """This rank's rows of a whole row-shaped state tensor of `p` (a copy)."""
        rows = self.rows.get(p)
        if rows is None or value.ndim == 0:
            return value
        return value[rows.start : rows.stop].clone()


def grad_or_zeros(p: Tensor) -> Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def _pieces(flat: Tensor, ps: Sequence[Tensor]) -> list[Tensor]:
    return list(flat.split([p.numel() for p in ps]))
