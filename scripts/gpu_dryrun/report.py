"""The ledger as a table, and as JSON (every launch): `python -m scripts.gpu_dryrun --ledger`."""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts.gpu_dryrun.estimate import Constants, estimate_ms
from scripts.gpu_dryrun.ledger import PHASES
from scripts.gpu_dryrun.measure import StepLedger

PARTS = ("attention", "mlp", "head", "optimizer")


def ledger_table(steps: list[StepLedger], c: Constants,
                 record_ms: Callable[[int], float | None]) -> str:  # fmt: skip
    """Per counted step: FLOPs by phase and by part, bytes, launches and collective bytes by
    phase, the estimates, and the record's own ms beside them."""
    head = ["step", "kind", "tokens", "TFLOP fwd/bwd/opt", "TFLOP attn/mlp/head/opt",
            "GB fwd/bwd/opt", "launches fwd/bwd/opt", "wire MB", "H100 ms", "H200 ms",
            "record ms"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in steps:
        t = s.ledger.table()

        def by(key: str, scale: float, fmt: str, t: dict = t) -> str:
            return " / ".join(format(t.get(p, {}).get(key, 0.0) / scale, fmt) for p in PHASES)

        parts = " / ".join(
            f"{sum(t.get(p, {}).get(f'flops:{part}', 0.0) for p in PHASES) / 1e12:.2f}"
            for part in PARTS
        )
        wire = sum(t.get(p, {}).get("collective_bytes", 0.0) for p in PHASES) / 1e6
        rec = record_ms(s.step)
        lines.append(
            f"| {s.step} | {s.kind} | {s.tokens:,} | {by('flops', 1e12, '.2f')} | {parts} | "
            f"{by('bytes', 1e9, '.2f')} | {by('launches', 1, '.0f')} | {wire:.1f} | "
            f"{estimate_ms(s.ledger, 'H100', c):.1f} | {estimate_ms(s.ledger, 'H200', c):.1f} | "
            f"{'-' if rec is None else f'{rec:.1f}'} |"
        )
    lines.append(f"\nConstants: {c}")
    return "\n".join(lines)


def compare_table(record: list[StepLedger], ours: list[StepLedger], c: Constants) -> str:
    """Ours against the record's own, counted step by counted step (each stage's normal step,
    then its Adam step, in order): each total as ours / the record's, and their ratio."""
    kinds = ([s.kind for s in record], [s.kind for s in ours])
    if kinds[0] != kinds[1]:
        raise SystemExit(f"gpu_dryrun.report: the two ledgers' steps differ in kind: {kinds}")
    head = ["steps (ours / record)", "kind", "TFLOP", "GB", "launches", "wire MB", "H100 ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(a: float, b: float, fmt: str) -> str:
        return f"{a:{fmt}} / {b:{fmt}} ({a / b:.2f}×)" if b else f"{a:{fmt}} / -"

    for r, o in zip(record, ours, strict=True):
        (tr, to) = (r.ledger, o.ledger)
        wire = [x.total("bytes", source="collective") / 1e6 for x in (to, tr)]
        flops = [x.total("flops") / 1e12 for x in (to, tr)]
        nbytes = [(x.total("bytes") - x.total("bytes", source="collective")) / 1e9
                  for x in (to, tr)]  # fmt: skip
        launches = [x.total("launches") for x in (to, tr)]
        ms = [estimate_ms(x, "H100", c) for x in (to, tr)]
        lines.append(
            f"| {o.step} / {r.step} | {o.kind} | {cell(*flops, '.2f')} | {cell(*nbytes, '.1f')} "
            f"| {cell(*launches, '.0f')} | {cell(*wire, '.0f')} | {cell(*ms, '.1f')} |"
        )
    lines.append(f"\nConstants: {c}")
    return "\n".join(lines)


def write_json(path: Path, meta: dict[str, Any], steps: list[StepLedger]) -> None:
    """All of it or nothing: written beside `path`, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**meta, "steps": [s.to_json() for s in steps]}))
    tmp.replace(path)


def read_json(path: Path) -> tuple[dict, list[StepLedger]]:
    """A file `--ledger --json` wrote: its meta and its counted steps."""
    from scripts.gpu_dryrun.ledger import Ledger

    data = json.loads(path.read_text())
    steps = [
        StepLedger(s["step"], s["kind"], s["tokens"], Ledger.from_json(s["launches"]))
        for s in data.pop("steps")
    ]
    return data, steps


def main() -> int:
    """The table again from a saved ledger, with the constants as they are now (after a
    refit, say): no compile, a second."""
    import argparse

    from scripts.bench.presets import compose, record_step_ms
    from scripts.gpu_dryrun.calibrate import constants

    p = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    p.add_argument("ledger", type=Path, help="a file written by --ledger --json")
    path = p.parse_args().ledger
    if not path.is_file():
        raise SystemExit(f"gpu_dryrun.report: no file {path}; write one with --ledger --json")
    meta, steps = read_json(path)
    if "record_log" in meta:  # the record's own (record_side.py): no preset to compose
        print(f"record log {meta['record_log']}, rank 0 of {meta['world']}:")
        print(ledger_table(steps, constants(), lambda step: None))
        return 0
    conf = compose(
        meta["experiment"], "cuda", "full" if meta["full"] else "gpu_toy", meta.get("set", [])
    )
    size = "full" if meta["full"] else "GPU toy"
    print(f"{meta['experiment']} ({size}), rank 0 of {meta['world']}:")
    name = meta["experiment"]
    print(ledger_table(steps, constants(), lambda step: record_step_ms(name, conf, step)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
