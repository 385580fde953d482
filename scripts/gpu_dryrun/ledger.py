"""What one training step costs on the pretend H100, launch by launch: FLOPs, bytes, kernel
launches and collective bytes (`python -m scripts.gpu_dryrun --ledger`; docs/ledger.md).

Three sources, one row per launch:
- inductor's Triton kernels: the bytes and FLOPs inductor states for each (its
  `kernel_num_gb` and `kernel_flop`, which `torch._inductor.config.benchmark_kernel` makes it
  compute at code generation), read at each launch;
- any other Triton kernel (the project's own): bytes of its tensor arguments, FLOPs where the
  kernel declares them through Triton's `launch_metadata` ("flops", "flops8", "flops16");
- library kernels, every op the pretend device's backend computes (host_cuda.cpp): a product's
  2·M·N·K FLOPs, and each op's operands and results in bytes.
Collectives: what `Wire` (below) moves per rank in place of the real exchange at world W.

Each row is booked to the phase it ran in (forward, backward: inside `Tensor.backward`;
optimizer: inside `opt.step`) and each product to the part of the model its shape names
(`Parts`). Nothing is timed: the estimate is scripts/gpu_dryrun/estimate.py's.
"""

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

PHASES = ("forward", "backward", "optimizer")
PRODUCT_OPS = ("mm", "addmm", "bmm", "_scaled_mm")


@dataclass(frozen=True)
class Launch:
    """A kernel's launches alike in all but count (one, as booked; several, once compacted):
    their FLOPs and bytes summed. A collective: `source` "collective", launches 0."""

    kernel: str
    source: str  # inductor | triton | library | collective
    dtype: str  # a product's operand dtype ("" where it does not matter)
    flops: float
    bytes: float
    phase: str
    part: str = "other"  # attention | mlp | head | optimizer | other (see Parts)
    launches: int = 1


@dataclass(frozen=True)
class Parts:
    """Which part of the model a product belongs to, by its shape: one with a dimension of
    the vocabulary's size is the head's, one with the MLP's hidden width the MLP's; attention
    kernels by name; any other product in the forward or backward is attention's projections
    (Q/K/V/O, the only other matrices a block has); in the optimizer, the optimizer's."""

    head: frozenset[int]
    mlp: frozenset[int]

    @staticmethod
    def of(model: Any) -> "Parts":
        d = model.cfg.n_embd
        mlp = {s for n, p in model.named_parameters() if ".mlp." in n for s in p.shape}
        return Parts(frozenset({model.cfg.vocab_size}), frozenset(mlp - {d, 1}))

    def part(self, kernel: str, phase: str, dims: tuple[int, ...], is_product: bool) -> str:
        if phase == "optimizer":
            return "optimizer"
        if "attention" in kernel or "flash" in kernel:
            return "attention"
        if not is_product:
            return "other"
        if self.head & set(dims):
            return "head"
        if self.mlp & set(dims):
            return "mlp"
        return "attention"


@dataclass
class Ledger:
    """The launches of one or more steps, with what each step was."""

    launches: list[Launch] = field(default_factory=list)

    def total(self, key: str, **where: str) -> float:
        return sum(getattr(x, key) for x in self.launches if _matches(x, where))

    def table(self) -> dict[str, dict[str, float]]:
        """{phase: {"flops", "bytes", "launches", "collective_bytes", and "flops:<part>"}}."""
        out: dict[str, dict[str, float]] = {}
        for x in self.launches:
            row = out.setdefault(x.phase, {"flops": 0.0, "bytes": 0.0, "launches": 0.0,
                                           "collective_bytes": 0.0})  # fmt: skip
            if x.source == "collective":
                row["collective_bytes"] += x.bytes
                continue
            row["flops"] += x.flops
            row["bytes"] += x.bytes
            row["launches"] += x.launches
            if x.flops:
                row[f"flops:{x.part}"] = row.get(f"flops:{x.part}", 0.0) + x.flops
        return out

    def compact(self) -> "Ledger":
        """Launches alike in all but count merged into one row of their summed FLOPs, bytes
        and count (every total, and the estimate, which is linear in a row's count, stay)."""
        rows: dict[tuple, list[float]] = {}
        for x in self.launches:
            key = (x.kernel, x.source, x.dtype, x.phase, x.part, x.flops / max(x.launches, 1),
                   x.bytes / max(x.launches, 1))  # fmt: skip
            acc = rows.setdefault(key, [0.0, 0.0, 0])
            acc[0] += x.flops
            acc[1] += x.bytes
            acc[2] += x.launches
        return Ledger([
            Launch(k[0], k[1], k[2], f, b, k[3], k[4], int(n))
            for k, (f, b, n) in rows.items()
        ])  # fmt: skip

    def to_json(self) -> list[dict]:
        return [asdict(x) for x in self.compact().launches]

    @staticmethod
    def from_json(rows: list[dict]) -> "Ledger":
        return Ledger([Launch(**r) for r in rows])


def _matches(x: Launch, where: dict[str, str]) -> bool:
    return all(getattr(x, k) == v for k, v in where.items())


class Recorder:
    """Books every launch while `recording()`; `phase(name)` sets what they are booked to.

    Needs the pretend H100 installed (fake_gpu.install) and inductor's per-kernel estimates on
    (`enable_estimates`, before anything compiles)."""

    def __init__(self, parts: Parts, shim: Any) -> None:
        self.parts, self.shim = parts, shim
        self.phase_name = "forward"
        self.on = False
        self.launches: list[Launch] = []
        self._inside = threading.local()  # within an inductor kernel's run: its launch is booked

    # -- switching phases: the library rows so far belong to the phase that is ending
    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before = self.phase_name
        self._drain()
        self.phase_name = name
        try:
            yield
        finally:
            self._drain()
            self.phase_name = before

    @contextmanager
    def recording(self) -> Iterator["Recorder"]:
        self._drain()
        self.launches.clear()
        self.shim.host_cuda_ledger_keep(1)
        self.on = True
        try:
            yield self
        finally:
            self._drain()
            self.on = False
            self.shim.host_cuda_ledger_keep(0)

    @contextmanager
    def muted(self) -> Iterator[None]:
        """What runs here is not booked (a stand-in for work the GPU does elsewhere)."""
        self._drain()
        on, self.on = self.on, False
        self.shim.host_cuda_ledger_keep(0)
        try:
            yield
        finally:
            self._drain()  # the stand-in's own lines: dropped
            self.on = on
            self.shim.host_cuda_ledger_keep(int(on))

    def take(self) -> Ledger:
        self._drain()
        out, self.launches = Ledger(list(self.launches)), []
        return out

    # -- the three sources
    def book(self, kernel: str, source: str, dtype: str, flops: float, nbytes: float,
             dims: tuple[int, ...] = ()) -> None:  # fmt: skip
        if not self.on:
            return
        part = self.parts.part(kernel, self.phase_name, dims, bool(flops) and bool(dims))
        self.launches.append(Launch(kernel, source, dtype, flops, nbytes, self.phase_name, part))

    def book_collective(self, kind: str, nbytes: float) -> None:
        if self.on:
            part = "optimizer" if self.phase_name == "optimizer" else "other"
            self.launches.append(
                Launch(kind, "collective", "", 0.0, nbytes, self.phase_name, part, launches=0)
            )

    def inductor_kernel(self, meta: dict, name: str, args: tuple) -> None:
        """An inductor kernel's launch: its stated bytes and FLOPs (the bytes of its
        tensor arguments where it states none)."""
        gb = meta.get("kernel_num_gb")
        nbytes = gb * 1e9 if gb is not None else tensor_bytes(args)
        flops = float(meta.get("kernel_flop") or 0.0)
        self.book(meta.get("kernel_name", name), "inductor", "", flops, nbytes,
                  product_dims(args) if flops else ())  # fmt: skip

    def triton_kernel(self, name: str, args: tuple, declared: dict | None) -> None:
        """Any other Triton launch (launched outside inductor's runs)."""
        if getattr(self._inside, "depth", 0):
            return
        declared = declared or {}
        flops = float(sum(declared.get(k, 0) for k in ("flops", "flops8", "flops16")))
        dtype = "float8" if declared.get("flops8") else ""
        nbytes = float(declared.get("bytes") or tensor_bytes(args))
        self.book(name, "triton", dtype, flops, nbytes, product_dims(args) if flops else ())

    def _drain(self) -> None:
        """The backend's lines so far, booked to the current phase."""
        need = self.shim.host_cuda_ledger_take(None, 0)
        if need == 0:
            return
        buf = ctypes.create_string_buffer(need + 4096)
        got = self.shim.host_cuda_ledger_take(buf, need + 4096)
        for line in buf.raw[:got].decode().splitlines():
            op, dtype, flops, nbytes, *dims = line.split("\t")
            shape = tuple(int(d) for d in dims[0].split(",") if d) if dims else ()
            product = op.split(".")[0] in PRODUCT_OPS
            self.book(op, "library", dtype if product else "", float(flops), float(nbytes), shape)


def tensor_bytes(args: tuple) -> float:
    """Bytes of the tensors among a launch's arguments (each read or written once)."""
    import torch

    return float(sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)))


def product_dims(args: tuple) -> tuple[int, ...]:
    """The dimensions of a launch's tensor arguments: enough to tell the head's and the
    MLP's products from attention's (Parts)."""
    import torch

    return tuple(sorted({s for a in args if isinstance(a, torch.Tensor) for s in a.shape}))


def load_shim() -> Any:
    """The shim's ledger functions through ctypes (it is preloaded: the same library)."""
    from scripts.gpu_dryrun import fake_gpu

    lib = ctypes.CDLL(str(fake_gpu.shim_path()))
    lib.host_cuda_ledger_take.restype = ctypes.c_int64
    lib.host_cuda_ledger_take.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.host_cuda_ledger_keep.argtypes = [ctypes.c_int]
    return lib


def enable_estimates() -> None:
    """inductor writes its bytes and FLOPs estimate into each kernel it generates, and Triton
    stops at PTX: the ledger reads the kernels, not their machine code, and ptxas is most of
    a full-size compile (over 20 minutes for one of record #89's mask kernels on a CPU core).
    Triton then keeps its cache apart (a cubin here is empty bytes, which the dry run must not
    load), and so does inductor."""
    import os

    import torch._inductor.config as inductor
    from triton.backends.nvidia.compiler import CUDABackend

    from scripts.gpu_dryrun import fake_gpu

    inductor.benchmark_kernel = True
    os.environ["TRITON_CACHE_DIR"] = str(fake_gpu.CACHE / "triton-ledger")
    # inductor's caches apart too, one per shim: AOTAutograd's cache keys a graph before the
    # shim's kernel choices (flash attention or SDPA's math path) shape it
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(fake_gpu.CACHE)
    shim = fake_gpu.shim_path().stem
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, f"ledger-{shim}")
    CUDABackend.make_cubin = lambda self, src, metadata, opt, capability: b""


def _no_hook(metadata: object) -> None:
    """A launch enter hook that does nothing (see `install`)."""


def install(recorder: Recorder) -> Callable[[], None]:
    """Hooks: inductor's kernel runs, other Triton launches, Tensor.backward. Returns the
    function that removes them."""
    import torch
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from triton import knobs

    from scripts.gpu_dryrun import fake_gpu

    run, backward = CachingAutotuner.run, torch.Tensor.backward
    autograd_backward = torch.autograd.backward

    def counted_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.inductor_kernel(self.inductor_meta, self.fn.__name__, args)
        inside = recorder._inside
        inside.depth = getattr(inside, "depth", 0) + 1
        try:
            return run(self, *args, **kwargs)
        finally:
            inside.depth -= 1

    def in_backward(fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            if recorder.phase_name == "backward":
                return fn(*args, **kwargs)
            with recorder.phase("backward"):
                return fn(*args, **kwargs)

        return call

    CachingAutotuner.run = counted_run
    torch.Tensor.backward = in_backward(backward)
    torch.autograd.backward = in_backward(autograd_backward)
    fake_gpu.ON_LAUNCH.append(recorder.triton_kernel)
    # Triton evaluates a kernel's launch_metadata (its declared FLOPs and bytes) only while
    # an enter hook is set (3.9's default is an empty chain; older ones leave None); the
    # pretend launcher never calls the hook itself
    entered = knobs.runtime.launch_enter_hook
    if entered is None:
        knobs.runtime.launch_enter_hook = _no_hook

    def remove() -> None:
        CachingAutotuner.run = run
        torch.Tensor.backward = backward
        torch.autograd.backward = autograd_backward
        fake_gpu.ON_LAUNCH.remove(recorder.triton_kernel)
        knobs.runtime.launch_enter_hook = entered

    return remove


class Wire:
    """A LocalView (optim/ddp_rows.py: rank 0's share, no communication) that books what each
    collective would move per rank on a ring of `world` ranks: a reduce-scatter or an
    all-gather (W−1)/W of the whole buffer, an all-reduce twice that. The copies LocalView
    makes in the collective's place are not booked: on a GPU, NCCL's kernels do that work,
    and the collective's row costs them."""

    def __init__(self, view: Any, recorder: Recorder) -> None:
        self.view, self.recorder = view, recorder
        self.world, self.rank, self.local = view.world, view.rank, view.local

    def _share(self, nbytes: float) -> float:
        return nbytes * (self.world - 1) / self.world

    def reduce_scatter(self, out: Any, inp: Any) -> None:
        self.recorder.book_collective("reduce_scatter", self._share(_nbytes(inp)))
        with self.recorder.muted():  # the collective's stand-in copies
            self.view.reduce_scatter(out, inp)

    def all_gather(self, out: Any, inp: Any) -> None:
        self.recorder.book_collective("all_gather", self._share(_nbytes(out)))
        with self.recorder.muted():  # the collective's stand-in copies
            self.view.all_gather(out, inp)

    def all_reduce(self, t: Any) -> None:
        self.recorder.book_collective("all_reduce", 2 * self._share(_nbytes(t)))
        with self.recorder.muted():  # the collective's stand-in copies
            self.view.all_reduce(t)


def _nbytes(t: Any) -> float:
    return float(t.numel() * t.element_size())
