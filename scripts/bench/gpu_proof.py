"""Everything a GPU must show, in one command, each part under a time cap, on one H100.

    python -m scripts.bench.gpu_proof                          # on the GPU: results/gpu_proof/
    python -m scripts.bench.gpu_proof --toy --device cpu       # the plumbing, in seconds
    python -m scripts.bench.gpu_proof --render docs/gpu-proof/2026-11-26-h100.json  # -> docs/

It runs the parts of `scripts/bench/proof_parts.py` one after another, each in a process of its
own under its own time cap (`CAPS`, `--cap part=seconds`) and all of them under `--budget`: a
part that passes its cap is stopped and reported as skipped, so one slow compile cannot eat the
time of the others. The parts: each record preset's compiled step at its first, middle and
last window and batch phase (ms/step beside the record's own per-GPU step, tokens/s, MFU,
compile time, graph breaks, recompiles), the dense 124M model, the FP8 head against the bf16
head, fsdp and offloaded optimizer state against ddp, a 100-step run of the newest preset on
the sample corpus (its loss must fall and stay finite), and the environment.

Out: `gpu_proof.json` (every number), `gpu_proof.md` (the tables) and `gpu_proof.log` (each
part's output) in `--out`. `--render JSON` writes a JSON's tables into docs/gpu-proof.md
(`--doc`) between the `gpu-proof` markers, so the published GPU tables are always one run's
numbers: the published run's JSON is in docs/gpu-proof/, a new run's is
results/gpu_proof/gpu_proof.json. `--check` writes nothing and fails where the page's tables
are not the JSON's.
"""

import argparse
import contextlib
import json
import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# Seconds each part may take on one H100, from the first runs there (docs/gpu-proof.md): record
# #9's compile took 41 s and its part 64 s; #46's first compile passed 110 s and #89's ran 220 s
# before a kernel error, so theirs are guesses with room (three stages, three compiles;
# record_medium_2025_12_31's five measured stages, at twice #89's width).
CAPS = {
    "env": 20, "record_2024_11_06": 80, "record_2025_01_26": 90, "record_2025_11_29": 240,
    "record_2026_07_17": 600, "record_medium_2025_12_31": 540, "optimizer": 150,
    "dense_124m": 60, "head": 40, "strategies": 80, "real_run": 300,
}  # fmt: skip
TOY_CAP = 60
BUDGET_S = sum(CAPS.values())  # ~37 min; `--budget 570` fits a ten-minute slot, parts in order
MIN_PART_S = 10  # a part is not started with less time than this left
BEGIN, END = "<!-- gpu-proof:begin -->", "<!-- gpu-proof:end -->"
DOC = REPO / "docs" / "gpu-proof.md"  # the page whose markers --render writes between
SHIPPED = REPO / "docs" / "gpu-proof"  # the JSONs of the runs that page publishes


def run_part(
    name: str, device: str, toy: bool, data_dir: Path, partial: Path | None = None,
    stages: list[int] | None = None, evaluation: bool = True, sets: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """One part, in this process (the proof's child for it calls this); a preset part writes
    its rows so far to `partial` as it goes, measures only `stages` (1-based; None: all),
    compiles its evaluation unless not `evaluation`, and takes the Hydra overrides `sets`."""
    from scripts.bench import proof_parts as parts

    if name == "env":
        return parts.environment(device)
    if name in parts.PRESETS:
        return parts.preset(name, device, toy, partial, stages, evaluation, sets)
    if name == "head":
        return parts.head(device, toy)
    if name == "optimizer":
        return parts.optimizer(device, toy)
    if name == "strategies":
        return parts.strategies(device, toy, data_dir)
    if name == "real_run":
        return parts.real_run(device, toy, data_dir)
    raise ValueError(f"no part {name!r}; the parts: {', '.join(CAPS)}")


def run_capped(name: str, cap: float, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """Part `name` in a child process, stopped (with everything it started) after `cap` s.

    Children fork from a server that has imported torch and the parts once (multiprocessing's
    forkserver, which never touches CUDA itself), so a part starts in a moment instead of
    paying the imports again; each child leads a session of its own, so that a compile's
    worker processes go with it."""
    result_file, partial = args.out / f".{name}.json", args.out / f".{name}.partial.json"
    result_file.unlink(missing_ok=True)
    partial.unlink(missing_ok=True)
    with open(log, "a") as f:
        f.write(f"\n===== {name} (cap {cap:g}s)\n")
    t0 = time.monotonic()
    child = _context().Process(
        target=_child,
        args=(
            name,
            args.device,
            args.toy,
            args.data_dir,
            result_file,
            partial,
            log,
            args.stages,
            not args.no_eval,
            tuple(args.set),
        ),
    )
    child.start()
    child.join(timeout=cap)
    if child.is_alive():
        with contextlib.suppress(ProcessLookupError):  # not yet its own session: no group
            os.killpg(child.pid, signal.SIGKILL)
        child.kill()
        child.join()
        note = f"its cap of {cap:g}s was reached"
        kept = json.loads(partial.read_text()) if partial.exists() else {}
        partial.unlink(missing_ok=True)
        partial.with_name(partial.name + ".tmp").unlink(missing_ok=True)  # a write cut short
        if kept.get("rows"):  # a preset's rows measured before the cap stand
            note += f" after {len(kept['rows'])} of its rows"
        return {"status": "skipped", "seconds": cap, "note": note, **kept}
    seconds = time.monotonic() - t0
    if child.exitcode != 0 or not result_file.exists():
        note = f"exit {child.exitcode}: gpu_proof.log"
        return {"status": "failed", "seconds": seconds, "note": note}
    out = json.loads(result_file.read_text())
    result_file.unlink()
    ok = out.pop("ok", True)
    note = "" if ok else "its check failed (see its row)"
    return {"status": "ok" if ok else "failed", "seconds": seconds, "note": note, **out}


def stage_list(text: str) -> list[int]:
    """--stages: 1-based stage numbers, comma-separated."""
    try:
        stages = [int(x) for x in text.split(",")]
    except ValueError:
        stages = []
    if not stages or min(stages) < 1:
        raise argparse.ArgumentTypeError(f"stages are numbers from 1, like 1,3; got {text!r}")
    return stages


def _context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["scripts.bench.proof_parts"])
    return ctx


def _child(
    name: str, device: str, toy: bool, data_dir: Path, result: Path, partial: Path, log: Path,
    stages: list[int] | None = None, evaluation: bool = True, sets: tuple[str, ...] = (),
) -> None:  # fmt: skip
    """A part in a child process: its own session, its output into the log, its result as
    JSON into `result` (a preset's rows so far into `partial` as it goes)."""
    os.setsid()
    with open(log, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s")
    result.write_text(
        json.dumps(run_part(name, device, toy, data_dir, partial, stages, evaluation, sets))
    )
    partial.unlink(missing_ok=True)


def prove(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected part under its cap and the budget; the results as one dict."""
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    caps = {name: TOY_CAP if args.toy else cap for name, cap in CAPS.items()}
    caps |= args.cap
    results: dict[str, Any] = {"toy": args.toy, "device": args.device, "parts": {}}
    if args.set:
        results["sets"] = list(args.set)
    log = args.out / "gpu_proof.log"
    log.write_text("")
    for name in args.parts or list(CAPS):
        left = deadline - time.monotonic()
        if left < MIN_PART_S:
            part = {"status": "skipped", "seconds": 0.0, "note": "the budget was spent"}
        else:
            part = run_capped(name, min(caps[name], left), args, log)
        results["parts"][name] = part
        print(f"{name}: {part['status']} in {part['seconds']:.0f}s {part['note']}", flush=True)
    return results


def _cap(text: str) -> tuple[str, float]:
    name, _, seconds = text.partition("=")
    try:
        value = float(seconds)
    except ValueError:
        value = -1.0
    if name not in CAPS or value <= 0:
        raise SystemExit(
            f"--cap takes part=seconds (> 0) with a part of {', '.join(CAPS)}, got {text!r}"
        )
    return name, value


def markdown(results: dict[str, Any]) -> str:
    """The proof's tables."""
    from scripts.bench.proof_tables import tables

    return tables(results)


def render(json_path: Path, page: Path, check: bool = False) -> None:
    """Replace a page's text between the gpu-proof markers by the tables of `json_path`, and
    say so; `check`: write nothing, and exit 1 where the page's tables are not those. Bad input
    (a file that is not there, a JSON that is no proof's) is one line of error."""
    if not json_path.is_file():
        shipped = ", ".join(str(f.relative_to(REPO)) for f in sorted(SHIPPED.glob("*.json")))
        raise SystemExit(
            f"gpu_proof: no file {json_path} to render; a proof run (python -m "
            "scripts.bench.gpu_proof) writes results/gpu_proof/gpu_proof.json"
            + (f", and the published run's JSON is {shipped}" if shipped else "")
        )
    if not page.is_file():
        raise SystemExit(f"gpu_proof: no page {page} to write the tables into (--doc)")
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"gpu_proof: {page} has no {BEGIN} ... {END} section to write into")
    try:
        results = json.loads(json_path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"gpu_proof: {json_path} is not JSON: {e}") from None
    if not isinstance(results, dict) or not isinstance(results.get("parts"), dict):
        raise SystemExit(f"gpu_proof: {json_path} is not a proof's JSON (it has no parts)")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    new = f"{head}{BEGIN}\n{markdown(results)}\n{END}{tail}"
    where = f"{page}, between {BEGIN} and {END}"
    if check:
        if new != text:
            raise SystemExit(f"gpu_proof: {where}: not the tables of {json_path} (render it)")
        print(f"gpu_proof: {where}: the tables of {json_path}")
    elif new == text:
        print(f"gpu_proof: {where}: already the tables of {json_path}, left as it was")
    else:
        page.write_text(new)
        print(f"gpu_proof: wrote the tables of {json_path} into {where}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="*", metavar="PART", help=f"some of: {', '.join(CAPS)}")
    p.add_argument("--device", default="cuda")
    p.add_argument("--toy", action="store_true", help="tiny models: the plumbing, on a CPU")
    p.add_argument("--out", type=Path, default=Path("results/gpu_proof"))
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all parts")
    p.add_argument("--cap", action="append", default=[], metavar="PART=SECONDS")
    p.add_argument("--data-dir", type=Path, default=Path("~/.cache/gpt-speedrun").expanduser(),
                   help="the sample corpus cache (data.cache_dir)")  # fmt: skip
    p.add_argument(
        "--stages",
        type=stage_list,
        metavar="I,J",
        help="a preset part's stages or windows to measure, 1-based (default all)",
    )
    p.add_argument("--no-eval", action="store_true", help="preset parts skip evaluation")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a Hydra override for every preset part (e.g. a kernel key)")  # fmt: skip
    p.add_argument("--render", type=Path, metavar="JSON", help="write JSON's tables to --doc")
    p.add_argument("--doc", type=Path, default=DOC, help="the page with the gpu-proof markers")
    p.add_argument("--check", action="store_true",
                   help="with --render: write nothing, fail if --doc's tables differ")  # fmt: skip
    args = p.parse_args()
    unknown = [n for n in args.parts if n not in CAPS]
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}; the parts: {', '.join(CAPS)}")
    args.cap = dict(_cap(c) for c in args.cap)  # before any work or any file
    return args


def main() -> None:
    args = parse_args()
    if args.check and not args.render:
        raise SystemExit("gpu_proof: --check goes with --render JSON")
    if args.render:
        render(args.render, args.doc, args.check)
        return
    results = prove(args)
    (args.out / "gpu_proof.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "gpu_proof.md").write_text(markdown(results) + "\n")
    print(f"\n{markdown(results)}\n\nwritten to {args.out}/gpu_proof.{{json,md,log}}")


if __name__ == "__main__":
    main()
