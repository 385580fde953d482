"""What the Triton kernels (model/triton_loss.py, model/triton_mlp.py) share: whether they can
run here, and how their Triton functions are decorated and found.

Triton reads TRITON_INTERPRET when it decorates a function, so a module's kernel and device
functions are kept undecorated (`TritonCode.device`) and decorated once per mode when first
launched (a test sets the variable before that). Triton, compiled or interpreted, looks up
the functions a kernel calls, and `tl`, among the globals of the kernel's module, so
`TritonCode.kernel` binds them there, to this mode's decorated functions, before each launch.
Nothing here imports Triton until a kernel is asked for.
"""

from collections.abc import Callable
from typing import Any

import torch


def interpreting() -> bool:
    """TRITON_INTERPRET as Triton reads it when a kernel is decorated."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def available(device: torch.device | str | None = None) -> str | None:
    """Why a Triton kernel cannot run here (on `device`, default: CUDA if present), None when
    it can: it needs Triton, and a CUDA device or, for CPU tensors, Triton's interpreter
    (TRITON_INTERPRET=1)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if interpreting():
        return None
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    if kind != "cuda":
        return (
            f"{kind} tensors need Triton's interpreter (TRITON_INTERPRET=1); compiled, the "
            "kernel runs on CUDA"
        )
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return None


class TritonCode:
    """One module's Triton functions (module docstring): `namespace` is its globals()."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.functions: dict[str, Callable] = {}  # undecorated, by name
        # A kernel's declared cost, by name: Triton's launch_metadata hook, (grid, compiled
        # metadata, {argument: value}) -> {"flops8" | "flops16" | "flops", "bytes"}; read only
        # where a launch hook is set (a profiler, the step ledger: docs/ledger.md)
        self.costs: dict[str, Callable] = {}
        self._by_mode: dict[bool, dict[str, Callable]] = {}

    def device(self, fn: Callable) -> Callable:
        """Marks `fn` as Triton code, decorated with triton.jit when a kernel is built."""
        self.functions[fn.__name__] = fn
        return fn

    def kernel(self, name: str) -> Callable:
        """The kernel `name` for this mode (compiled or interpreted), its module's globals
        bound to this mode's functions."""
        import triton
        import triton.language as tl

        mode = interpreting()
        if mode not in self._by_mode:
            self._by_mode[mode] = {n: triton.jit(fn, launch_metadata=self.costs.get(n))
                                   for n, fn in self.functions.items()}  # fmt: skip
        self.namespace.update(self._by_mode[mode], tl=tl)
        return self._by_mode[mode][name]
