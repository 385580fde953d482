"""What stands in, in a record's own step on the pretend H100 (record_side.py), for what a CPU
cannot run, and the record's Triton kernels' costs, which they do not declare: each booked
the way the ledger books this project's own (ledger.py). docs/ledger.md, "The record's own
step"; tests/unit/test_record_side.py checks each against a count made another way.
"""

import contextlib
import itertools
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts.gpu_dryrun.ledger import Recorder, product_dims

EOT, DOC_TOKENS = 50256, 1000  # the document end, and a document's length in the shards
SHARD_TOKENS = 8 * 2**20


# -- what the record's Triton kernels compute, which they do not declare


def _tensors(args: tuple) -> list:
    """The tensors among a launch's arguments, a TMA descriptor as the tensor it describes."""
    import torch

    out = []
    for a in args:
        base = getattr(a, "base", None)
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(base, torch.Tensor):
            out.append(base)
    return out


def symmetric_flops(rows: int, inner: int, batch: int, block: tuple[int, int]) -> float:
    """A symmetric product's FLOPs (rows × rows from an inner dimension), over the output tiles
    that hold an entry on or below the diagonal: the only tiles the record's kernels compute
    (they mirror the rest), each in full."""
    bm, bn = block
    tiles = sum(1 for i in range(-(-rows // bm)) for j in range(-(-rows // bn))
                if j * bn < (i + 1) * bm)  # fmt: skip
    return 2.0 * batch * tiles * bm * bn * inner


def kernel_costs(name: str, args: tuple) -> dict | None:
    """The record's Triton kernels' FLOPs (and bytes: their tensors', descriptors read as the
    tensors they describe), in the keys Triton's launch_metadata would declare them."""
    ts = _tensors(args)
    nbytes = float(sum(t.numel() * t.element_size() for t in ts))
    if len(ts) >= 2 and ("XXT" in name or "XTX" in name or "ba_plus_cAA" in name):
        a = ts[0]
        batch = a.shape[0] if a.ndim == 3 else 1
        m, k = a.shape[-2:]
        if "XTX" in name:
            m, k = k, m  # Aᵀ·A: the columns are the output's rows
        block = (128, 128) if (k if "XTX" not in name else m) == 768 else (64, 128)
        return {"flops": symmetric_flops(m, k, batch, block), "bytes": nbytes}
    if "linear_relu_square" in name and len(ts) >= 2:
        a, b = ts[0], ts[1]
        flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[0]
        key = "flops8" if "float8" in str(a.dtype) else "flops16"
        return {key: flops, "bytes": nbytes}
    return {"bytes": nbytes} if ts else None


# -- the stand-ins


class Documents:
    """The current micro-batch's document starts (host copies of the loader's cu_seqlens),
    for the attention stand-in: the device copy a paired layer doubles is computed by a
    kernel that does not run here."""

    def __init__(self) -> None:
        self.cum: list[int] = [0]

    def pairs(self, tokens: int, window: int) -> int:
        """(query, key) pairs a causal window of `window` keys back lets through, within each
        document, over `tokens` (the loader's documents, each doubled where the layer
        interleaves two copies of the stream)."""
        scale = tokens // max(self.cum[-1], 1)
        total = 0
        for lo, hi in itertools.pairwise(self.cum):
            n = (hi - lo) * scale
            w = n - 1 if window < 0 else min(window, n - 1)
            total += (w + 1) * n - w * (w + 1) // 2
        return total


def flash_attention(book: Callable, docs: Documents) -> Callable:
    """FlashAttention 3's varlen call as a custom op that books its arithmetic."""
    import torch

    def args_bytes(*ts: torch.Tensor) -> float:
        return float(sum(t.numel() * t.element_size() for t in ts))

    @torch.library.custom_op("record_dryrun::fa3_fwd", mutates_args=())
    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
        out = torch.empty_like(q)
        t, h, d = q.shape
        flops = 4.0 * h * d * docs.pairs(t, window)
        lse = t * h * 4  # the log-sum-exp it keeps for the backward, fp32
        book("flash_attn_varlen_fwd", flops, args_bytes(q, k, v, out) + lse)
        return out

    @fwd.register_fake
    def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
        return torch.empty_like(q)

    @torch.library.custom_op("record_dryrun::fa3_bwd", mutates_args=())
    def bwd(
        dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, window: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        t, h, d = q.shape
        flops = 2.5 * 4.0 * h * d * docs.pairs(t, window)
        nbytes = args_bytes(dout, q, k, v, out, dq, dk, dv) + t * h * 4
        book("flash_attn_varlen_bwd", flops, nbytes)
        return dq, dk, dv

    @bwd.register_fake
    def _(dout, q, k, v, out, window):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        q, k, v, window = inputs
        ctx.save_for_backward(q, k, v, output)
        ctx.window = window

    def backward(ctx: Any, dout: torch.Tensor) -> tuple:
        q, k, v, out = ctx.saved_tensors
        dq, dk, dv = bwd(dout, q, k, v, out, ctx.window)
        return dq, dk, dv, None

    fwd.register_autograd(backward, setup_context=setup)

    def flash_attn_varlen_func(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any,
        window_size: tuple = (-1, -1), **kwargs: Any,
    ) -> torch.Tensor:  # fmt: skip
        return fwd(q, k, v, int(window_size[0]))

    return flash_attn_varlen_func


class NvrtcKernel:
    """torch.cuda._compile_kernel's result: its launches booked at their tensors' bytes."""

    def __init__(self, name: str, book: Callable) -> None:
        self.name, self.book = name, book

    def set_shared_memory_config(self, nbytes: int) -> None:
        pass

    def __call__(self, grid: tuple, block: tuple, args: tuple, **kwargs: Any) -> None:
        ts = _tensors(tuple(args))
        self.book(self.name, 0.0, float(sum(t.numel() * t.element_size() for t in ts)))


class Collectives:
    """torch.distributed as rank 0 of `world`: each collective booked at the ring's bytes per
    rank, its result as if every rank held rank 0's tensors; the calls return at once."""

    def __init__(
        self, world: int, book: Callable, muted: Callable = contextlib.nullcontext
    ) -> None:
        self.world, self.book, self.muted = world, book, muted

    def share(self, t: Any) -> float:
        return t.numel() * t.element_size() * (self.world - 1) / self.world

    def install(self) -> None:
        import torch
        import torch.distributed as dist

        def done(*_: Any, **__: Any) -> Any:
            fut = torch.futures.Future()
            fut.set_result(None)
            return types.SimpleNamespace(wait=lambda *a, **k: True, get_future=lambda: fut,
                                         is_completed=lambda: True)  # fmt: skip

        @torch._dynamo.disable
        def all_reduce(t: Any, *args: Any, **kwargs: Any) -> Any:
            self.book("all_reduce", 2 * self.share(t))
            return done()

        @torch._dynamo.disable
        def reduce_scatter_tensor(out: Any, inp: Any, *args: Any, **kwargs: Any) -> Any:
            self.book("reduce_scatter", self.share(inp))
            return done()

        @torch._dynamo.disable
        def all_gather_into_tensor(out: Any, inp: Any, *args: Any, **kwargs: Any) -> Any:
            self.book("all_gather", self.share(out))
            return done()

        @torch._dynamo.disable
        def all_to_all_single(out: Any, inp: Any, *args: Any, **kwargs: Any) -> Any:
            # every rank sends what rank 0 sends: rank 0 receives as many rows as it sends
            # (the counts, on the host, copied), each a row of rank 0's own slice (indices,
            # on the device: row 0, the first of that slice)
            self.book("all_to_all", float(inp.numel() * inp.element_size()))
            if out.device.type == "cpu" and out.numel() == inp.numel():
                out.copy_(inp)
            elif not out.is_floating_point():
                with self.muted():  # not the GPU's work: the collective's row stands for it
                    out.zero_()
            return done()

        for name, fn in {
            "init_process_group": lambda *a, **k: None, "barrier": lambda *a, **k: None,
            "destroy_process_group": lambda *a, **k: None, "is_initialized": lambda: True,
            "get_world_size": lambda *a, **k: self.world, "get_rank": lambda *a, **k: 0,
            "broadcast": lambda *a, **k: done(), "reduce": lambda *a, **k: done(),
            "all_reduce": all_reduce, "reduce_scatter_tensor": reduce_scatter_tensor,
            "all_gather_into_tensor": all_gather_into_tensor,
            "all_to_all_single": all_to_all_single,
        }.items():  # fmt: skip
            setattr(dist, name, fn)


def unpinned(fn: Callable) -> Callable:
    def call(*args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return call


def write_shards(folder: Path, rng: Any) -> None:
    """Two train shards and one validation shard in the records' format (a 256-int32 header:
    magic 20240520, version 1, token count; then uint16 tokens)."""
    import numpy as np

    data = folder / "data" / "fineweb10B"
    data.mkdir(parents=True)
    for name in ("fineweb_train_000001.bin", "fineweb_train_000002.bin",
                 "fineweb_val_000000.bin"):  # fmt: skip
        tokens = rng.integers(0, EOT, SHARD_TOKENS).astype(np.uint16)
        tokens[rng.random(SHARD_TOKENS) < 1 / DOC_TOKENS] = EOT
        tokens[0] = EOT
        header = np.zeros(256, dtype=np.int32)
        header[:3] = (20240520, 1, SHARD_TOKENS)
        with open(data / name, "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.tobytes())


class RecordRecorder(Recorder):
    """The ledger's recorder, with the record's Triton kernels' costs (`kernel_costs`) where
    inductor states none (a kernel of the record's own that its graph launches) or Triton's
    launch_metadata declares none."""

    def inductor_kernel(self, meta: dict, name: str, args: tuple) -> None:
        kernel = meta.get("kernel_name", name)
        costs = kernel_costs(kernel, args)
        if meta.get("kernel_flop") or not costs or not any(k.startswith("flops") for k in costs):
            return super().inductor_kernel(meta, name, args)
        self._declared(kernel, args, costs)

    def triton_kernel(self, name: str, args: tuple, declared: dict | None) -> None:
        if getattr(self._inside, "depth", 0):
            return
        self._declared(name, args, declared or kernel_costs(name, args) or {})

    def _declared(self, name: str, args: tuple, costs: dict) -> None:
        flops = float(sum(costs.get(k, 0) for k in ("flops", "flops8", "flops16")))
        dtype = "float8" if costs.get("flops8") else ""
        dims = product_dims(tuple(_tensors(args))) if flops else ()
        self.book(name, "triton", dtype, flops, float(costs.get("bytes") or 0.0), dims)
