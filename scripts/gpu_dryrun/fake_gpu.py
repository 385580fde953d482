"""A pretend H100 for a CPU-only torch: the native shim (host_cuda.cpp) built and preloaded, and
the Python side of the same pretence (torch.cuda's queries, inductor's device interface and
benchmarker, Triton's driver).

Triton compiles for the target the driver names, here sm_90 (an H100), with the ptxas it ships,
so every kernel goes through the whole of Triton's compiler, cubin included, as on a GPU. What
is not real: a launch does nothing, so kernels' outputs are uninitialised memory; benchmarks
(inductor's choices between kernels or paddings) all report the same time, so inductor takes
its first candidate where a GPU might take another; the device's properties are fixed (below).
"""

import collections
import hashlib
import os
import subprocess
import sys
import types
from pathlib import Path

SHIM_SOURCE = Path(__file__).with_name("host_cuda.cpp")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpt-speedrun"
CAPABILITY = (9, 0)  # sm_90
# An H100 80GB HBM3's properties, as torch.cuda and Triton's driver report them.
# A named tuple, not a namespace: code inside a compiled graph may read it (dynamo folds a
# named tuple's fields as constants; a namespace it cannot wrap)
_PROPS = dict(
    name="NVIDIA H100 80GB HBM3 (dry run)", major=9, minor=0, multi_processor_count=132,
    total_memory=80 * 2**30, warp_size=32, max_threads_per_multi_processor=2048,
    regs_per_multiprocessor=65536, L2_cache_size=50 * 2**20, gcnArchName="",
    shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472,
    max_threads_per_block=1024, clock_rate=1980000, memory_clock_rate=2619000,
    memory_bus_width=5120, is_integrated=False, uuid="dry-run",
)  # fmt: skip
PROPS = collections.namedtuple("Props", _PROPS)(**_PROPS)
TRITON_PROPS = {
    "max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536,
    "warpSize": 32, "sm_clock_rate": 1980000, "mem_clock_rate": 2619000, "mem_bus_width": 5120,
}  # fmt: skip
LAUNCHES = [0]  # Triton launches skipped so far
# Called at each skipped launch with the kernel's name, its arguments and what the kernel
# declares through Triton's launch_metadata (or None): the ledger's hook (ledger.py).
ON_LAUNCH: list = []
COMPILES = [0]  # triton.compile calls so far (a kernel in one configuration each)


def shim_path() -> Path:
    """Where the shim for this torch and this source is built (one per pair)."""
    import torch

    key = hashlib.sha256(SHIM_SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    return CACHE / f"host_cuda-{key}.so"


def missing() -> str | None:
    """Why the dry run cannot run here (no Triton, no g++, or a CUDA build of torch, whose
    own CUDA runtime the shim cannot stand in for), None where it can; imports torch."""
    import shutil
    from importlib.util import find_spec

    import torch

    if find_spec("triton") is None or shutil.which("g++") is None:
        return 'the GPU dry run needs Triton (pip install "triton==3.6.0") and g++'
    if torch.version.cuda is not None:
        return (
            f"the GPU dry run needs a CPU-only torch; this one is a CUDA {torch.version.cuda} build"
        )
    return None


def build_shim() -> Path:
    """The shim, compiled with g++ against the installed torch unless already built (~15 s)."""
    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is not None:
        raise SystemExit("gpu_dryrun: this torch is a CUDA build; the dry run needs a CPU-only one")
    out = shim_path()
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    libs = cpp_extension.library_paths()[0]
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = ["g++", "-O1", "-shared", "-fPIC", "-std=c++20", "-w", str(SHIM_SOURCE), "-o", str(tmp)]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [f"-L{libs}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{libs}"]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit("gpu_dryrun: g++ not found; install it (apt install g++)") from None
    except subprocess.CalledProcessError as e:
        tmp.unlink(missing_ok=True)  # no half-written shim left behind
        raise SystemExit(f"gpu_dryrun: building {SHIM_SOURCE.name} failed:\n{e.stderr}") from None
    tmp.replace(out)  # whole or not at all: a build cut short leaves no .so behind
    return out


def preloaded(shim: Path) -> bool:
    return str(shim) in os.environ.get("LD_PRELOAD", "").split(":")


def reexec_with(shim: Path) -> None:
    """Run this same command again with the shim preloaded (torch reads its hooks at import,
    so they cannot be added to a running process)."""
    preload = ":".join(filter(None, [str(shim), os.environ.get("LD_PRELOAD")]))
    env = {**os.environ, "LD_PRELOAD": preload}
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def install() -> None:
    """The Python half: torch.cuda, inductor and Triton see the pretend H100. Needs the shim
    preloaded (`preloaded`)."""
    import torch

    c = torch.cuda
    c.is_available = lambda: True
    c.device_count = lambda: 1
    c.current_device = lambda: 0
    c.get_device_capability = lambda device=None: CAPABILITY
    c.get_device_properties = lambda device=None: PROPS
    c.get_device_name = lambda device=None: PROPS.name
    c.is_bf16_supported = lambda *a, **k: True
    c._lazy_init = lambda: None
    c.set_device = lambda device: None
    c.synchronize = lambda device=None: None
    c._exchange_device = lambda device: 0
    c._maybe_exchange_device = lambda device: 0
    c.max_memory_allocated = lambda *a, **k: 0
    c.memory_allocated = lambda *a, **k: 0
    c.reset_peak_memory_stats = lambda *a, **k: None
    c.empty_cache = lambda: None
    c.mem_get_info = lambda *a, **k: (PROPS.total_memory, PROPS.total_memory)
    c.get_rng_state = lambda device="cuda": torch.zeros(16, dtype=torch.uint8)
    c.set_rng_state = lambda *a, **k: None
    c.random.get_rng_state, c.random.set_rng_state = c.get_rng_state, c.set_rng_state
    c._DeviceGuard = _Null
    c.Event = c.streams.Event = _Event
    torch._C._cuda_getCurrentRawStream = lambda device: 0
    torch._C._dynamo.guards._empty_strided_cuda = lambda size, stride, dtype: torch.empty_strided(
        size, stride, dtype=dtype, device="cuda"
    )
    _install_inductor(c)
    _install_triton()


class _Null:
    """A context manager that does nothing (a device guard: there is one device)."""

    def __init__(self, *args: object) -> None:
        pass

    def __enter__(self) -> "_Null":
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


class _Event:
    """A CUDA event that records nothing: every interval is 1 ms."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def record(self, *args: object, **kwargs: object) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, *args: object, **kwargs: object) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: "_Event") -> float:
        return 1.0


def _install_inductor(c: types.ModuleType) -> None:
    import torch._inductor.config as inductor
    from torch._dynamo.device_interface import CudaInterface
    from torch._inductor.runtime import benchmarking

    # CudaInterface bound torch.cuda's functions when it was defined: bind the pretend ones.
    for name, fn in {
        "current_device": c.current_device, "set_device": c.set_device,
        "device_count": c.device_count, "synchronize": c.synchronize,
        "get_device_properties": c.get_device_properties,
        "exchange_device": c._exchange_device, "maybe_exchange_device": c._maybe_exchange_device,
        "memory_allocated": c.memory_allocated, "is_bf16_supported": c.is_bf16_supported,
        "is_available": c.is_available, "get_raw_stream": lambda device: 0,
        "get_compute_capability": lambda device=None: CAPABILITY[0] * 10 + CAPABILITY[1],
    }.items():  # fmt: skip
        setattr(CudaInterface, name, staticmethod(fn))
    for cls in (
        benchmarking.Benchmarker, benchmarking.TritonBenchmarker,
        benchmarking.InductorBenchmarker, benchmarking.TorchProfilerBenchmarker,
    ):  # fmt: skip
        cls.benchmark_gpu = lambda self, *a, **k: 1.0
    inductor.compile_threads = 1  # workers are fresh processes, without this pretence
    inductor.use_static_cuda_launcher = False  # it loads cubins into a real GPU


def _install_triton() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime import driver

    class Launcher:
        def __init__(self, src: object = None, *args: object, **kwargs: object) -> None:
            self.name = getattr(src, "name", None) or "triton"

        # Triton calls a launcher with (grid x, y, z, stream, function, packed metadata,
        # launch metadata, enter hook, exit hook, *the kernel's arguments)
        def __call__(self, *args: object, **kwargs: object) -> None:
            LAUNCHES[0] += 1
            if ON_LAUNCH:
                meta = args[6] if len(args) > 6 else None
                declared = meta.get() if hasattr(meta, "get") else None
                for hook in ON_LAUNCH:
                    hook(self.name, args[9:], declared)

    class DryRunDriver(CudaDriver):  # a CudaDriver, so inductor keeps it as the active one
        launcher_cls = Launcher

        def __init__(self) -> None:  # no libcuda to load
            self.utils = types.SimpleNamespace(
                get_device_properties=lambda device: TRITON_PROPS,
                load_binary=lambda *a: (0, 0, 0, 0, PROPS.max_threads_per_block),
                unload_module=lambda *a: None,
            )

        def is_active(self) -> bool:
            return True

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", CAPABILITY[0] * 10 + CAPABILITY[1], 32)

        def get_current_device(self) -> int:
            return 0

        def set_current_device(self, device: int) -> None:
            pass

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_device_interface(self) -> types.ModuleType:
            import torch

            return torch.cuda

    driver.set_active(DryRunDriver())
    compile_ = triton.compile  # inductor calls triton.compile by attribute: count them

    def counted(*args: object, **kwargs: object) -> object:
        COMPILES[0] += 1
        return compile_(*args, **kwargs)

    triton.compile = counted
