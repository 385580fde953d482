"""Where a DTensor's values live on its mesh, for any placements: each rank's box.

Under FSDP2 alone a parameter is `Shard(0)` on a 1-D mesh, and with HSDP `(Replicate(),
Shard(0))` (optim/fsdp_rows.py). With tensor parallelism beside FSDP the mesh is 2-D and
both dims cut the tensor: a row-parallel weight is `(Shard(0), Shard(1))`, a block of rows
and columns per rank; a column-parallel one is `(_StridedShard(0), Shard(0))`, its rows cut
by TP and each TP block's rows cut again by FSDP. Muon's exchange (optim/muon/fsdp_strategies.py)
needs, for every rank that holds a distinct piece, where that piece sits in the whole tensor:

- the exchange group (`exchange_group`): the ranks along the mesh dims that cut the tensor.
  Along a `Replicate()` dim the ranks hold the same values, so each replica group exchanges
  on its own, as HSDP's shard groups do;
- each rank's box (`box`): an offset and a size per tensor dim. It is found by placing an
  index tensor the way the parameter is placed (`distribute_tensor` with no source rank:
  each rank keeps its own piece, with no communication), so it follows DTensor's own rules
  for every placement, and it is checked to be a box: a layout whose pieces are not boxes is
  refused by name.

Parameters of one param group may differ in placements and mesh; they are exchanged in one
plan per exchange group ("grouped by placements and mesh").
"""

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offset, size) along each tensor dim

# Flattened sub-meshes' groups, made once per set of mesh-dim groups: making one is a
# collective (new_group)
_FLAT: dict[tuple, dist.ProcessGroup] = {}


def cutting_dims(p: Tensor) -> tuple[int, ...]:
    """The mesh dims whose placement cuts the DTensor `p` (every other is `Replicate()`);
    ValueError naming the placements where one is neither (a pending sum, `Partial`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    dims = []
    for k, placement in enumerate(p.placements):
        # _StridedShard: FSDP2's cut of a dim tensor parallelism cut first
        if isinstance(placement, Shard | _StridedShard):
            dims.append(k)
        elif placement != Replicate():
            raise ValueError(
                f"a sharded Muon parameter must be cut (Shard) or replicated on every mesh "
                f"dim; got {tuple(p.placements)} on a {p.device_mesh.ndim}-D mesh"
            )
    return tuple(dims)


def exchange_group(p: Tensor) -> dist.ProcessGroup | None:
    """The process group of the ranks among which the DTensor `p` is cut (None: every rank
    holds all of it). Several cutting dims are flattened into one group, made on first use:
    every rank must ask for the same parameters in the same order (a collective)."""
    dims = cutting_dims(p)
    mesh = p.device_mesh
    if not dims:
        return None
    if len(dims) == 1:
        return mesh.get_group(dims[0])
    # Keyed by the mesh dims' own groups: a mesh of the same shape made after these were
    # destroyed has new ones (a mesh compares equal to another of its shape)
    key = tuple(mesh.get_group(d) for d in dims)
    if key not in _FLAT:
        names = mesh.mesh_dim_names
        if names is None:
            raise ValueError(
                f"a parameter cut along {len(dims)} mesh dims needs a mesh with named dims "
                "(init_device_mesh(..., mesh_dim_names=...)) to exchange over them together"
            )
        sub = mesh[tuple(names[d] for d in dims)] if len(dims) < mesh.ndim else mesh
        _FLAT[key] = sub._flatten().get_group()
    return _FLAT[key]


def box(p: Tensor) -> Box:
    """This rank's piece of the DTensor `p` as (offset, size) per dim; ValueError where the
    piece is not a box of the whole tensor."""
    from torch.distributed.tensor import distribute_tensor

    # Placed where p lives (a few MB once per matrix, when the plan is made)
    index = torch.arange(p.numel(), device=p.to_local().device).view(p.shape)
    mine = distribute_tensor(index, p.device_mesh, p.placements, src_data_rank=None).to_local()
    size = tuple(mine.shape)
    if mine.numel() == 0:
        return (0,) * p.ndim, size
    offset = tuple(int(k) for k in torch.unravel_index(mine.reshape(-1)[0], p.shape))
    if not torch.equal(mine, index[slices((offset, size))]):
        raise ValueError(
            f"a parameter of shape {tuple(p.shape)} placed {tuple(p.placements)} holds values "
            "here that are not one block of the whole tensor: the sharded Muon's exchange "
            "takes blocks only"
        )
    return offset, size


def boxes(params: Sequence[Tensor], group: dist.ProcessGroup | None) -> list[list[Box]]:
    """Every rank's box of each parameter, [matrix][rank in `group`]: one all_gather_object
    of this rank's boxes (plain tensors and group None: the whole tensor, one rank)."""
    mine = [box(p) if group is not None else ((0,) * p.ndim, tuple(p.shape)) for p in params]
    if group is None:
        return [[b] for b in mine]
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return [[every[r][i] for r in range(len(every))] for i in range(len(params))]


def row_boxes(shape: Sequence[int], counts: Sequence[int]) -> list[Box]:
    """The boxes of torch.chunk's dim-0 rows, `counts` rows per rank (optim/fsdp_rows.py)."""
    out, start = [], 0
    for rows in counts:
        out.append(((start, *(0 for _ in shape[1:])), (rows, *shape[1:])))
        start += rows
    return out


def slices(b: Box) -> tuple[slice, ...]:
    """Index of box `b` in the whole tensor."""
    return tuple(slice(o, o + s) for o, s in zip(*b, strict=True))


def box_numel(b: Box) -> int:
    return math.prod(b[1])
