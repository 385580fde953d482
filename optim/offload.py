"""Optimizer state in CPU memory between steps (`optim.offload=true`).

Muon's momentum and AdamW's moments are touched once per step, by the update, yet by default
they sit in device memory through every forward and backward: 4 bytes per parameter for Muon,
8 for AdamW, as much again as the fp32 parameters and gradients. With offload each state
tensor's device storage is freed after the update (its values kept in a CPU mirror, pinned
on CUDA so copies run asynchronously) and re-allocated and filled just before the next one.

The optimizer keeps the same tensor objects throughout (only their storage comes and goes,
the way FSDP frees unsharded parameters), so nothing that holds a state tensor notices, and
the update computes on the same values on the same device: results are bitwise equal to no
offload. On CUDA the copies run on a side stream: part k+1's state streams in while part k
(Muon's Newton–Schulz) computes, and part k's streams out while part k+1 computes. 0-D
tensors (AdamW's step counters) stay where they are.
"""

from collections.abc import Iterator

import torch
from torch import Tensor

from optim.fsdp_rows import local


class StateOffload:
    def __init__(self, parts: list[torch.optim.Optimizer], device: torch.device) -> None:
        self.parts, self.device = parts, device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._mirrors: dict[tuple[int, int, str], Tensor] = {}
        self.resident = [True] * len(parts)  # whether part k's state is on the device
        self._events: list[torch.cuda.Event | None] = []

    def _tensors(self, k: int) -> Iterator[tuple[tuple[int, int, str], Tensor]]:
        """Part k's offloadable state tensors (their local shards), with stable keys."""
        opt = self.parts[k]
        for group in opt.param_groups:
            for p in group["params"]:
                for name, value in opt.state.get(p, {}).items():
                    if isinstance(value, Tensor) and value.ndim > 0:
                        yield (k, id(p), name), local(value)

    def fetch_all(self) -> None:
        """Start bringing every part's state back onto the device, part by part, on the side
        stream; `wait(k)` before part k's update."""
        self._events = []
        for k in range(len(self.parts)):
            tensors = [] if self.resident[k] else list(self._tensors(k))
            for _, t in tensors:  # allocated on the compute stream, where the update uses it
                t.untyped_storage().resize_(t.numel() * t.element_size())
            with self._side():
                for key, t in tensors:
                    t.copy_(self._mirrors[key], non_blocking=self.cuda)
            self._events.append(self._record())
            self.resident[k] = True

    def wait(self, k: int) -> None:
        """Make the compute stream wait until part k's state is on the device."""
        event = self._events[k] if k < len(self._events) else None
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def store(self, k: int) -> None:
        """Start copying part k's state to its CPU mirrors (after its update); the device
        storage is freed by `release`, once the copies are done."""
        with self._side():
            for key, t in self._tensors(k):
                mirror = self._mirrors.get(key)
                if mirror is None or mirror.shape != t.shape or mirror.dtype != t.dtype:
                    mirror = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.cuda)
                    self._mirrors[key] = mirror
                mirror.copy_(t, non_blocking=self.cuda)
        self.resident[k] = False

    def release(self) -> None:
        """Wait for the outgoing copies, then free the device storage of every stored part."""
        if self.stream is not None:
            self.stream.synchronize()
        for k in range(len(self.parts)):
            if not self.resident[k]:
                for _, t in self._tensors(k):
                    t.untyped_storage().resize_(0)

    def store_all(self) -> None:
        for k in range(len(self.parts)):
            self.store(k)
        self.release()

    def _record(self) -> "torch.cuda.Event | None":
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def _side(self) -> "torch.cuda.StreamContext | _NoStream":
        if self.stream is None:
            return _NoStream()
        # The side stream starts after the compute stream's work so far (the update that
        # wrote the state, the allocations above).
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self.stream)


class _NoStream:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
