"""A CPU run that would not fit this machine's memory is refused before its first step, with
the numbers. References: the estimate's terms by hand from the config and the parameters."""

from pathlib import Path

import pytest
import torch

from model import GPT
from tests.helpers import TINY, compose_config
from train import train
from trainer import memory_check
from trainer.config import to_config
from trainer.memory_check import GIB, check_fits, estimate


def config(*overrides: str):
    return to_config(compose_config([*TINY, "run_dir=/tmp/unused", *overrides]))


def test_the_estimate_is_its_terms() -> None:
    """Tiny model (2 layers, d 64, 2 heads), 2 sequences of 64 a step on one rank."""
    conf = config()
    with torch.device("meta"):
        model = GPT(conf.model, conf.train.stages)
    params = list(model.parameters())
    e = estimate(conf, model, 1)
    assert e.state == sum(p.numel() * (p.element_size() + 8) for p in params)
    assert e.activations == 32 * 2 * 64 * (2 * 64)
    assert e.scores == 0, "plain causal attention runs a fused kernel"
    masked = config("model.attention.document_mask=true")
    assert estimate(masked, model, 1).scores == 16 * 2 * 64 * 64 * 2
    # Compiled, the kernel still reads the dense boolean mask: a byte per pair
    compiled = config("model.attention.document_mask=true", "model.compile=true")
    assert estimate(compiled, model, 1).scores == 64 * 64 * 2
    # A longer evaluation sequence (4 of 256 tokens... here 1 of 512) is the larger term
    longer = config("model.attention.document_mask=true", "train.val_seq_len=512")
    assert estimate(longer, model, 1).scores == 16 * 2 * 512 * 512 * 1
    # Two ranks: each holds one sequence per micro-step
    assert estimate(masked, model, 2).activations == e.activations // 2


def test_a_run_that_does_not_fit_is_refused_with_the_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conf = config("model.attention.document_mask=true")
    with torch.device("meta"):
        model = GPT(conf.model, conf.train.stages)
    need = estimate(conf, model, 1).total
    monkeypatch.setattr(memory_check, "available_bytes", lambda: 2 * need)
    check_fits(conf, model, 1, 1)  # fits
    with pytest.raises(ValueError, match=r"on 3 rank\(s\)") as refused:
        check_fits(conf, model, 1, 3)  # three ranks on this machine do not
    said = str(refused.value)
    assert (
        f"{3 * need / GIB:.1f} GiB more" in said and f"{2 * need / GIB:.1f} GiB available" in said
    )
    assert "train.seq_len=64" in said and "toy size" in said and "attention scores" in said
    monkeypatch.setattr(memory_check, "available_bytes", lambda: None)
    check_fits(conf, model, 1, 3)  # a machine that does not say: no check


@pytest.mark.parametrize(
    ("compiled", "need"),
    [("false", r"23\d\.\d"), ("true", r"18\.\d")],  # eager: the scores; compiled: the mask
)  # fmt: skip
def test_record_21_at_full_size_on_a_cpu_stops_before_training(
    tmp_path: Path, corpus_cache: Path, monkeypatch: pytest.MonkeyPatch, compiled: str, need: str
) -> None:
    """The missing-data hint's data=sample with record #21's full 48k-token sequences, as the
    preset runs (compiled) and eager, on a machine of the issue's 15.7 GiB: refused before its
    first evaluation, nothing trained (it was ended by the OOM killer there)."""
    monkeypatch.setattr(memory_check, "available_bytes", lambda: int(15.7 * GIB))
    cfg = compose_config(["experiment=record_2025_01_26", "data=sample", "train.device=cpu",
                          f"data.cache_dir={corpus_cache}", f"run_dir={tmp_path}",
                          "train.checkpoint_every=0", "train.checkpoint_at_end=false",
                          f"model.compile={compiled}"])  # fmt: skip
    with pytest.raises(ValueError, match=rf"this run needs about {need} GiB more"):
        train(cfg)
    assert not (tmp_path / "metrics.jsonl").exists()


def record_89(*overrides: str):
    return to_config(compose_config(["experiment=record_2026_07_17", "run_dir=/tmp/unused",
                                     "model.compile=false", *overrides]))  # fmt: skip


def test_record_89_eager_fits_an_80_gb_gpu_and_a_dense_mask_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU: FlexAttention (impl=auto) and the varlen kernel hold no scores, so record #89
    at its real size with model.compile=false is its state and activations, under 80 GB;
    impl=sdpa's dense mask at the evaluation's 262,144 tokens (3 bytes a pair) is refused
    before the first step, naming the key."""
    conf = record_89()
    with torch.device("meta"):
        model = GPT(conf.model, conf.train.stages)
    cuda = torch.device("cuda", 0)
    e = estimate(conf, model, 1, "cuda")
    assert e.scores == 0 and e.total < 40 * GIB
    assert estimate(record_89("model.attention.impl=varlen"), model, 1, "cuda").scores == 0
    monkeypatch.setattr(memory_check, "gpu_free_bytes", lambda device: 80 * 10**9)
    check_fits(conf, model, 1, 8, cuda)  # fits: 8 ranks on the machine, one per GPU
    dense = record_89("model.attention.impl=sdpa")
    val = dense.train.val_seq_len or dense.train.seq_len
    assert estimate(dense, model, 1, "cuda").scores == 3 * (2 * val) ** 2 * dense.train.val_rows(1)
    with pytest.raises(ValueError, match=r"on this GPU, which has 74\.5 GiB") as refused:
        check_fits(dense, model, 1, 8, cuda)
    assert "impl=sdpa on a GPU" in str(refused.value) and "on 1 rank(s)" in str(refused.value)
