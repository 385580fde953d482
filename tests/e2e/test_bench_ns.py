"""scripts/bench/ns.py runs (smoke: its table, accuracy columns and recommendation; no timing
is asserted), and its --tp comparison runs on 2 gloo ranks."""

import math

import pytest
import torch

from optim.muon.ns_dtype import bf16_matmul_is_fast
from scripts.bench import ns as bench_ns

COLUMNS = {"ms", "vs_torch", "gflop", "tflops", "peak_pct", "sv_min", "sv_max", "orth", "polar"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_bench_prints_every_variant_with_its_accuracy(capsys: pytest.CaptureFixture) -> None:
    rows = bench_ns.main(["--quick", "--rounds", "1", "--probes", "1"])
    out = capsys.readouterr().out
    # The default precision is the CPU's fast one: bf16 where it is native, fp32 where emulated.
    dt = "bf16" if bf16_matmul_is_fast(torch.device("cpu")) else "fp32"
    assert "recommended" in out and "%peak" in out
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names))
    # every form × coefficient set × step count, and the strategy baselines
    assert {f"factored classic 5 {dt} batched", f"gram polar_express 4 {dt} batched"} <= set(names)
    assert {r["strategy"] for r in rows} >= {"batched", "loop", "torch"}
    for r in rows:
        assert COLUMNS | {"muon"} <= set(r)
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in COLUMNS), r
        assert r["name"] in out
    # the same arithmetic, another strategy: the same accuracy to rounding
    by_name = {r["name"]: r for r in rows}
    batched, loop = (
        by_name[f"factored classic 5 {dt} batched"],
        by_name[f"factored classic 5 {dt} loop"],
    )
    assert loop["polar"] == pytest.approx(batched["polar"], abs=0.01)
    # the classic band measured here is the one the tests of the coefficients hold it to
    assert 0.6 < batched["sv_min"] < 0.75 and 1.1 < batched["sv_max"] < 1.25


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_tp_comparison_runs_on_two_ranks(capsys: pytest.CaptureFixture) -> None:
    rows = bench_ns.main(["--tp", "--quick"])
    assert {(r["case"], r["form"]) for r in rows} >= {("fc", "gram"), ("proj", "factored")}
    for r in rows:
        assert r["tp_ms"] > 0 and r["gather_ms"] > 0 and r["tp_mb"] > 0 and r["gather_mb"] > 0
        assert r["max_diff"] < 0.05  # two roundings of the same bf16 Newton–Schulz
    assert "gather/tp" in capsys.readouterr().out
