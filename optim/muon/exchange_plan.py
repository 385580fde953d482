"""The sharded Muon's exchange plan (optim/muon/fsdp_strategies.py): which rank owns each
matrix of a param group, the buckets its exchanges go in, and how many values each rank sends
and receives in each.

A bucket is one Newton–Schulz shape class (a 768×3072 and a 3072×768 share one), or with
optim.muon.exchange_chunk a run of at most that many of its matrices. Each rank's piece of
a matrix is a box of it (optim/blocks.py): torch.chunk's dim-0 rows under FSDP2 alone, a
block of rows and columns beside tensor parallelism. Matrices cut among different ranks (other
meshes or cutting dims) are planned apart, one `SubPlan` each, their buckets in one sequence
(`GroupPlan`).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from optim.blocks import Box, box_numel, row_boxes
from optim.fsdp_rows import row_counts
from optim.muon.exchange import assign_owners


@dataclass
class Bucket:
    """One shape class of a group: its matrices and what this rank sends and receives."""

    indices: list[int]  # the group's matrices in this bucket, in index order
    mine: list[int]  # those this rank owns
    send: list[int]  # values sent to each rank: my shards of the matrices it owns
    recv: list[int]  # values received from each rank: its shards of the matrices I own


class ExchangePlan:
    """Who owns which matrix of a group, and the split sizes of every bucket's exchange."""

    def __init__(
        self, shapes: Sequence[torch.Size], world: int, rank: int, chunk: int = 0,
        boxes: list[list[Box]] | None = None,
    ) -> None:  # fmt: skip
        """`chunk`: at most this many matrices per bucket (a shape class cut in index order;
        −1: as many as ranks, 0: the whole class). `boxes`: where each rank's piece of each
        matrix sits ([matrix][rank], optim/blocks.py); default torch.chunk's dim-0 rows."""
        self.shapes, self.world, self.rank = list(shapes), world, rank
        self.owners = assign_owners(self.shapes, world)
        self.boxes = boxes or [row_boxes(s, row_counts(s[0], world)) for s in self.shapes]
        classes: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(self.shapes):
            classes.setdefault((*s[:-2], *sorted(s[-2:])), []).append(i)
        size = world if chunk == -1 else chunk
        cut = [
            idx[k : k + size] if size else idx
            for idx in classes.values()
            for k in range(0, len(idx), size or len(idx))
        ]
        self.buckets = [self._bucket(idx) for idx in cut]

    def _bucket(self, indices: list[int]) -> Bucket:
        mine = [i for i in indices if self.owners[i] == self.rank]
        send = [
            sum(self.numel(i, self.rank) for i in indices if self.owners[i] == dest)
            for dest in range(self.world)
        ]
        recv = [sum(self.numel(i, src) for i in mine) for src in range(self.world)]
        return Bucket(indices, mine, send, recv)

    def numel(self, i: int, rank: int) -> int:
        """Values of matrix i that `rank` holds."""
        return box_numel(self.boxes[i][rank])

    def owned_by(self, bucket: Bucket, rank: int) -> list[int]:
        return [i for i in bucket.indices if self.owners[i] == rank]


@dataclass
class SubPlan:
    """The matrices of a param group cut among one exchange group's ranks (one mesh and the
    dims that cut them), by their group indices, `members[k]` being the plan's matrix k."""

    plan: ExchangePlan
    group: dist.ProcessGroup | None
    members: list[int]


@dataclass
class GroupPlan:
    """A param group's exchange: a plan per exchange group over the matrices that move, their
    buckets in one sequence, and the expert stacks `kept` where they live."""

    subplans: list[SubPlan]
    buckets: list[tuple[SubPlan, Bucket]]
    kept: list[int]
    bucket_of: dict[int, int]  # group index -> its place in `buckets`
