"""MFU: the FLOP count of a batch (model/flops.py), the GPU peak, the loop's MFU and the step
line's ETA / MFU / memory fields."""

import numpy as np
import pytest
import torch

from model import GPT, ModelConfig
from model.config import update
from model.flops import attended_pairs, matmul_params, training_flops
from model.masks import EOT, dense_mask, document_ids
from model.window_schedule import window_at
from tests.helpers import compose_config
from trainer.config import Config, to_config
from trainer.observe.console import format_step
from trainer.observe.flops import PEAK_BF16, mfu, peak_flops

H100 = PEAK_BF16["H100"]


def meta_gpt(cfg: ModelConfig) -> GPT:
    with torch.device("meta"):  # shapes only: counting needs no weights
        return GPT(cfg)


def preset(name: str) -> Config:
    return to_config(compose_config([f"experiment={name}", "run_dir=."]))


def test_dense_causal_count_worked_by_hand() -> None:
    """2 layers of width 8, two rows of 4 tokens: each row's queries see 1 + 2 + 3 + 4 keys."""
    cfg = ModelConfig(n_layer=2, n_head=1, n_embd=8)
    n = matmul_params(meta_gpt(cfg))
    assert n == 2 * (4 + 8) * 8 * 8 + 50304 * 8  # per layer q, k, v, o (4d²), fc, proj (8d²)
    idx = torch.zeros(2, 4, dtype=torch.long)
    pairs = 2 * 2 * 10  # layers x rows x (1 + 2 + 3 + 4)
    assert meta_gpt(cfg).count_flops(idx).item() == 6 * n * 8 + 12 * 8 * pairs


def test_windows_and_documents_worked_by_hand() -> None:
    """Blocks of 2, a window of 4 tokens = 2 blocks (long layer) and 1 block (short layer).

    Row 0 has an EOT at position 3; the first key each query sees is the later of its document's
    start and its window's start:
      long:  doc starts 0 0 0 3 3 3 3 3, window starts 0 0 0 0 2 2 4 4 -> keys 1 2 3 1 2 3 3 4 = 19
      short: window starts 0 0 2 2 4 4 6 6                          -> keys 1 2 1 1 1 2 1 2 = 11
    Row 1 has no EOT: long 1 2 3 4 3 4 3 4 = 24, short 1 2 1 2 1 2 1 2 = 12.
    """
    idx = torch.zeros(2, 8, dtype=torch.long)
    idx[0, 3] = EOT
    long, short = torch.tensor(2), torch.tensor(1)
    assert attended_pairs(idx, True, long, 2).item() == 19 + 24
    assert attended_pairs(idx, True, short, 2).item() == 11 + 12
    cfg = update(
        ModelConfig(n_layer=2, n_head=1, n_embd=8),
        {
            "attention.window": "LS",
            "attention.window_block": 2,
            "attention.window_tokens": 4,
            "attention.document_mask": True,
        },
    )
    n = matmul_params(meta_gpt(cfg))
    want = 6 * n * 16 + 12 * 8 * (43 + 23)
    assert training_flops(idx, cfg, n, torch.tensor(4.0, dtype=torch.float64)).item() == want
    assert training_flops(idx, cfg, n, 3.5).item() == want  # rounded up to whole blocks as well


@pytest.mark.parametrize("blocks", [None, 1, 3, 20])
@pytest.mark.parametrize("document", [False, True])
def test_pairs_are_the_mask_s_allowed_entries(blocks: int | None, document: bool) -> None:
    """The O(T) count equals the number of True entries of the attention mask itself."""
    gen = torch.Generator().manual_seed(blocks or 0)
    idx = torch.randint(0, 50304, (3, 64), generator=gen)
    idx[torch.rand(3, 64, generator=gen) < 0.08] = EOT
    n = torch.tensor(blocks) if blocks is not None else None
    docs = document_ids(idx) if document else None
    mask = dense_mask(docs, 64, n, 8, idx.device).expand(3, 1, 64, 64)
    assert attended_pairs(idx, document, n, 8).item() == mask.sum().item()


def test_mlp_only_layers_add_no_flops() -> None:
    d, idx = 128, torch.zeros(1, 16, dtype=torch.long)
    full, fewer = ModelConfig(), update(ModelConfig(), {"attention.layers": "A.A."})
    causal = 16 * 17 // 2
    assert training_flops(idx, full, 0).item() == 12 * d * 4 * causal
    assert training_flops(idx, fewer, 0).item() == 12 * d * 2 * causal
    assert matmul_params(meta_gpt(full)) - matmul_params(meta_gpt(fewer)) == 2 * 4 * d * d


def test_record_2025_01_26_mfu_is_plausible_at_its_step_time() -> None:
    """One rank's packed 49,152-token sequence, documents ~1000 tokens long, at the record's
    100 ms per step on an H100, at the first, middle and last windows of its schedule."""
    conf = preset("record_2025_01_26")
    count = meta_gpt(conf.model).count_flops
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, EOT, conf.train.seq_len)
    tokens[rng.random(tokens.size) < 1e-3] = EOT
    idx = torch.from_numpy(tokens)[None]
    steps, final = conf.train.steps, conf.model.attention.window_tokens
    for step in (0, steps // 2, steps - 1):
        flops = count(idx, window_at(step, steps, final)).item()
        assert 0.10 < mfu(flops, 0.100, H100) < 0.60, (step, flops)


def test_record_2024_11_06_mfu_is_plausible_at_its_step_time() -> None:
    """One rank's 64 x 1024 tokens at the record's logged 154.78 ms per step on an H100."""
    conf = preset("record_2024_11_06")
    idx = torch.zeros(64, conf.train.seq_len, dtype=torch.long)
    flops = meta_gpt(conf.model).count_flops(idx).item()
    assert 0.10 < mfu(flops, 0.15478, H100) < 0.60


def test_no_peak_on_a_cpu_and_pcie_before_sxm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peak comes from the GPU's name, the most specific entry first: an H100 PCIe is not
    taken for the SXM card whose name it contains; an unknown GPU or a CPU gives none."""
    assert peak_flops(torch.device("cpu")) is None
    cuda = torch.device("cuda", 0)
    for name, want in (
        ("NVIDIA H100 80GB HBM3", PEAK_BF16["H100"]),
        ("NVIDIA H100 PCIe", PEAK_BF16["H100 PCIe"]),
        ("NVIDIA A100-SXM4-80GB", PEAK_BF16["A100"]),
        ("Tesla T4", None),
    ):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device, n=name: n)
        assert peak_flops(cuda) == want, name
    assert PEAK_BF16["H100 PCIe"] < PEAK_BF16["H100"]


def test_step_line_shows_eta_mfu_and_memory() -> None:
    rec = {"step": 5, "train_loss": 3.0, "train_time_ms": 1000.0, "eta_s": 125.0, "mfu": 0.4123,
           "peak_mem_gib": 12.34}  # fmt: skip
    line = format_step(rec, 100)
    assert "eta 2m05s" in line and "mfu 41.2%" in line and "mem 12.3 GiB" in line
