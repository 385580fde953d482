"""The step ledger (scripts/gpu_dryrun/ledger.py) against counts made by hand, and the
estimate's fit (scripts/gpu_dryrun/estimate.py) against constants it must find.

The counting cases run under the pretend H100 (a process each: the shim is preloaded before
torch is imported) and need Triton and g++; they skip, naming why, without them. The fit's
cases need neither.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scripts.gpu_dryrun import fake_gpu
from scripts.gpu_dryrun.estimate import GPUS, Constants, Row, Terms, fit, leave_one_out
from scripts.gpu_dryrun.ledger import Launch, Ledger

ROOT = Path(__file__).resolve().parents[2]
REASON = fake_gpu.missing()
needs_shim = pytest.mark.skipif(REASON is not None, reason=REASON or "")

PRELUDE = """
import json
import torch
from scripts.gpu_dryrun import fake_gpu
fake_gpu.install()
from scripts.gpu_dryrun.ledger import Parts, Recorder, Wire, enable_estimates, install, load_shim
enable_estimates()
rec = Recorder(Parts(frozenset({50304}), frozenset({512})), load_shim())
remove = install(rec)
def dump(ledger):
    print(json.dumps(ledger.to_json()))
"""


def counted(code: str, tmp_path: Path) -> list[dict]:
    """The launches `code` books (its last line of output), under the pretend H100."""
    env = {
        **os.environ,
        "LD_PRELOAD": str(fake_gpu.build_shim()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
    }
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + code], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_shim
def test_a_product_is_its_flops_and_its_operands_bytes(tmp_path: Path) -> None:
    """One bf16 product (64 × 128) @ (128 × 512), eager: a library launch of 2·M·N·K FLOPs
    that reads both operands and writes its result, booked to the MLP by its 512 columns;
    the ops that make its operands, before recording, are not booked."""
    rows = counted(
        """
a = torch.randn(64, 128).bfloat16().to("cuda")
b = torch.randn(128, 512).bfloat16().to("cuda")
with rec.recording():
    a @ b
dump(rec.take())
""",
        tmp_path,
    )
    assert rows == [
        {"kernel": "mm", "source": "library", "dtype": "BFloat16", "flops": 2.0 * 64 * 512 * 128,
         "bytes": 2.0 * (64 * 128 + 128 * 512 + 64 * 512), "phase": "forward", "part": "mlp",
         "launches": 1}
    ]  # fmt: skip


@needs_shim
def test_a_fused_elementwise_chain_is_one_kernel_that_reads_once_and_writes_once(
    tmp_path: Path,
) -> None:
    """(x · 2 + 1).relu() · 3 compiled: inductor fuses it into one Triton kernel, which
    reads x (n fp32) and writes the result (n fp32): 8n bytes, no FLOPs worth a product,
    one launch; its compile (the first call) is not counted."""
    n = 1 << 20
    rows = counted(
        f"""
f = torch.compile(lambda x: (x * 2 + 1).relu() * 3)
x = torch.randn({n}, device="cuda")
f(x)
with rec.recording():
    f(x)
dump(rec.take())
""",
        tmp_path,
    )
    assert len(rows) == 1, rows
    (r,) = rows
    assert r["source"] == "inductor" and r["launches"] == 1 and r["phase"] == "forward"
    assert r["bytes"] == pytest.approx(8.0 * n, rel=1e-6)
    assert r["flops"] == 0


@needs_shim
def test_the_projects_triton_kernels_declare_their_products_and_their_bytes(
    tmp_path: Path,
) -> None:
    """model/triton_mlp.py's FP8 up projection, (T × d)·(4d × d)ᵀ with T = 256, d = 64:
    2·T·4d·d FP8 FLOPs (its launch_metadata) and its tensors' bytes; model/triton_loss.py's
    loss over 8 rows of 512 bf16 logits, K = 3: its logits read twice, G₈ written, the
    targets and the rows' losses, and no FLOPs."""
    rows = counted(
        """
from model.config.head import HeadConfig
from model.triton_loss import record_loss_rows_triton
from model.triton_mlp import fused_up_relu2
n8 = torch.zeros(256, 64, device="cuda").to(torch.float8_e4m3fn)
w8 = torch.zeros(256, 64, device="cuda").to(torch.float8_e4m3fn)
one = torch.ones((), device="cuda")
z = torch.zeros(8, 512, device="cuda", dtype=torch.bfloat16)
y = torch.zeros(8, 3, device="cuda", dtype=torch.int64)
w = torch.ones(3, device="cuda")
cfg = HeadConfig(softcap=23.0, softcap_form="sigmoid", softcap_shift=5.0, softcap_divisor=7.5)
for counting in (False, True):
    with rec.recording() if counting else rec.muted():
        fused_up_relu2(n8, w8, one, one, one)
        record_loss_rows_triton(z, y, w, cfg, 0.75 / 448)
dump(rec.take())
""",
        tmp_path,
    )
    up, loss = [r for r in rows if r["source"] == "triton"]
    assert up["kernel"] == "_up_relu2_kernel" and up["launches"] == 1
    assert (up["flops"], up["dtype"]) == (2.0 * 256 * 256 * 64, "float8")
    tile_max = 2 * 2 * 4  # fp32, one per 128 × 128 tile
    assert up["bytes"] == 2 * 256 * 64 + 256 * 256 * (2 + 2 + 1) + tile_max + 3 * 4
    assert loss["kernel"] == "_record_loss_kernel" and loss["flops"] == 0
    assert loss["bytes"] == 8 * (512 * (2 + 2 + 1) + 3 * 8 + 4)


@needs_shim
def test_attention_is_the_flash_kernel_a_gpu_runs_not_the_math_path(tmp_path: Path) -> None:
    """Causal SDPA in bf16, compiled: one flash forward of 4·B·H·T²·D / 2 FLOPs (the kernel
    skips the masked half) reading q, k, v and writing the output and its log-sum-exp, and one
    flash backward of 2.5 times that; no T × T scores in memory (the math path, which a GPU
    does not take here, would write them)."""
    rows = counted(
        """
import torch.nn.functional as F
q, k, v = (torch.randn(2, 4, 256, 64).bfloat16().to("cuda").requires_grad_() for _ in range(3))
f = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum())
f(q, k, v).backward()
with rec.recording():
    f(q, k, v).backward()
dump(rec.take())
""",
        tmp_path,
    )
    flops = 4.0 * 2 * 4 * 256 * 256 * 64 / 2
    qkv = 3 * 2 * (2 * 4 * 256 * 64)  # bf16
    attention = [(r["kernel"], r["phase"], r["flops"], r["bytes"]) for r in rows if r["flops"]]
    assert attention == [
        ("_scaled_dot_product_flash_attention", "forward", flops, qkv * 4 / 3 + 4 * 2 * 4 * 256),
        ("_scaled_dot_product_flash_attention_backward", "backward", 2.5 * flops, qkv * 8 / 3),
    ]
    assert all(r["part"] == "attention" for r in rows if r["flops"])
    math_path = [r["kernel"] for r in rows if r["kernel"] == "bmm" or "softmax" in r["kernel"]]
    assert not math_path, f"the math path ran: {math_path}"


@needs_shim
def test_the_backward_and_the_optimizer_are_booked_as_such(tmp_path: Path) -> None:
    """A linear layer's forward, backward and an SGD step, eager: the products go to forward
    (x·Wᵀ) and backward (the two gradient products), the update to the optimizer."""
    rows = counted(
        """
w = torch.randn(512, 128, device="cuda", requires_grad=True)
x = torch.randn(64, 128, device="cuda")
opt = torch.optim.SGD([w], lr=0.1, foreach=False)
with rec.recording():
    (x @ w.T).sum().backward()
    with rec.phase("optimizer"):
        opt.step()
dump(rec.take())
""",
        tmp_path,
    )
    products = [(r["phase"], r["flops"]) for r in rows if r["flops"]]
    mnk = 2.0 * 64 * 512 * 128
    assert sorted(products) == [("backward", mnk), ("forward", mnk)], products
    # dx is not asked for: one backward product (dW), and every other row elementwise
    assert {r["phase"] for r in rows} == {"forward", "backward", "optimizer"}
    assert all(r["part"] == "optimizer" for r in rows if r["phase"] == "optimizer")


@needs_shim
def test_a_collective_books_a_rings_bytes_and_not_its_stand_in(tmp_path: Path) -> None:
    """At world 4 a reduce-scatter of 1,024 fp32 values moves 3/4 of 4 KiB per rank, an
    all-gather of the same 3/4 of its output, an all-reduce twice that; LocalView's copies
    in their place are not launches."""
    rows = counted(
        """
from optim.ddp_rows import LocalView
wire = Wire(LocalView(4), rec)
inp = torch.randn(1024, device="cuda")
out = torch.empty(256, device="cuda")
with rec.recording():
    wire.reduce_scatter(out, inp)
    wire.all_gather(inp, out)
    wire.all_reduce(inp)
dump(rec.take())
""",
        tmp_path,
    )
    assert [(r["kernel"], r["source"], r["bytes"], r["launches"]) for r in rows] == [
        ("reduce_scatter", "collective", 3072.0, 0),
        ("all_gather", "collective", 3072.0, 0),
        ("all_reduce", "collective", 6144.0, 0),
    ]


# -- the fit


def _rows(c: Constants, n: int = 8, seed: int = 0) -> list[Row]:
    """Steps whose ms are exactly the estimate under `c`: mixes of compute-bound,
    memory-bound and launch-bound launches, as the calibration rows are."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        k = int(rng.integers(200, 3000))
        flop_s = rng.exponential(2e-6, k) * (rng.random(k) < 0.2)
        byte_s = rng.exponential(3e-6, k)
        terms = Terms(flop_s, byte_s, k + int(rng.integers(0, 500)), float(rng.random() * 1e-3))
        rows.append(Row(f"row {i}", terms, terms.seconds(c) * 1e3))
    return rows


def test_terms_cost_each_launch_at_its_bound() -> None:
    """A ledger by hand: a bf16 product bound by FLOPs, an elementwise kernel bound by bytes,
    a collective at NVLink rate, each launch its fixed cost."""
    h100 = GPUS["H100"]
    ledger = Ledger([
        Launch("mm", "library", "BFloat16", 989.4e12 * 1e-3, 1e6, "forward"),  # 1 ms at peak
        Launch("add", "inductor", "", 0.0, 3.35e12 * 2e-3, "forward"),  # 2 ms at full bandwidth
        Launch("all_gather", "collective", "", 0.0, 450e9 * 1e-3, "optimizer", launches=0),
    ])  # fmt: skip
    t = Terms.of(ledger, h100)
    c = Constants(0.5, 0.8, 10.0)
    # 1 ms / 0.5 + 2 ms / 0.8 + 2 launches × 10 µs + 1 ms on the wire
    assert t.seconds(c) * 1e3 == pytest.approx(2.0 + 2.5 + 0.02 + 1.0)
    assert t.launches == 2


def test_the_fit_finds_the_constants_that_made_the_rows() -> None:
    """Rows made by known constants: the fit recovers them (to its grid) and every
    leave-one-out estimate lands within 2 % of its row."""
    truth = Constants(0.55, 0.70, 6.0)
    rows = _rows(truth)
    got = fit(rows)
    assert got.flop_share == pytest.approx(truth.flop_share, abs=0.011)
    assert got.bandwidth_share == pytest.approx(truth.bandwidth_share, abs=0.011)
    assert got.launch_us == pytest.approx(truth.launch_us, abs=0.3)
    for row, est in leave_one_out(rows):
        assert abs(math.log(est / row.measured_ms)) < 0.02, (row.name, est, row.measured_ms)


def test_a_row_no_constants_explain_shows_in_its_leave_one_out_error() -> None:
    """One row measured at twice what the others' constants give: its leave-one-out
    estimate misses it by about half, which the report must show, not hide."""
    truth = Constants(0.55, 0.70, 6.0)
    rows = _rows(truth)
    odd = Row("odd", rows[3].terms, rows[3].measured_ms * 2)
    rows[3] = odd
    est = next(e for r, e in leave_one_out(rows) if r.name == "odd")
    assert est / odd.measured_ms < 0.75


def test_flex_attention_is_credited_with_the_pairs_its_mask_lets_through() -> None:
    """inductor states a flex kernel's FLOPs over every (query, key) pair; the ledger gives
    the forward kernels the model's count of masked attention and the backward ones 2.5 times
    it, shared by launch, and leaves every other launch as it was (the fused elementwise
    kernels named after the same ops included)."""
    from scripts.gpu_dryrun.measure import with_attention

    dense = 4.0 * 8192**2 * 768  # causal or not, what inductor states for one layer
    ledger = Ledger([
        Launch("triton_tem_fused_flex_attention_0", "inductor", "", dense, 1e6, "forward",
               launches=2),
        Launch("triton_tem_fused_flex_attention_backward_1", "inductor", "", 2.5 * dense, 2e6,
               "forward", launches=2),  # the backward in the forward graph (docs/ledger.md)
        Launch("triton_poi_fused_flex_attention_backward_2", "inductor", "", 0.0, 5e5,
               "backward"),
        Launch("mm", "library", "BFloat16", 1e9, 1e6, "forward", "mlp"),
    ])  # fmt: skip
    got = with_attention(ledger, forward=3e11)
    assert [x.flops for x in got.launches] == [3e11, 7.5e11, 0.0, 1e9]
    assert [x.bytes for x in got.launches] == [x.bytes for x in ledger.launches]
    assert got.launches[0].part == got.launches[1].part == "attention"


def test_a_saved_ledger_is_tabled_again_and_a_missing_one_named(tmp_path: Path) -> None:
    """`python -m scripts.gpu_dryrun.report FILE` prints the table of a file `--ledger --json`
    wrote (here one written by hand: a product and an Adam step's exchange), and names the
    file it cannot find."""
    from scripts.gpu_dryrun.measure import StepLedger
    from scripts.gpu_dryrun.report import write_json

    ledger = Ledger([
        Launch("mm", "library", "BFloat16", 989.4e12 * 1e-3, 1e6, "forward", "mlp"),
        Launch("all_gather", "collective", "", 0.0, 450e6, "optimizer", "optimizer", 0),
    ])  # fmt: skip
    path = tmp_path / "l.json"
    meta = {"experiment": "record_2026_07_17", "full": True, "world": 8, "set": []}
    write_json(path, meta, [StepLedger(0, "adam", 16384, ledger)])
    run = [sys.executable, "-m", "scripts.gpu_dryrun.report"]
    done = subprocess.run([*run, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| 0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["adam", "16,384", "0.99 / 0.00 / 0.00"]
    assert cells[7] == "450.0" and cells[10] == "31.5"  # wire MB; the record's stage 1 ms
    missing = subprocess.run([*run, str(tmp_path / "none.json")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert missing.returncode != 0 and "no file" in missing.stderr and "none.json" in missing.stderr


def test_an_older_optimizer_steps_adam_every_kth_call() -> None:
    """An optimizer from before `period` and `full_next` (a calibration row's commit): with
    optim.adamw.update_every = 2 its first call is a normal step and its second an Adam
    step, and a period is two calls; one that says so itself is asked."""
    from types import SimpleNamespace

    from scripts.gpu_dryrun.measure import Kinds

    conf = SimpleNamespace(optim=SimpleNamespace(adamw=SimpleNamespace(update_every=2)))
    kinds, seen = Kinds(object(), conf), []
    for _ in range(4):
        seen.append(kinds.next())
        kinds.stepped()
    assert kinds.period() == 2 and seen == ["normal", "adam", "normal", "adam"]
    new = SimpleNamespace(period=lambda: 3, full_next=lambda: True)
    assert Kinds(new, conf).period() == 3 and Kinds(new, conf).next() == "adam"
