"""Where a sharded parameter's values live: FSDP2's dim-0 shards, as row ranges per rank.

Under an fsdp `dist.parallelism` (fsdp_gather, fsdp_tp) every parameter is a DTensor placed
`Shard(0)` on a 1-D mesh: rank r holds a contiguous block of dim-0 "rows" (whole slices of a
stacked q/k/v weight), cut the way `torch.chunk` cuts: ⌈R/W⌉ rows per rank, the last ranks short
or empty. The global tensor is the concatenation of the local shards in rank order. Plain
tensors count as one shard holding everything, so the same code serves the unsharded (DDP / one
process) case.
"""

import sys
from collections.abc import Sequence

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
    check_layout(p)
    mesh = p.device_mesh
    counts = row_counts(p.shape[0], mesh.size())
    rank = mesh.get_local_rank()
    start = sum(counts[:rank])
    return start, start + counts[rank]


def check_layout(p: Tensor) -> None:
    """Raise unless the DTensor `p` is dim-0 sharded on a 1-D mesh with torch.chunk's split
    (the layout the sharded optimizer's exchange assumes), naming what differs."""
    from torch.distributed.tensor import Shard

    if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
        raise ValueError(
            f"a sharded parameter must be Shard(0) on a 1-D mesh, got {p.placements} on a "
            f"{p.device_mesh.ndim}-D mesh"
        )
    counts = row_counts(p.shape[0], p.device_mesh.size())
    have = p.to_local().shape[0]
    want = counts[p.device_mesh.get_local_rank()]
    if have != want:
        raise ValueError(
            f"a parameter of shape {tuple(p.shape)} holds {have} rows here; the torch.chunk "
            f"split gives this rank {want}"
        )


def numel_of_rows(shape: Sequence[int], rows: int) -> int:
    """Values in `rows` dim-0 rows of a tensor of `shape`."""
    inner = 1
    for k in shape[1:]:
        inner *= k
    return rows * inner
