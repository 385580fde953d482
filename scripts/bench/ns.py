"""Newton–Schulz lab: every way of running Muon's orthogonalisation, timed and checked.

Each variant is a formulation (`optim.muon.ns_form`) × coefficient schedule × iteration count ×
precision × strategy × compile mode. Timing covers the NS of one whole shape set (the hidden
matrices of a GPT), medians of interleaved rounds, against two baselines measured in the same
run: a large matmul in the same dtype (the "peak" column's denominator) and the NS that
`torch.optim.Muon` runs (one matrix at a time, classic coefficients).

Strategies: batched = one stack per shape class, as optim.Muon runs it; loop = one matrix at
a time; streams = one matrix at a time spread over 3 CUDA streams (CUDA only); torch =
torch.optim.Muon's own Newton–Schulz. Accuracy, on probe matrices of each shape class:
- σ min / σ max: singular values of the result for Gaussian inputs (σ min over the
  rectangular ones only: square Gaussian matrices have singular values near 0 that no 5 steps
  lift), the band the coefficients promise;
- ‖OOᵀ−I‖: ‖O·Oᵀ − I‖_F / √m on the rectangular Gaussian probes (m the short side);
- polar: ‖O − U·Vᵀ‖_F / ‖U·Vᵀ‖_F against the fp64 SVD polar factor, all Gaussian probes;
- muon: the relative difference of one `optim.Muon` step's parameter change from the same
  step with the exact fp64 U·Vᵀ, on gradient-like probes (singular values log-uniform over two
  decades, the slow decay real gradients show). Strategy and compile do not enter it.

    python scripts/bench/ns.py --quick                  # tiny shapes, well under a minute on CPU
    python scripts/bench/ns.py --shapes 124m            # GPT-2 small (~8 min on 2 CPU cores)
    python scripts/bench/ns.py --shapes 124m --device cuda
    python scripts/bench/ns.py --tp                     # tensor-parallel NS vs gathering
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from optim.muon.newton_schulz import (
    COEFFICIENT_SETS,
    NS_FORMS,
    ns_coefficients,
    ns_flops,
    zeropower,
)
from optim.muon.ns_dtype import bf16_matmul_is_fast
from scripts.bench.ns_accuracy import Probes

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
EPS = 1e-7


def gpt_shapes(n_layer: int, d: int) -> list[tuple[int, int]]:
    """The hidden matrices of a GPT block stack: q, k, v, o (d×d), fc (4d×d), proj (d×4d)."""
    return [(d, d)] * 4 * n_layer + [(4 * d, d), (d, 4 * d)] * n_layer


# tiny = the default model preset, 124m = GPT-2 small, 350m = GPT-2 medium.
SHAPE_SETS = {"tiny": gpt_shapes(4, 128), "124m": gpt_shapes(12, 768), "350m": gpt_shapes(24, 1024)}


@dataclass(frozen=True)
class Variant:
    form: str = "factored"
    coefficients: str = "classic"
    steps: int = 5
    dtype: str = "bf16"
    strategy: str = "batched"
    compile: str = "none"

    @property
    def name(self) -> str:
        parts = [self.form, self.coefficients, str(self.steps), self.dtype, self.strategy]
        return " ".join([*parts, *([self.compile] if self.compile != "none" else [])])

    @property
    def math(self) -> tuple[str, str, int, str]:
        """What decides the numbers (strategy and compile only reorder the same arithmetic)."""
        return (self.form, self.coefficients, self.steps, self.dtype)


def variants(device: torch.device, quick: bool, compile_modes: list[str]) -> list[Variant]:
    """The grid form × coefficients × steps in the default dtype, then one axis at a time off
    the default (factored, classic, 5): precision, strategy, compile mode."""
    dtype = "bf16" if bf16_matmul_is_fast(device) else "fp32"
    base = Variant(dtype=dtype)
    steps = (4, 5) if quick else (4, 5, 6)
    grid = [
        replace(base, form=f, coefficients=c, steps=s)
        for c in COEFFICIENT_SETS
        for s in steps
        for f in NS_FORMS
    ]
    axes = [replace(base, dtype="fp32" if dtype == "bf16" else "bf16")]
    axes += [replace(base, strategy="loop"), replace(base, strategy="torch")]
    if device.type == "cuda":
        axes.append(replace(base, strategy="streams"))
    axes += [replace(base, compile=m) for m in compile_modes]
    axes += [replace(base, coefficients="polar_express", compile=m) for m in compile_modes]
    return grid + axes


def wide_stacks(shapes: list[tuple[int, int]], gen: torch.Generator) -> list[torch.Tensor]:
    """One Gaussian stack per shape class in its wide orientation (what optim.Muon batches)."""
    counts: dict[tuple[int, int], int] = {}
    for s in shapes:
        key = (min(s), max(s))
        counts[key] = counts.get(key, 0) + 1
    return [torch.randn(k, m, n, generator=gen) for (m, n), k in sorted(counts.items())]


def ns_runner(v: Variant, device: torch.device) -> Callable[[list[torch.Tensor]], list]:
    """A function from a list of stacks to their orthogonalised stacks, the way `v` runs."""
    dtype = DTYPES[v.dtype]
    coeffs = ns_coefficients(v.coefficients, v.steps)
    scale = COEFFICIENT_SETS[v.coefficients].norm_scale
    fn: Callable = zeropower
    if v.compile != "none":
        fn = torch.compile(zeropower, mode=None if v.compile == "default" else v.compile)

    def one(x: torch.Tensor) -> torch.Tensor:
        return fn(x, coeffs, EPS, scale, dtype, v.form)

    if v.strategy == "batched":
        return lambda stacks: [one(s) for s in stacks]
    if v.strategy == "loop":
        return lambda stacks: [torch.stack([one(x) for x in s]) for s in stacks]
    if v.strategy == "torch":
        from torch.optim._muon import _zeropower_via_newtonschulz as torch_ns

        return lambda stacks: [
            torch.stack([torch_ns(x, coeffs[0], v.steps, EPS) for x in s]) for s in stacks
        ]
    streams = [torch.cuda.Stream(device) for _ in range(3)]

    def on_streams(stacks: list[torch.Tensor]) -> list[torch.Tensor]:
        out, k = [], 0
        main = torch.cuda.current_stream(device)
        for s in stacks:
            rows = []
            for x in s:
                stream = streams[k % len(streams)]
                stream.wait_stream(main)
                with torch.cuda.stream(stream):
                    rows.append(one(x))
                k += 1
            out.append(rows)
        for stream in streams:
            main.wait_stream(stream)
        return [torch.stack(r) for r in out]

    return on_streams


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device, dtype: torch.dtype, rounds: int) -> float:
    """TFLOP/s of a large square matmul in `dtype`, the ceiling the NS rows are put against:
    the best rate over sizes doubling from 256 up to 8192 (CUDA) or 2048 (CPU), stopping once
    one product takes over 0.2 s, so that a dtype a CPU only emulates (bf16 without AVX-512
    BF16 or AMX, ~10-60x slower) costs a second here rather than minutes."""
    largest = 8192 if device.type == "cuda" else 2048
    best, n = 0.0, 256
    while n <= largest:
        a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
        times = []
        for _ in range(rounds + 1):
            synchronise(device)
            t0 = time.perf_counter()
            a @ b
            synchronise(device)
            times.append(time.perf_counter() - t0)
            if times[-1] > 0.2:
                break
        best = max(best, 2 * n**3 / statistics.median(times[1:] or times) / 1e12)
        if max(times) > 0.2:
            break
        n *= 2
    return best


def time_rounds(
    runs: dict[Variant, Callable], stacks: list, device: torch.device, rounds: int
) -> dict[Variant, float]:
    """Median ms of each runner over the stacks; every round visits all of them, in
    alternating order, so background load and clock drift hit every variant alike."""
    times: dict[Variant, list[float]] = {v: [] for v in runs}
    order = list(runs.items())
    for r in range(rounds):
        for v, run in order if r % 2 == 0 else order[::-1]:
            synchronise(device)
            t0 = time.perf_counter()
            run(stacks)
            synchronise(device)
            times[v].append((time.perf_counter() - t0) * 1000)
    return {v: statistics.median(t) for v, t in times.items()}


def bench(
    shape_set: str,
    device: torch.device,
    quick: bool,
    compile_modes: list[str],
    rounds: int,
    per_class: int,
) -> tuple[list[dict], dict[str, float]]:
    shapes = SHAPE_SETS[shape_set]
    stacks = [s.to(device) for s in wide_stacks(shapes, torch.Generator().manual_seed(0))]
    probes = Probes(stacks, per_class)
    runs = {v: ns_runner(v, device) for v in variants(device, quick, compile_modes)}
    for run in runs.values():  # warm-up: compiles, allocator, BLAS threads
        run(stacks)
    peak = {d: matmul_peak(device, DTYPES[d], 5) for d in {v.dtype for v in runs}}
    ms = time_rounds(runs, stacks, device, rounds)
    torch_ms = next(t for v, t in ms.items() if v.strategy == "torch")
    muon: dict[tuple, float] = {}
    rows = []
    for v, run in runs.items():
        if v.math not in muon:
            settings = {"ns_coefficients": v.coefficients, "ns_steps": v.steps,
                        "ns_form": v.form, "eps": EPS}  # fmt: skip
            muon[v.math] = probes.muon_error(settings, DTYPES[v.dtype], device)
        gflop = sum(ns_flops(s, v.steps, v.form) for s in shapes) / 1e9
        tflops = gflop / ms[v]  # GFLOP per ms = TFLOP/s
        rows.append(
            asdict(v)
            | {
                "name": v.name,
                "ms": ms[v],
                "vs_torch": torch_ms / ms[v],
                "gflop": gflop,
                "tflops": tflops,
                "peak_pct": 100 * tflops / peak[v.dtype],
                **probes.accuracy(run, device),
                "muon": muon[v.math],
            }
        )
    return rows, peak


def recommend(rows: list[dict]) -> tuple[dict, dict]:
    """The fastest eager, batched variant whose accuracy is no worse than the default's
    (factored, classic, 5): band no wider by 0.02 on either side, polar and muon errors no
    larger by 0.005. Default dtype rows only: the precision is the machine's choice."""
    base = next(
        r
        for r in rows
        if r["name"].startswith("factored classic 5")
        and r["strategy"] == "batched"
        and r["compile"] == "none"
    )
    ok = [
        r
        for r in rows
        if r["strategy"] == "batched"
        and r["compile"] == "none"
        and r["dtype"] == base["dtype"]
        and r["sv_min"] >= base["sv_min"] - 0.02
        and r["sv_max"] <= base["sv_max"] + 0.02
        and r["polar"] <= base["polar"] + 0.005
        and r["muon"] <= base["muon"] + 0.005
    ]
    return base, min(ok, key=lambda r: r["ms"])


def print_table(rows: list[dict], peak_note: str) -> None:
    print(
        f"{'variant':<44} {'ms':>8} {'×torch':>7} {'GFLOP':>7} {'TFLOP/s':>8} {'%peak':>6} "
        f"{'σ min':>6} {'σ max':>6} {'‖OOᵀ−I‖':>8} {'polar':>6} {'muon':>6}"
    )
    for r in rows:
        print(
            f"{r['name']:<44} {r['ms']:>8.1f} {r['vs_torch']:>6.2f}x {r['gflop']:>7.1f} "
            f"{r['tflops']:>8.2f} {r['peak_pct']:>5.0f}% {r['sv_min']:>6.3f} "
            f"{r['sv_max']:>6.3f} {r['orth']:>8.4f} {r['polar']:>6.4f} {r['muon']:>6.4f}"
        )
    print(peak_note)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--shapes", choices=list(SHAPE_SETS), help="default: tiny on CPU with --quick, else 124m"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 3 rounds, no compile")
    parser.add_argument("--rounds", type=int, help="timed rounds per variant (default 7, quick 3)")
    parser.add_argument(
        "--compile",
        nargs="*",
        help="compile modes (default: none with "
        "--quick; default on CPU; default and max-autotune-no-cudagraphs on CUDA)",
    )
    parser.add_argument("--probes", type=int, default=2, help="accuracy probes per shape class")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--tp",
        action="store_true",
        help="tensor-parallel NS against gathering "
        "the matrix, on 2 gloo ranks (scripts/bench/ns_tp.py)",
    )
    args = parser.parse_args(argv)
    for name in ("rounds", "probes", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.tp:
        from scripts.bench.ns_tp import main as tp_main

        return tp_main(quick=args.quick)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shape_set = args.shapes or ("tiny" if args.quick else "124m")
    if args.compile is not None:
        modes = args.compile
    elif args.quick:
        modes = []
    else:
        modes = ["default"] + (["max-autotune-no-cudagraphs"] if device.type == "cuda" else [])
    rounds = args.rounds or (3 if args.quick else 7)
    print(
        f"device {device}, threads {torch.get_num_threads()}, torch {torch.__version__}; "
        f"shapes {shape_set} ({len(SHAPE_SETS[shape_set])} matrices), {rounds} rounds"
    )
    rows, peak = bench(shape_set, device, args.quick, modes, rounds, args.probes)
    peaks = ", ".join(f"{d} {t:.3f} TFLOP/s" for d, t in sorted(peak.items()))
    note = f"%peak: of the best square matmul in the row's dtype in this run: {peaks}"
    if not bf16_matmul_is_fast(device):
        note += " (bf16 is emulated on this CPU: no AVX-512 BF16 or AMX; fp32 is its fast dtype)"
    print_table(rows, note)
    base, best = recommend(rows)
    print(
        f"recommended (the fastest as accurate as the default, {base['name']}): "
        f"{best['name']}, {base['ms'] / best['ms']:.2f}x the default's speed"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
