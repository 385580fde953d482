"""How distributed Muon splits its work between ranks and moves finished tensors between them.

Ownership: matrix i of a param group is orthogonalised by rank `owners[i]`, dealt round-robin
in order of decreasing Newton–Schulz cost (`assign_owners`), so every rank gets about the same
work and every rank computes the same assignment without talking to the others.

Exchanges (`optim.muon.exchange`), for W ranks and P Muon values of b bytes each:

- "all_reduce": each rank writes the updates it owns into a zero-filled flat buffer and one SUM
  all-reduce hands everyone everything (x + 0 = x exactly). A ring all-reduce sends
  ≈ 2·(W-1)/W·P·b bytes per rank.
- "all_gather": each rank packs only its own updates and an all-gather delivers every rank's
  pack, ≈ (W-1)/W·P·b per rank: half the all-reduce's bytes.
- "reduce_scatter": Muon's gradients skip DDP; each rank reduce-scatters its local gradients so
  that owners receive the sum of the matrices they own, updates those, and all-gathers the new
  parameters. Gradient reduction and exchange together cost ≈ 2·(W-1)/W·P·4 bytes per rank, the
  same as DDP's all-reduce of the gradients alone, so the update exchange is free.

Packing: a rank's tensors are laid end to end in index order, padded to the largest rank's
pack so that every rank's buffer has the same size (which gloo and NCCL both require); every
rank unpacks all buffers the same way from the shared ownership.
"""

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from optim.config import MUON_EXCHANGES as EXCHANGES


def ns_flops(shape: Sequence[int], steps: int) -> int:
    """FLOPs of `steps` Newton–Schulz iterations on one matrix: steps·(4m²n + 2m³), m ≤ n."""
    m, n = sorted(shape)
    return steps * (4 * m * m * n + 2 * m**3)


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


def all_reduce_owned(
    mine: dict[int, Tensor],
    shapes: Sequence[torch.Size],
    dtype: torch.dtype,
    device: torch.device,
    group: dist.ProcessGroup,
) -> list[Tensor]:
    """Every rank's tensors on every rank: each fills its own slots of a zeroed buffer, SUM."""
    sizes = [s.numel() for s in shapes]
    flat = torch.zeros(sum(sizes), dtype=dtype, device=device)
    slots = flat.split(sizes)
    for i, t in mine.items():
        slots[i].view_as(t).copy_(t)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    return [slot.view(shape) for slot, shape in zip(slots, shapes, strict=True)]


def all_gather_owned(
    mine: dict[int, Tensor],
    shapes: Sequence[torch.Size],
    owners: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    group: dist.ProcessGroup,
) -> list[Tensor]:
    """Every rank's tensors on every rank: each sends only its own, packed; all-gather."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    owned = owned_indices(owners, world)
    send = _pack([mine[i] for i in owned[rank]], _pack_size(owned, shapes), dtype, device)
    recv = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(recv, send, group=group)
    out: list[Tensor | None] = [None] * len(shapes)
    for r, idx in enumerate(owned):
        for i, t in zip(idx, _unpack(recv[r], [shapes[i] for i in idx]), strict=True):
            out[i] = t
    return out  # type: ignore[return-value]  # every index has exactly one owner


def reduce_scatter_to_owners(
    tensors: Sequence[Tensor], owners: Sequence[int], group: dist.ProcessGroup
) -> dict[int, Tensor]:
    """The SUM over ranks of each tensor, delivered to its owner only: {index: sum} of mine."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    owned = owned_indices(owners, world)
    shapes = [t.shape for t in tensors]
    size = _pack_size(owned, shapes)
    dtype, device = tensors[0].dtype, tensors[0].device
    send = [_pack([tensors[i] for i in idx], size, dtype, device) for idx in owned]
    recv = torch.empty(size, dtype=dtype, device=device)
    dist.reduce_scatter(recv, send, op=dist.ReduceOp.SUM, group=group)
    mine = owned[rank]
    return dict(zip(mine, _unpack(recv, [shapes[i] for i in mine]), strict=True))


def check_supported(exchange: str, group: dist.ProcessGroup, dtypes: Sequence[torch.dtype]) -> None:
    """Fail now, naming the mode and backend, if the backend lacks a collective it needs.

    Runs the mode's collectives once on a few values of each dtype; every rank must call it.
    """
    if exchange not in EXCHANGES:
        raise ValueError(f"optim.muon.exchange must be one of {EXCHANGES}, got {exchange!r}")
    world = dist.get_world_size(group)
    device = _group_device(group)
    try:
        for dtype in dtypes:
            x = torch.zeros(world, dtype=dtype, device=device)
            if exchange == "all_reduce":
                dist.all_reduce(x, group=group)
            else:
                dist.all_gather([torch.empty_like(x) for _ in range(world)], x, group=group)
            if exchange == "reduce_scatter":
                dist.reduce_scatter(x[:1], list(x.chunk(world)), group=group)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        raise ValueError(
            f"optim.muon.exchange={exchange} is not supported by the "
            f"{dist.get_backend(group)} backend here ({e}); choose another of {EXCHANGES}"
        ) from e


def _group_device(group: dist.ProcessGroup) -> torch.device:
    """Where the group's collectives take tensors: the current GPU for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _pack_size(owned: Sequence[Sequence[int]], shapes: Sequence[torch.Size]) -> int:
    """The largest rank's pack (at least 1, so a rank owning nothing still sends a buffer)."""
    return max(1, *(sum(shapes[i].numel() for i in idx) for idx in owned))


def _pack(tensors: Sequence[Tensor], size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    flat = torch.zeros(size, dtype=dtype, device=device)
    offset = 0
    for t in tensors:
        flat[offset : offset + t.numel()].view_as(t).copy_(t)
        offset += t.numel()
    return flat


def _unpack(flat: Tensor, shapes: Sequence[torch.Size]) -> list[Tensor]:
    out, offset = [], 0
    for shape in shapes:
        out.append(flat[offset : offset + shape.numel()].view(shape))
        offset += shape.numel()
    return out
