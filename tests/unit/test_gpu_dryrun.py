"""The GPU dry run (scripts/gpu_dryrun): a CPU-only torch that pretends to be an H100 compiles
what a GPU compiles, and fails where the H100 failed.

The reference is the H100 itself: record #89's first two GPU calls failed on two compile errors
(docs/gpu-proof.md), one in FlexAttention's kernel (a float64 score_mod factor) and one in the
record's loss (an e5m2 buffer written by chunks, with the device's Triton, 3.6). Here the code
that failed there fails with the same error, and the code that replaced it compiles.

These need Triton 3.6 (`make dryrun`, or `pip install "triton==3.6.0"`: the H100's, whose
errors they reproduce; ~190 MB) and g++, and skip without them: CI installs a newer Triton, for
the kernels' interpreter tests, under which the loss's old code compiles. Each case runs in its
own process, since the shim must be preloaded before torch is imported.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.gpu_dryrun import fake_gpu

ROOT = Path(__file__).resolve().parents[2]


def _reason() -> str | None:
    """Why these skip: no Triton or g++, a CUDA build of torch (the shim replaces a CPU-only
    torch's missing CUDA), or a Triton other than the H100's 3.6."""
    from importlib.metadata import PackageNotFoundError, version

    if (why := fake_gpu.missing()) is not None:
        return why
    try:
        found = version("triton")
    except PackageNotFoundError:  # a Triton importable but not installed as a package
        return None
    if not found.startswith("3.6."):
        return f"these reproduce the H100's Triton 3.6 errors; Triton {found} is installed"
    return None


REASON = _reason()
needs_triton = pytest.mark.skipif(REASON is not None, reason=REASON or "")
PRELUDE = "from scripts.gpu_dryrun import fake_gpu\nfake_gpu.install()\nimport torch\n"

FLEX = """
from model.attend import attend
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

def old_attend(q, k, v, mask, scale):  # before the fix: YaRN's float64 scale as it is
    return flex_attention(q, k, v, block_mask=mask, scale=1.0,
                          score_mod=lambda score, b, h, i, j: score * scale)

fn = old_attend if OLD else attend
mask = create_block_mask(lambda b, h, i, j: i >= j, 1, 1, 256, 256, device="cuda")
q, k, v = (torch.randn(1, 2, 256, 16).bfloat16().to("cuda").requires_grad_() for _ in range(3))
scale = torch.tensor(0.25, dtype=torch.float64, device="cuda")
torch.compile(fn, dynamic=False)(q, k, v, mask, scale).sum().backward()
print("compiled", fake_gpu.COMPILES[0], "kernels")
"""

LOSS = """
from model.config import HeadConfig
from model.head import fp8_product
from model.record_loss import RecordHeadLoss, record_head_loss, record_loss_rows
from tests.unit.test_record_2026_07_17_head import RECORD_2026_07_17
from trainer.launch.compile import compile_model

def old_forward(ctx, x, w, shifted, weights, cfg, scales, micro_steps, chunk):
    # before the fix: each chunk's e5m2 gradient written into an empty e5m2 buffer
    logits, x8, w8 = fp8_product(x, w, scales)
    g8 = torch.empty(logits.shape, dtype=torch.float8_e5m2, device=logits.device)
    total = torch.zeros((), dtype=torch.float32, device=logits.device)
    for i in range(0, logits.size(0), chunk):
        rows = slice(i, i + chunk)
        loss, g8[rows] = record_loss_rows(logits[rows], shifted[rows], weights, cfg, scales.g)
        total += loss
    ctx.save_for_backward(x8, w8, g8)
    ctx.scales, ctx.micro_steps, ctx.w_dtype = scales, micro_steps, w.dtype
    return total

if OLD:
    RecordHeadLoss.forward = staticmethod(old_forward)
cfg = HeadConfig(**{**RECORD_2026_07_17.__dict__, "loss": "sigmoid_e5m2_grad", "mtp": True})
head = torch.nn.Linear(64, 256, bias=False).to(torch.bfloat16).to("cuda")
x = torch.randn(2, 96, 64).to(torch.bfloat16).to("cuda").requires_grad_()
y = torch.randint(0, 256, (2, 96)).to("cuda")

class Loss(torch.nn.Module):
    def forward(self, xs):
        return record_head_loss(head, xs, y, torch.tensor([1.0, 0.5]), cfg, "fixed_over_448", 1, 64)

compile_model(Loss())(x).backward()
print("compiled", fake_gpu.COMPILES[0], "kernels")
"""


def dry(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`code` run under the pretend H100, with caches of its own (nothing compiled before)."""
    env = {
        **os.environ,
        "LD_PRELOAD": str(fake_gpu.build_shim()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
    }
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + code], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=400,
    )  # fmt: skip


@needs_triton
def test_a_cuda_tensor_is_host_memory_that_computes_moves_and_aliases(tmp_path: Path) -> None:
    """Tensors on the pretend device hold values: ops give the CPU's results, views share
    memory, resizing keeps the data; a product allocates its result without computing it."""
    done = dry(
        """
a = torch.arange(12.0).view(3, 4)
x = a.to("cuda")
assert x.device.type == "cuda" and x.is_cuda
assert torch.equal((x * 2 + 1).exp().cpu(), (a * 2 + 1).exp())
v = x.view(4, 3)
v[0, 0] = 100.0  # a view writes through to its base
assert x[0, 0].item() == 100.0
t = torch.tensor([1.5, 2.5], device="cuda")
t.resize_(5)
assert t[:2].tolist() == [1.5, 2.5] and t.shape == (5,)
assert (x @ x.T).shape == (3, 3) and torch.cuda.get_device_capability() == (9, 0)
print("ok")
""",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


@needs_triton
@pytest.mark.parametrize("old", [True, False], ids=["before-the-fix", "the-fix"])
def test_the_h100s_flex_error_is_raised_and_the_fix_compiles(tmp_path: Path, old: bool) -> None:
    """FlexAttention with YaRN's float64 scale in its score_mod: Triton refuses the promoted
    kernel (the H100's first error); the project's `attend`, which passes it as fp32,
    compiles forward and backward."""
    done = dry(f"OLD = {old}\n" + FLEX, tmp_path)
    if old:
        assert done.returncode != 0
        assert "CompilationError" in done.stderr, done.stderr[-3000:]
    else:
        assert done.returncode == 0, done.stderr[-3000:]
        assert "compiled" in done.stdout


@needs_triton
@pytest.mark.parametrize("old", [True, False], ids=["before-the-fix", "the-fix"])
def test_the_h100s_e5m2_error_is_raised_and_the_fix_compiles(tmp_path: Path, old: bool) -> None:
    """record_2026_07_17's loss writing its e5m2 gradient into an empty buffer: with the H100's
    Triton (3.6) the kernel needs an e5m2 constant that Triton cannot build (the H100's second
    error, word for word), while Triton 3.9 builds it (so the dry run must use the GPU's Triton);
    concatenated chunks, the project's code, compile with either."""
    import triton

    done = dry(f"OLD = {old}\n" + LOSS, tmp_path)
    if not old:
        assert done.returncode == 0, done.stderr[-3000:]
        assert "compiled" in done.stdout
    elif triton.__version__.startswith("3.6"):
        assert done.returncode != 0
        assert "has no attribute 'get_fp8e5'" in done.stderr, done.stderr[-3000:]
    elif triton.__version__.startswith("3.9"):  # why the dry run must use the GPU's Triton
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        pytest.skip(f"Triton {triton.__version__}: not known whether it builds the constant")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--experiment", "record_2024_11_04"], "no preset 'record_2024_11_04' (have: "),
        (["--stages", "0"], "--stages takes a count of 1 or more, or 'all'; got '0'"),
        (["--json", "ledger.json"], "--json writes the ledger's launches; add --ledger"),
    ],
)
def test_bad_input_is_refused_by_name(argv: list[str], says: str) -> None:
    """Bad input is named before any work (no Triton or g++ needed to say so)."""
    done = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_dryrun", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert says in done.stderr


def test_where_it_cannot_run_it_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests above skip, naming the reason, under a CUDA build of torch on a machine
    without a GPU (where the shim cannot stand in), and without Triton or g++."""
    import importlib.util
    import shutil

    import torch

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert fake_gpu.missing() == (
        "the GPU dry run needs a CPU-only torch; this one is a CUDA 13.0 build"
    )
    monkeypatch.setattr(torch.version, "cuda", None)
    assert fake_gpu.missing() is None
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "needs Triton" in fake_gpu.missing()
