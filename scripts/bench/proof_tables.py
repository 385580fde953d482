"""The GPU proof's results (`scripts/bench/gpu_proof.py`'s JSON) as Markdown tables: the same
text goes to `gpu_proof.md` and, through `--render`, into docs/gpu-proof.md."""

from typing import Any

from scripts.bench.preset_rows import eval_cell, kinds_cell

# The preset table's columns. Every part runs on one device: a row's `world` is the run whose
# one GPU's share it measured ("as 1 GPU of"), never the GPUs it ran on. That column and the
# normal and Adam steps' medians beside the period mean come only where some row records them:
# a JSON from before they were measured has neither, and its table claims neither.
HEAD = ("preset", "window (blocks, long/short)")
SHARE = ("as 1 GPU of",)
TOKENS = ("tokens/step/GPU",)
KINDS = ("ms/step (period mean)", "normal / Adam ms")
STEP = ("ms/step",)
TAIL = ("record ms/step/GPU", "tokens/s", "MFU", "compile s (train / eval)", "graphs",
        "graph breaks", "recompiles")  # fmt: skip


def tables(results: dict[str, Any]) -> str:
    parts = results["parts"]
    env = parts.get("env", {}).get("env", {})
    what = (
        "**Toy size on a CPU: this proves the plumbing, not the speed.**\n\n"
        if results.get("toy")
        else ""
    )
    code = env.get("code") or {}
    commit = code.get("commit", "?")[:10] + (" (dirty)" if code.get("dirty") else "")
    sets = sorted(
        {*results.get("sets", []), *(s for p in parts.values() for s in p.get("sets", []))}
    )
    overrides = f" Preset overrides (--set): {', '.join(f'`{s}`' for s in sets)}." if sets else ""
    out = [
        f"{what}{env.get('device', results.get('device'))}, torch {env.get('torch', '?')}, "
        f"CUDA {env.get('cuda') or '-'}, {env.get('date', '?')}, commit {commit}.{overrides}",
        "",
    ]
    out += _presets([r for p in parts.values() if "preset" in _first(p) for r in p["rows"]])
    out += _optimizer(parts.get("optimizer"))
    out += _head(parts.get("head")) + _strategies(parts.get("strategies"))
    out += _real_run(parts.get("real_run")) + _status(parts)
    return "\n".join(out)


def _first(part: dict) -> dict:
    rows = part.get("rows") or [{}]
    return rows[0]


def _presets(rows: list[dict]) -> list[str]:
    """The preset rows' table, with the optional columns that some row records."""
    share = any("world" in r for r in rows)
    kinds = any("normal_ms" in r or "adam_ms" in r for r in rows)
    columns = (*HEAD, *(SHARE if share else ()), *TOKENS, *(KINDS if kinds else STEP), *TAIL)
    out = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    return out + [_preset_row(r, share, kinds) for r in rows]


def _preset_row(r: dict, share: bool, kinds: bool) -> str:
    warm = f"{r['warmup_s']:.1f}" + eval_cell(r.get("eval_warmup_s"))
    cells = [
        r["preset"], r["window"], *([str(r.get("world", "-"))] if share else []),
        f"{r['tokens']:,}", f"{r['step_ms']:.1f}", *([kinds_cell(r)] if kinds else []),
        f"{r['record_ms']:.1f}" if r.get("record_ms") else "-", f"{r['tokens_per_s']:,.0f}",
        f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-", warm, str(r["graphs"]),
        str(r["graph_breaks"]), str(r["recompiles"]),
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _optimizer(part: dict | None) -> list[str]:
    if not part or not part.get("rows"):
        return []
    out = ["", "| optimizer step alone, record #89's shapes | as 1 GPU of (rank 0's share) "
           "| mode | normal ms | Adam ms | period mean ms |",
           "|---|---|---|---|---|---|"]  # fmt: skip
    for r in part["rows"]:
        cells = [f"{r[k]:.2f}" if r.get(k) is not None else "-"
                 for k in ("normal_ms", "adam_ms", "period_ms")]  # fmt: skip
        out.append(f"| | {r['world']} | {r['mode']} | " + " | ".join(cells) + " |")
    return out


def _head(part: dict | None) -> list[str]:
    if not part or not part.get("rows"):
        return []
    r = part["rows"][0]
    return [
        "",
        "| LM head fwd+bwd, compiled | FP8 ms | bf16 ms | FP8 / bf16 |",
        "|---|---|---|---|",
        f"| {r['shape']} | {r['fp8_ms']:.2f} | {r['bf16_ms']:.2f} | {r['ratio']:.2f} |",
    ]


def _strategies(part: dict | None) -> list[str]:
    if not part or not part.get("rows"):
        return []
    out = ["", "| GPT-2 small, random tokens, eager | ms/step | tokens/s | vs ddp |",
           "|---|---|---|---|"]  # fmt: skip
    for r in part["rows"]:
        out.append(
            f"| {r['run']} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {r['vs_ddp']:.2f} |"
        )
    return out


def _real_run(part: dict | None) -> list[str]:
    if not part or not part.get("rows"):
        return []
    r = part["rows"][0]
    (s0, v0), (s1, v1) = r["val_first"], r["val_last"]
    if r["ok"]:
        verdict = (
            f"learns: held-out loss fell {r['val_drop']:.2f} (≥ {r['drop_needed']:g}), "
            f"{r['gap']:.2f} above training (≤ {r['gap_allowed']:g})"
        )
    else:
        verdict = (
            f"**does not show learning**: held-out loss fell {r['val_drop']:.2f} (needs "
            f"≥ {r['drop_needed']:g}), {r['gap']:.2f} above training (allowed "
            f"{r['gap_allowed']:g})" + ("" if r["finite"] else ", not finite")
        )
    wrap = f", first wrap at step {r['first_wrap']}" if r["first_wrap"] else ""
    return [
        "",
        "| newest preset on the sample corpus | steps | passes over the data | train loss "
        "(first → last tenth) | held-out val loss | ms/step | verdict |",
        "|---|---|---|---|---|---|---|",
        f"| {r['experiment']}, 1 sequence/step | {r['steps']} | {r['passes']}{wrap} "
        f"| {r['train_loss_first']:.3f} → {r['train_loss_last']:.3f} "
        f"| {v0:.3f} @{s0} → {v1:.3f} @{s1} | {r['step_ms']:.0f} | {verdict} |",
    ]


def _status(parts: dict) -> list[str]:
    out = ["", "| part | status | s | note |", "|---|---|---|---|"]
    for name, p in parts.items():
        out.append(f"| {name} | {p['status']} | {p['seconds']:.0f} | {p.get('note', '')} |")
    return out
