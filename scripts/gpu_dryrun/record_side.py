"""A record's own training step through the same ledger, from the log it published:

    python -m scripts.gpu_dryrun.record_side LOG --json record.json
    python -m scripts.gpu_dryrun.record_side --compare record.json ours.json

LOG is a modded-nanogpt record's log (`records/track_1_short/<record>/<run>.txt`), which
begins with the code it ran: its `train_gpt.py` and, from 2026, its `triton_kernels.py`. They
are written to a scratch folder, never into this tree, and run as they are on the pretend H100
(fake_gpu.py) as rank 0 of `--world` ranks, counted launch by launch as `--ledger` counts a
preset (ledger.py): docs/ledger.md, "The record's own step".

The script runs unchanged up to its warm-up; from there, this module steps it as its own
training loop does (the TrainingManager loop of 2026's records, #89's, or the optimizer list
of late 2025's, #46's), at the first steps of each stage: two steps to compile, then the
next two, an even (normal) and an odd (Adam) step, counted. What stands in for what a CPU
cannot run:
- torch.distributed: rank 0 of `--world`, each collective booked at the ring's bytes per
  rank (ledger.Wire's rule) and done as if every rank held rank 0's tensors;
- FlashAttention 3 (fetched from the kernels hub at run time): a custom op that books the
  (query, key) pairs its documents and window let through, 4·H·D FLOPs each forward and 2.5
  times that backward (the rule the ledger applies to this project's attention), its tensors'
  bytes, and returns uninitialised memory;
- a kernel compiled with NVRTC (#89's cross-entropy): its tensor arguments' bytes, each once;
- the record's own Triton kernels, which declare no costs: their products' FLOPs from their
  operands (the symmetric products only over the tiles on and below the diagonal, which are
  all those kernels compute);
- its data: random tokens with a document end every ~1,000, as scripts/bench/gpu.py's.
"""

import argparse
import contextlib
import itertools
import os
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from scripts.gpu_dryrun import fake_gpu
from scripts.gpu_dryrun.ledger import Recorder, product_dims

KERNELS_SEPARATOR = "\n\n" + "-" * 40 + "\n# triton_kernels.py\n" + "-" * 40 + "\n\n"
LOG_START = "\n" + "=" * 100 + "\n"
WARMUP = "#            Warmup kernels"  # the banner the script's warm-up starts under
EOT, DOC_TOKENS = 50256, 1000
SHARD_TOKENS = 8 * 2**20


def split_log(text: str) -> tuple[str, str | None]:
    """(train_gpt.py up to its warm-up, triton_kernels.py or None) from a record's log: logs
    from 2026 print both files, older ones train_gpt.py alone."""
    if KERNELS_SEPARATOR in text:
        train, rest = text.split(KERNELS_SEPARATOR, 1)
        kernels: str | None = rest.split(LOG_START, 1)[0]
    else:
        train, kernels = text.split(LOG_START, 1)[0], None
    cut = train.find(WARMUP)
    if cut < 0:
        raise SystemExit(
            f"record_side: the log's train_gpt.py has no {WARMUP.strip()!r} banner: not a "
            "record's log of late 2025 or later (its code, then its run)"
        )
    return train[: train.rfind("\n", 0, cut)] + "\n", kernels


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


def _unpinned(fn: Callable) -> Callable:
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


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", type=Path, nargs="?", help="a record's log (its code, then its run)")
    p.add_argument("--world", type=int, default=8, help="rank 0's share of this many ranks")
    p.add_argument("--stages", default="all", help="how many stages to count, or 'all'")
    p.add_argument("--json", type=Path, help="every launch counted, into this file")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("RECORD", "OURS"),
                   help="two ledgers' JSON: ours against the record's, stage by stage")  # fmt: skip
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if args.compare:
        from scripts.gpu_dryrun.calibrate import constants
        from scripts.gpu_dryrun.report import compare_table, read_json

        for path in args.compare:
            if not path.is_file():
                raise SystemExit(f"record_side: no ledger at {path} (write one with --json)")
        record, ours = (read_json(path)[1] for path in args.compare)
        print(compare_table(record, ours, constants()))
        return 0
    if args.log is None or not args.log.is_file():
        raise SystemExit(f"record_side: no record log at {args.log} (give the log's path)")
    if args.world < 1 or 8 % args.world:
        raise SystemExit(
            f"record_side: --world must divide 8 (the records' rule); got {args.world}"
        )
    if args.stages != "all" and not (args.stages.isdigit() and int(args.stages) >= 1):
        raise SystemExit(f"record_side: --stages takes a count or 'all'; got {args.stages!r}")
    train_src, kernels_src = split_log(args.log.read_text())
    shim = fake_gpu.build_shim()
    if not fake_gpu.preloaded(shim):
        fake_gpu.reexec_with(shim)  # does not return
    fake_gpu.install()
    t0 = time.perf_counter()
    steps = run(train_src, kernels_src, args.world,
                None if args.stages == "all" else int(args.stages))  # fmt: skip
    from scripts.gpu_dryrun.calibrate import constants
    from scripts.gpu_dryrun.report import ledger_table, write_json

    print(f"record log {args.log.name}, rank 0 of {args.world}:")
    print(ledger_table(steps, constants(), lambda step: None))
    if args.json is not None:
        meta = {"record_log": args.log.name, "world": args.world}
        write_json(args.json, meta, steps)
        print(f"every launch: {args.json}")
    print(f"({time.perf_counter() - t0:.0f} s, {fake_gpu.COMPILES[0]} Triton compiles)")
    return 0


def run(train_src: str, kernels_src: str | None, world: int, stages: int | None) -> list:
    """The record's counted steps: two per stage (normal, Adam), after two that compile."""
    import numpy as np

    from scripts.gpu_dryrun.ledger import Parts, enable_estimates, install, load_shim
    from scripts.gpu_dryrun.measure import StepLedger

    enable_estimates()
    recorder = RecordRecorder(Parts(frozenset({50304}), frozenset({3072})), load_shim())
    remove = install(recorder)
    docs = Documents()

    def book_library(name: str, flops: float, nbytes: float) -> None:
        recorder.book(name, "library", "bfloat16" if flops else "", flops, nbytes)

    scratch = Path(tempfile.mkdtemp(prefix="record_side-"))
    (scratch / "train_gpt.py").write_text(train_src)
    if kernels_src is not None:
        (scratch / "triton_kernels.py").write_text(kernels_src)
    write_shards(scratch, np.random.default_rng(0))
    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho '(dry run: no nvidia-smi)'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), DATA_PATH=str(scratch),
                      PATH=f"{bin_dir}:{os.environ['PATH']}")  # fmt: skip
    import torch

    Collectives(world, recorder.book_collective, recorder.muted).install()
    for name in ("empty", "empty_like", "zeros"):  # pinned host memory: only a faster copy
        setattr(torch, name, _unpinned(getattr(torch, name)))
    torch.cuda._compile_kernel = lambda src, name, *a, **k: NvrtcKernel(name, book_library)
    sys.modules["kernels"] = types.SimpleNamespace(get_kernel=lambda *a, **k: types.SimpleNamespace(
        flash_attn_interface=types.SimpleNamespace(
            flash_attn_varlen_func=flash_attention(book_library, docs))))  # fmt: skip
    sys.path.insert(0, str(scratch))
    sys.argv = [str(scratch / "train_gpt.py")]
    cwd = os.getcwd()
    os.chdir(scratch)
    try:
        # a module of its own, as `python train_gpt.py` would make: dynamo imports the module
        # of each function it compiles by name
        module = types.ModuleType("train_gpt")
        module.__file__ = sys.argv[0]
        sys.modules["train_gpt"] = module
        ns = module.__dict__
        exec(compile(train_src, sys.argv[0], "exec"), ns)
        return drive(ns, recorder, docs, stages, StepLedger)
    finally:
        os.chdir(cwd)
        remove()
        shutil.rmtree(scratch, ignore_errors=True)  # the record's files and the shards


def drive(ns: dict, recorder: Any, docs: Documents, stages: int | None,
          step_ledger: type) -> list:  # fmt: skip
    """The record's loop body at each stage's first steps: s and s + 1 compile, s + 2 and
    s + 3 are counted, the even one a normal step and the odd one an Adam step (the records
    update Adam on odd steps), in that order."""
    loop = TrainingManagerLoop(ns, docs) if "training_manager" in ns else OptimizersLoop(ns, docs)
    out = []
    for s in loop.starts[:stages]:
        loop.step(s)
        loop.step(s + 1)
        for counted in sorted((s + 2, s + 3), key=lambda n: n % 2):
            with recorder.recording():
                tokens = loop.step(counted, recorder)
            kind = "adam" if counted % 2 else "normal"
            out.append(step_ledger(counted, kind, tokens, recorder.take()))
    return out


def _documents(docs: Documents, cum: Any) -> None:
    """The micro-batch's document starts, from the loader's (padded with its last entry)."""
    starts = [int(x) for x in cum.cpu().tolist()]
    docs.cum = starts[: starts.index(max(starts)) + 1]


class TrainingManagerLoop:
    """Records from 2026 on (#89): a TrainingManager schedules the stages and steps the one
    optimizer; its loop body, as the script's training section writes it."""

    def __init__(self, ns: dict, docs: Documents) -> None:
        self.ns, self.docs = ns, docs
        self.tm, self.model = ns["training_manager"], ns["model"]
        self.accum = ns["grad_accum_steps"]
        first = ns["TRAINING_STAGES"][0]
        self.loader = ns["distributed_data_generator"](
            ns["args"].train_files, first.batch_size, first.train_max_seq_len,
            grad_accum_steps=self.accum,
        )  # fmt: skip
        self.starts = [0, *self.tm.get_transition_steps()][: len(ns["TRAINING_STAGES"]) - 1]
        # The record's warm-up evaluates first, which makes its kernels' placeholder argument
        # (a global, set at first use); a training graph cannot set it (dynamo refuses the
        # side effect inside an autograd.Function), so it is made here, as that warm-up would
        kernels = sys.modules.get("triton_kernels")
        if hasattr(kernels, "_get_dummy_f32"):
            kernels._get_dummy_f32(ns["device"])

    def step(self, s: int, recorder: Any = None) -> int:
        tm, tokens = self.tm, 0
        tm.advance_schedule(s)
        for _ in range(self.accum):
            inputs, targets, cum, bigram_inputs, bigram_cpu = self.loader.send(
                tm.train_loader_send_args
            )
            _documents(self.docs, cum)
            tokens += inputs.numel()
            tm.sparse_index_update(s, bigram_cpu)
            loss = self.model(inputs, targets, cum, bigram_inputs, tm.get_forward_args()).sum()
            tm.sparse_index_share(s)
            (loss * self.ns["grad_scale"]).backward()
        with recorder.phase("optimizer") if recorder else contextlib.nullcontext():
            tm.step_optimizers(s)
            self.model.quantize_mlp_fp8(bootstrap_down=(s < 16))
        return tokens


class OptimizersLoop:
    """Records of late 2025 (#46): a list of optimizers (Adam first, then Muon), stepped by
    `step_optimizers`, the window and batch size read from `get_ws` and `get_bs`."""

    def __init__(self, ns: dict, docs: Documents) -> None:
        missing = [k for k in ("optimizers", "step_optimizers", "get_ws", "get_bs", "args")
                   if k not in ns]  # fmt: skip
        if missing:
            raise SystemExit(
                "record_side: this record's script has neither a training_manager nor "
                f"the loop of late 2025 (no {', '.join(missing)}): not a form it knows"
            )
        self.ns, self.docs, self.model = ns, docs, ns["model"]
        self.accum, args = ns["grad_accum_steps"], ns["args"]
        self.bs = ns["get_bs"](0)
        self.loader = ns["distributed_data_generator"](
            args.train_files, self.bs, args.train_max_seq_len, grad_accum_steps=self.accum
        )
        self.ws_long = ns["get_ws"](0)[1]
        self.model.yarn.reset()
        shape = [(ns["get_bs"](s), ns["get_ws"](s)) for s in range(args.num_scheduled_iterations)]
        self.starts = [0, *(s for s in range(1, len(shape)) if shape[s] != shape[s - 1])]

    def step(self, s: int, recorder: Any = None) -> int:
        ns, args, tokens = self.ns, self.ns["args"], 0
        ws_short, ws_long = ns["get_ws"](s)
        if ws_long != self.ws_long:
            self.model.yarn.apply(self.ws_long, ws_long)
            self.ws_long = ws_long
        bs = ns["get_bs"](s)
        send = (bs, args.train_max_seq_len, self.accum) if bs != self.bs else None
        self.bs = bs
        for i in range(self.accum):
            if i == self.accum - 1 and s % 2 == 1:
                ns["optimizers"][0].should_sync = True  # Adam's exchange, on its odd step
            inputs, targets, cum = self.loader.send(send)
            _documents(self.docs, cum)
            tokens += inputs.numel()
            (self.model(inputs, targets, cum, ws_short, ws_long) / self.accum).backward()
        with recorder.phase("optimizer") if recorder else contextlib.nullcontext():
            ns["step_optimizers"](s, ns["optimizers"], self.model)
        return tokens


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


if __name__ == "__main__":
    sys.exit(main())
