"""How the model is compiled, once for the training loop and the GPU benchmark alike.

The records compile with static shapes (`dynamic=False`): every kernel, the attention masks
and the rotary tables are specialised to the one training length. With torch's default
(`dynamic=None`) a second input length, such as the step-0 validation's 262,144-token
sequence, makes the next compile mark the sequence length symbolic, and the training graph
is then compiled for any length. Static, each length gets its own graph (training, and
validation in eval mode) and neither changes the other. Values that change during a run (the
attention window, document boundaries) reach the graph as tensors, so they never recompile.

Inductor keeps the intermediates of a fused kernel in fp32 and by default drops a cast to a
narrower float between two of its ops. The records' specs round at such places (σ to bf16 in
record D's loss before its e5m2 gradient, the FP8 scales to bf16), and the eager model, which
the float64 reference tests check, rounds there. `emulate_precision_casts` keeps those casts,
so the compiled step computes the roundings the model writes (a conversion per cast; on a CPU,
record D's head and loss then give eager's gradients bit for bit, against three quarters of
them differing without it: tests/unit/test_record_d_head.py).

`CompileCounts` reads torch's own counters, so a benchmark or a test can show that a graph
has no breaks and that nothing recompiles after warm-up.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


def compile_model(module: nn.Module, backend: str | Callable = "inductor") -> nn.Module:
    """`module` compiled as the records compile it: static shapes, one graph per shape.
    `backend`: a torch.compile backend name (model.compile_backend), or a backend function."""
    options = {"emulate_precision_casts": True} if backend == "inductor" else None
    return torch.compile(module, dynamic=False, backend=backend, options=options)


@dataclass(frozen=True)
class CompileCounts:
    """torch.compile's running totals: graphs compiled and graph breaks seen."""

    graphs: int
    graph_breaks: int

    @classmethod
    def now(cls) -> "CompileCounts":
        from torch._dynamo.utils import counters  # here: importing dynamo takes ~0.5 s

        return cls(
            graphs=counters["stats"]["unique_graphs"],
            graph_breaks=sum(counters["graph_break"].values()),
        )

    def __sub__(self, earlier: "CompileCounts") -> "CompileCounts":
        return CompileCounts(self.graphs - earlier.graphs, self.graph_breaks - earlier.graph_breaks)


def reset_compile_state() -> None:
    """Forget every compiled graph and counter (between presets in one process)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
