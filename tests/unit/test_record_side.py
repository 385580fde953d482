"""The record-side ledger's stand-ins (scripts/gpu_dryrun/record_standins.py), each against a count
made another way: the log split back into the files that made it, the symmetric products'
FLOPs against an element-by-element count of the blocks they compute, the attention pairs
against a dense mask, the collectives' bytes against the ring's rule."""

import types

import numpy as np
import pytest
import torch
import torch.distributed as dist

from scripts.gpu_dryrun import record_side as rs
from scripts.gpu_dryrun import record_standins as st

TRAIN = "import os\nx = 1\n\n" + "#" * 40 + "\n" + rs.WARMUP + "\n" + "#" * 40 + "\nwarm()\n"
KERNELS = "import triton\n\n@triton.jit\ndef k(): pass\n"


def test_a_log_splits_into_the_script_before_its_warm_up_and_its_kernels() -> None:
    log = TRAIN + rs.KERNELS_SEPARATOR + KERNELS + "\n" + "=" * 100 + "\nstep:0/1390\n"
    train, kernels = rs.split_log(log)
    assert train == "import os\nx = 1\n\n" + "#" * 40 + "\n"
    assert kernels == KERNELS
    older = TRAIN + "\n" + "=" * 100 + "\nstep:0/2160\n"  # late 2025: one file, kernels inline
    assert rs.split_log(older) == (train, None)
    with pytest.raises(SystemExit, match="Warmup kernels"):
        rs.split_log("x = 1\n" + rs.KERNELS_SEPARATOR + KERNELS)


def _computed_blocks(rows: int, block: tuple[int, int]) -> int:
    """Output tiles holding at least one entry on or below the diagonal, from the mask."""
    upper = np.tril(np.ones((rows, rows), dtype=bool))
    bm, bn = block
    return sum(
        bool(upper[i : i + bm, j : j + bn].any())
        for i in range(0, rows, bm)
        for j in range(0, rows, bn)
    )


@pytest.mark.parametrize("rows,block", [(256, (128, 128)), (768, (128, 128)), (320, (64, 128))])
def test_symmetric_products_count_the_tiles_on_and_below_the_diagonal(rows, block) -> None:
    inner, batch = 96, 3
    want = 2.0 * batch * _computed_blocks(rows, block) * block[0] * block[1] * inner
    assert st.symmetric_flops(rows, inner, batch, block) == want
    full = 2.0 * batch * rows * rows * inner
    assert want < full  # the upper tiles are skipped, as the kernels skip them


def test_the_record_kernels_costs_read_descriptors_as_their_tensors() -> None:
    a = torch.zeros(64, 32, dtype=torch.float8_e4m3fn)
    b = torch.zeros(48, 32, dtype=torch.float8_e4m3fn)
    c = torch.zeros(64, 48, dtype=torch.bfloat16)
    desc = [types.SimpleNamespace(base=t) for t in (a, b, c)]
    costs = st.kernel_costs("linear_relu_square_kernel", (*desc, 64, 48, 32))
    assert costs == {"flops8": 2.0 * 64 * 48 * 32, "bytes": 64 * 32 + 48 * 32 + 64 * 48 * 2.0}
    x = torch.zeros(2, 256, 768, dtype=torch.bfloat16)
    out = torch.zeros(2, 256, 256, dtype=torch.bfloat16)
    costs = st.kernel_costs("XXT_kernel", (x, out, 256, 768))
    assert costs["flops"] == st.symmetric_flops(256, 768, 2, (128, 128))
    tall = torch.zeros(1024, 768, dtype=torch.bfloat16)  # Aᵀ·A: 768 × 768 over 1,024 rows
    costs = st.kernel_costs("XTX_kernel", (tall, torch.zeros(768, 768), 1024, 768))
    assert costs["flops"] == st.symmetric_flops(768, 1024, 1, (128, 128))
    assert st.kernel_costs("_transpose_copy_kernel", (c, c.t())) == {"bytes": 2 * c.nbytes * 1.0}
    assert st.kernel_costs("no_tensors", (1, 2)) is None


def _dense_pairs(lengths: list[int], window: int) -> int:
    """(query, key) pairs from a dense mask: same document, key not after query, within the
    window (-1: no window)."""
    doc = np.repeat(np.arange(len(lengths)), lengths)
    pos = np.arange(doc.size)
    q, k = pos[:, None], pos[None, :]
    mask = (doc[:, None] == doc[None, :]) & (k <= q)
    if window >= 0:
        mask &= q - k <= window
    return int(mask.sum())


@pytest.mark.parametrize("window", [-1, 0, 3, 40])
def test_attention_pairs_match_a_dense_mask(window) -> None:
    lengths = [5, 17, 1, 40]
    docs = st.Documents()
    docs.cum = [0, *np.cumsum(lengths).tolist()]
    assert docs.pairs(sum(lengths), window) == _dense_pairs(lengths, window)
    # a paired layer interleaves two copies of the stream: every document twice as long
    assert docs.pairs(2 * sum(lengths), window) == _dense_pairs([2 * n for n in lengths], window)


def test_the_attention_stand_in_books_its_pairs_forward_and_backward() -> None:
    booked: list[tuple[str, float, float]] = []
    docs = st.Documents()
    docs.cum = [0, 6, 16]
    attend = st.flash_attention(lambda *row: booked.append(row), docs)
    q, k, v = (torch.randn(16, 2, 8, requires_grad=True) for _ in range(3))
    attend(q, k, v, window_size=(4, 0)).sum().backward()
    pairs = _dense_pairs([6, 10], 4)
    (fwd, flops_f, bytes_f), (bwd, flops_b, _) = booked
    assert (fwd, bwd) == ("flash_attn_varlen_fwd", "flash_attn_varlen_bwd")
    assert flops_f == 4.0 * 2 * 8 * pairs and flops_b == 2.5 * flops_f
    assert bytes_f == 4 * q.nbytes + 16 * 2 * 4  # q, k, v read, out written, fp32 lse
    assert q.grad is not None and q.grad.shape == q.shape


NAMES = ("init_process_group", "barrier", "destroy_process_group", "is_initialized",
         "get_world_size", "get_rank", "broadcast", "reduce", "all_reduce",
         "reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single")  # fmt: skip


def test_collectives_book_the_rings_bytes_per_rank(monkeypatch) -> None:
    for name in NAMES:  # restored after the test
        monkeypatch.setattr(dist, name, getattr(dist, name))
    booked: list[tuple[str, float]] = []
    st.Collectives(8, lambda kind, n: booked.append((kind, n))).install()
    assert dist.get_world_size() == 8 and dist.get_rank() == 0
    t = torch.zeros(1024, dtype=torch.bfloat16)
    dist.all_reduce(t, async_op=True).wait()
    dist.reduce_scatter_tensor(torch.zeros(128, dtype=torch.bfloat16), t)
    dist.all_gather_into_tensor(t, torch.zeros(128, dtype=torch.bfloat16))
    counts, got = torch.tensor([0, 3, 1, 2]), torch.empty(4, dtype=torch.long)
    dist.all_to_all_single(got, counts, async_op=True).get_future().wait()
    assert booked == [
        ("all_reduce", 2 * 2048 * 7 / 8),
        ("reduce_scatter", 2048 * 7 / 8),
        ("all_gather", 2048 * 7 / 8),
        ("all_to_all", 32.0),
    ]
    assert got.tolist() == [0, 3, 1, 2]  # every rank sends what rank 0 sends


def test_the_comparison_sets_each_total_beside_the_records() -> None:
    from scripts.gpu_dryrun.estimate import Constants
    from scripts.gpu_dryrun.ledger import Launch, Ledger
    from scripts.gpu_dryrun.measure import StepLedger
    from scripts.gpu_dryrun.report import compare_table

    def step(n: int, kind: str, scale: float) -> StepLedger:
        rows = [
            Launch("mm", "library", "bfloat16", 1e12 * scale, 2e9 * scale, "forward"),
            Launch("rs", "collective", "", 0.0, 3e6 * scale, "optimizer", launches=0),
        ]
        return StepLedger(n, kind, 16, Ledger(rows))

    c = Constants(1.0, 1.0, 0.0)
    table = compare_table([step(2, "normal", 1.0)], [step(0, "normal", 1.5)], c)
    row = table.splitlines()[2]
    assert "| 0 / 2 | normal | 1.50 / 1.00 (1.50×) | 3.0 / 2.0 (1.50×) | 1 / 1 (1.00×) |" in row
    assert "| 4 / 3 (1.50×) |" in row  # wire MB, collectives apart from the kernels' bytes
    with pytest.raises(SystemExit, match="differ in kind"):
        compare_table([step(2, "normal", 1.0)], [step(0, "adam", 1.0)], c)
