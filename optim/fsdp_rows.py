"""Where a sharded parameter's values live: FSDP2's dim-0 shards, as row ranges per rank.

Under an fsdp `dist.parallelism` (fsdp_gather, fsdp_tp) every parameter is a DTensor placed
`Shard(0)` on a 1-D mesh, or with dist.replicate > 1 `(Replicate(), Shard(0))` on a
(replicate, shard) mesh (HSDP: each replica group holds the model once, cut the same way):
within its shard group, rank r holds a contiguous block of dim-0 "rows" (whole slices of a
stacked q/k/v weight), cut the way `torch.chunk` cuts: ⌈R/W⌉ rows per rank, the last ranks short
or empty. The global tensor is the concatenation of the local shards in rank order. Plain
tensors count as one shard holding everything, so the same code serves the unsharded (DDP / one
process) case.
"""

import sys
from collections.abc import Sequence

import torch.distributed as dist
from torch import Tensor


def is_dtensor(t: object) -> bool:
    """Whether `t` is a DTensor. Asked of every parameter and state tensor, so it does not
    import torch.distributed.tensor (half a second): while nothing has imported it, no tensor
    can be one."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local(t: Tensor) -> Tensor:
    """This rank's values of `t`: the local shard of a DTensor, `t` itself otherwise."""
    return t.to_local() if is_dtensor(t) else t


def row_counts(rows: int, world: int) -> list[int]:
    """How many dim-0 rows each of `world` ranks holds, as `torch.chunk` splits `rows`."""
    per = -(-rows // world) if rows else 0
    return [max(0, min(per, rows - r * per)) for r in range(world)]


def row_range(p: Tensor) -> tuple[int, int]:
    """The global dim-0 rows [start, stop) of `p` that this rank holds."""
    if not is_dtensor(p):
        return 0, p.shape[0]
    dim = shard_dim(p)
    counts = row_counts(p.shape[0], p.device_mesh.size(dim))
    rank = p.device_mesh.get_local_rank(dim)
    start = sum(counts[:rank])
    return start, start + counts[rank]


def shard_dim(p: Tensor) -> int:
    """The mesh dim that cuts the DTensor `p` into dim-0 rows: its one `Shard(0)` placement,
    every other dim `Replicate()` (a 1-D mesh's FSDP, or HSDP's (replicate, shard) mesh:
    each replica group holds the same rows). Raises, naming what differs, on any other
    layout or a split other than torch.chunk's (what the sharded optimizer's exchange
    assumes)."""
    from torch.distributed.tensor import Replicate, Shard

    placements = tuple(p.placements)
    cut = [k for k, placement in enumerate(placements) if placement == Shard(0)]
    if len(cut) != 1 or any(x != Replicate() for k, x in enumerate(placements) if k != cut[0]):
        raise ValueError(
            f"a sharded parameter must be Shard(0) on one mesh dim and Replicate() on any "
            f"other, got {placements} on a {p.device_mesh.ndim}-D mesh"
        )
    dim = cut[0]
    counts = row_counts(p.shape[0], p.device_mesh.size(dim))
    have = p.to_local().shape[0]
    want = counts[p.device_mesh.get_local_rank(dim)]
    if have != want:
        raise ValueError(
            f"a parameter of shape {tuple(p.shape)} holds {have} rows here; the torch.chunk "
            f"split gives this rank {want}"
        )
    return dim


def shard_group(p: Tensor) -> dist.ProcessGroup:
    """The process group of the ranks among which the DTensor `p`'s rows are cut."""
    return p.device_mesh.get_group(shard_dim(p))


def numel_of_rows(shape: Sequence[int], rows: int) -> int:
    """Values in `rows` dim-0 rows of a tensor of `shape`."""
    inner = 1
    for k in shape[1:]:
        inner *= k
    return rows * inner
