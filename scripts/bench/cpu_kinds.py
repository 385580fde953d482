"""What this CPU runs, and how fast, as each CPU kind torch can be held to here.

    python scripts/bench/cpu_kinds.py            # the probes under every kind
    python scripts/bench/cpu_kinds.py --toys     # and the record toy commands (docs/), timed

torch can be held below what a CPU has (`ONEDNN_MAX_CPU_ISA` for oneDNN's matmuls,
`ATEN_CPU_CAPABILITY` for torch's own kernels), never above: on an AVX-512 BF16 CPU this
measures that CPU, an AVX-512 CPU without bf16 (bf16 emulated), and an AVX2-only one. Each
kind runs in a process of its own (the variables are read at startup) and reports:
- what `train.autocast=auto` and `optim.muon.ns_dtype=auto` pick there;
- a bf16 matmul's time over an fp32 one's (256², one thread: the startup warning's measure);
- the FP8 product at 256 × 768 → 8,192 (one thread): the emulation the model runs
  (model/fp8.py), torch's own CPU kernel (`torch._scaled_mm`, which the model never calls on
  a CPU) and the bf16 matmul, as ratios to the emulation;
- whether a bf16 and an fp32 matmul (256 × 768 · 768 × 3,072) give the same bits on 1 and 2
  threads: where they do not, only runs with the same thread count compare bit for bit;
- with --toys, the seconds of each record preset at toy size (`size=toy`, docs/speedruns.md).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KINDS = {
    "this CPU": {},
    "AVX-512, no bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx512"},
    "AVX2 only": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
}
# The toy commands of docs/speedruns.md (each preset at `size=toy`); tests/unit/test_readme.py
# checks the page shows them
TOYS = {
    f"record {number} toy (s)": f"experiment={name} size=toy"
    for number, name in (("#9", "record_2024_11_06"), ("#21", "record_2025_01_26"),
                         ("#46", "record_2025_11_29"), ("#89", "record_2026_07_17"),
                         ("M", "record_medium_2025_12_31"))
}  # fmt: skip


def best_seconds(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def probe() -> dict:
    """This process's CPU kind, measured (see the module docstring)."""
    import torch

    from model.fp8 import emulated_scaled_mm
    from optim.muon.ns_dtype import resolve_ns_dtype
    from trainer.runtime import resolve_autocast

    cpu = torch.device("cpu")
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    bf16 = best_seconds(lambda: a.bfloat16() @ a.bfloat16()) / best_seconds(lambda: a @ a)
    g = torch.Generator().manual_seed(0)
    x8 = (torch.randn(256, 768, generator=g) * 8).to(torch.float8_e4m3fn)
    w8 = (torch.randn(8192, 768, generator=g) * 8).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    emulated = best_seconds(lambda: emulated_scaled_mm(x8, w8.T, one, one, torch.bfloat16), 3)
    t0 = time.perf_counter()  # one call: on some CPUs it takes tens of seconds
    torch._scaled_mm(x8, w8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    kernel = time.perf_counter() - t0
    xb, wb = x8.bfloat16(), w8.bfloat16()
    bf16_head = best_seconds(lambda: xb @ wb.T, 3)
    same = {}
    u, v = torch.randn(256, 768, generator=g), torch.randn(768, 3072, generator=g)
    for dtype in (torch.bfloat16, torch.float32):
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(u.to(dtype) @ v.to(dtype))
        same[str(dtype).removeprefix("torch.")] = bool(torch.equal(*outs))
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "autocast=auto": str(resolve_autocast("auto", cpu)).removeprefix("torch."),
        "ns_dtype=auto": str(resolve_ns_dtype("auto", cpu)).removeprefix("torch."),
        "bf16 / fp32 matmul": round(bf16, 2),
        "FP8 emulated / bf16": round(emulated / bf16_head, 2),
        "torch._scaled_mm / FP8 emulated": round(kernel / emulated, 1),
        "bf16 same bits on 1 and 2 threads": same["bfloat16"],
        "fp32 same bits on 1 and 2 threads": same["float32"],
    }


def run_kind(env: dict[str, str], toys: bool) -> dict:
    full = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, __file__, "--probe"], env=full, cwd=REPO, capture_output=True,
        text=True, check=True,
    ).stdout  # fmt: skip
    row = json.loads(out.splitlines()[-1])
    for name, overrides in TOYS.items() if toys else ():
        with_run_dir = [*overrides.split(), f"hydra.run.dir=outputs/cpu_kinds/{len(row)}"]
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "train.py", *with_run_dir], env=full, cwd=REPO, check=True,
            capture_output=True,
        )  # fmt: skip
        row[name] = round(time.perf_counter() - t0, 1)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--toys", action="store_true", help="also time the record toy commands")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe:
        sys.path.insert(0, str(REPO))
        print(json.dumps(probe()))
        return
    rows = {kind: run_kind(env, args.toys) for kind, env in KINDS.items()}
    print("| | " + " | ".join(rows) + " |\n|---" + "|---" * len(rows) + "|")
    for key in next(iter(rows.values())):
        print(f"| {key} | " + " | ".join(str(r[key]) for r in rows.values()) + " |")


if __name__ == "__main__":
    main()
