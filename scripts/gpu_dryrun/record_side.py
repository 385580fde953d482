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
import os
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from scripts.gpu_dryrun import fake_gpu
from scripts.gpu_dryrun.record_loops import drive
from scripts.gpu_dryrun.record_standins import (
    Collectives,
    Documents,
    NvrtcKernel,
    RecordRecorder,
    flash_attention,
    unpinned,
    write_shards,
)

KERNELS_SEPARATOR = "\n\n" + "-" * 40 + "\n# triton_kernels.py\n" + "-" * 40 + "\n\n"
LOG_START = "\n" + "=" * 100 + "\n"
WARMUP = "#            Warmup kernels"  # the banner the script's warm-up starts under


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
        setattr(torch, name, unpinned(getattr(torch, name)))
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


if __name__ == "__main__":
    sys.exit(main())
