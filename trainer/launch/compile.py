"""How the model is compiled, once for the training loop and the GPU benchmark alike.

The records compile with static shapes (`dynamic=False`): every kernel, the attention masks
and the rotary tables are specialised to the one training length. With torch's default
(`dynamic=None`) a second input length, such as the step-0 validation's 262,144-token
sequence, makes the next compile mark the sequence length symbolic, and the training graph
is then compiled for any length. Static, each length gets its own graph (training, and
validation in eval mode) and neither changes the other. Values that change during a run (the
attention window, document boundaries) reach the graph as tensors, so they never recompile.

Inductor keeps the intermediates of a fused kernel in fp32 and by default drops a cast to a narrower
float between two of its ops. The records' specs round at such places (σ to bf16 in
record_2026_07_17's loss before its e5m2 gradient, the FP8 scales to bf16), and the eager model,
which the float64 reference tests check, rounds there. `emulate_precision_casts` keeps those casts,
so the compiled step computes the roundings the model writes (a conversion per cast; on a CPU,
record_2026_07_17's head and loss then give eager's gradients bit for bit, against three quarters of
them differing without it: tests/unit/test_record_2026_07_17_head.py).

A second run of the same preset starts fast when the first run's kernels are still on disk:
`use_compile_cache` keeps inductor's caches (FX graphs, AOTAutograd, autotuning, Triton
kernels) in train.compile_cache, ~/.cache/gpt-speedrun/compile, rather than torch's /tmp
default, which a reboot or a fresh container loses. Dynamo still traces the model each run;
inductor then finds every graph it compiled before and builds no kernel.

`CompileCounts` reads torch's own counters, so a benchmark or a test can show that a graph
has no breaks and that nothing recompiles after warm-up.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


def use_compile_cache(directory: str) -> str | None:
    """Point torch.compile's on-disk caches (inductor's, TORCHINDUCTOR_CACHE_DIR) at
    `directory` (train.compile_cache, `~` expanded, created) unless the user set the
    variable; returns the directory in use, None for torch's own default. Call it before the
    first compile: inductor reads the variable when it first needs its cache."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # torch writes its default into the variable on first use (importing dynamo does): that
    # one is not the user's choice
    ours = os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir())
    if ours and directory:
        path = Path(directory).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR")


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
