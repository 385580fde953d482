"""MFU's FLOP count and the step line's ETA / MFU / memory fields."""

import torch

from model import GPT, ModelConfig
from trainer.flops import PEAK_BF16, flops_per_token, peak_flops
from trainer.metrics import format_step


def test_flops_per_token_is_the_palm_convention_for_gpt2_small() -> None:
    with torch.device("meta"):
        model = GPT(ModelConfig(n_layer=12, n_head=12, n_embd=768))
    d, layers, vocab = 768, 12, 50304
    matrices = layers * 12 * d * d + vocab * d  # q, k, v, o (4d²) + fc, proj (8d²); the head
    assert flops_per_token(model, d, 1024) == 6 * matrices + 12 * layers * d * 1024


def test_attention_free_layers_add_no_attention_flops() -> None:
    with torch.device("meta"):
        full = GPT(ModelConfig())
        fewer = GPT(ModelConfig(attention_layers="AA.A"))
    n_attention = 4 * 128 * 128  # the one layer without attention lacks q, k, v, o
    want = flops_per_token(full, 128, 256) - 6 * n_attention - 12 * 128 * 256
    assert flops_per_token(fewer, 128, 256) == want


def test_no_peak_on_a_cpu_and_pcie_before_sxm() -> None:
    assert peak_flops(torch.device("cpu")) is None
    assert PEAK_BF16["H100 PCIe"] < PEAK_BF16["H100"]


def test_step_line_shows_eta_mfu_and_memory() -> None:
    rec = {"step": 5, "train_loss": 3.0, "train_time_ms": 1000.0, "eta_s": 125.0, "mfu": 0.4123,
           "peak_mem_gib": 12.34}  # fmt: skip
    line = format_step(rec, 100)
    assert "eta 2m05s" in line and "mfu 41.2%" in line and "mem 12.3 GiB" in line
