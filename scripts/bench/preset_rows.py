"""The rows `scripts/bench/gpu.py` prints for a preset (and the GPU proof renders): its
columns and the cells of a row."""

COLUMNS = (
    "| preset | window (blocks, long/short) | tokens/step/GPU | warm-up s (train / eval) "
    "| ms/step | normal / Adam ms | tokens/s | MFU | graphs | graph breaks | recompiles "
    "| record ms/step |"
)


def eval_cell(seconds: float | str | None) -> str:
    """ " / s" of the evaluation's warm-up, " / why not", or nothing (not this row's)."""
    if seconds is None:
        return ""
    return f" / {seconds:.1f}" if isinstance(seconds, float) else f" / {seconds}"


def kinds_cell(r: dict) -> str:
    """The medians of a row's normal and Adam steps ("-" for a kind it has none of)."""
    return " / ".join(f"{r[k]:.1f}" if r.get(k) is not None else "-"
                      for k in ("normal_ms", "adam_ms"))  # fmt: skip


def format_row(r: dict) -> str:
    warm = f"{r['warmup_s']:.1f}" + eval_cell(r["eval_warmup_s"])
    cells = [
        r["preset"], r["window"], f"{r['tokens']:,}", warm, f"{r['step_ms']:.1f}", kinds_cell(r),
        f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}" if r["mfu"] is not None else "-",
        str(r["graphs"]), str(r["graph_breaks"]), str(r["recompiles"]),
        f"{r['record_ms']:.2f}" if r["record_ms"] else "-",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"
