"""scripts/sample.py on tiny trained checkpoints: seeded samples, the newest save, greedy
decoding against the model itself, an fsdp save as its ddp twin, and one-line errors."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from data.tokenizer import GPT2_VOCAB_SIZE, encode_document, gpt2_encoding
from model import GPT, ModelConfig
from scripts.sample import SEPARATOR, find_checkpoint, main
from tests.helpers import TINY, compose_config
from train import train
from trainer.checkpoint import files

REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 64  # train.seq_len in TINY: generating more than this exercises the context crop


def tiny_run(run_dir: Path, cache: Path, *overrides: str) -> Path:
    """Train TINY with a save at the end; return the run directory."""
    cfg = compose_config(
        [*TINY, "train.checkpoint_at_end=true", f"run_dir={run_dir}", f"data.cache_dir={cache}",
         *overrides]
    )  # fmt: skip
    train(cfg)
    return run_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, corpus_cache: Path) -> Path:
    return tiny_run(tmp_path_factory.mktemp("sample-run"), corpus_cache)


def sample(capsys: pytest.CaptureFixture, target: Path, *args: str) -> list[str]:
    """The samples `python -m scripts.sample target args` prints."""
    capsys.readouterr()
    main([str(target), "--max-new-tokens", "8", *args])
    out = capsys.readouterr().out
    assert out.endswith(f"\n{SEPARATOR}\n")
    return out[: -len(SEPARATOR) - 2].split(f"\n{SEPARATOR}\n")


def test_prints_seeded_samples(run: Path, capsys: pytest.CaptureFixture) -> None:
    args = ("--temperature", "1", "--top-k", "0")
    first = sample(capsys, run, *args, "--seed", "1", "--num-samples", "2")
    assert len(first) == 2 and all(first) and first[0] != first[1]
    # Samples are drawn one after another from one generator: the first is the same alone.
    assert sample(capsys, run, *args, "--seed", "1") == first[:1]
    assert sample(capsys, run, *args, "--seed", "2") != first[:1]
    (prompted,) = sample(capsys, run, "--prompt", "Once upon a time")
    assert prompted.startswith("Once upon a time") and len(prompted) > len("Once upon a time")


def test_finds_the_newest_checkpoint(run: Path) -> None:
    step = run / "checkpoints" / files.step_dir_name(4)
    assert find_checkpoint(str(run)) == find_checkpoint(str(run / "checkpoints")) == step
    assert find_checkpoint(str(step)) == step


def greedy(checkpoint: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding written out directly: argmax of the real vocabulary, context cropped."""
    meta = files.validate(checkpoint)
    saved = OmegaConf.merge(OmegaConf.structured(ModelConfig), meta["config"]["model"])
    model = GPT(OmegaConf.to_object(saved))
    model.load_state_dict(torch.load(checkpoint / "model.pt", weights_only=True))
    model.eval()
    idx = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(idx[:, -SEQ_LEN:])[0, -1, :GPT2_VOCAB_SIZE]
            idx = torch.cat([idx, logits.argmax().view(1, 1)], dim=1)
    return idx[0].tolist()


def test_top_k_1_is_greedy(run: Path, capsys: pytest.CaptureFixture) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 6
    tokens = encode_document(prompt)
    assert len(tokens) < SEQ_LEN < len(tokens) + 12  # generation runs past the context
    expected = greedy(files.find_latest(run / "checkpoints"), tokens, 12)
    args = ("--prompt", prompt, "--top-k", "1", "--temperature", "1.5", "--max-new-tokens", "12")
    assert sample(capsys, run, *args, "--seed", "0") == [gpt2_encoding().decode(expected[1:])]
    assert sample(capsys, run, *args, "--seed", "7") == [gpt2_encoding().decode(expected[1:])]


@pytest.mark.slow
def test_fsdp_checkpoint_samples_as_its_ddp_twin(
    run: Path, tmp_path: Path, corpus_cache: Path, capsys: pytest.CaptureFixture
) -> None:
    """A 1-rank fsdp run computes the ddp run bit for bit, so its dcp save samples the same."""
    fsdp = tiny_run(tmp_path, corpus_cache, "dist.parallelism=fsdp_gather")
    assert files.validate(files.find_latest(fsdp / "checkpoints"))["layout"] == "dcp"
    for args in (("--top-k", "1"), ("--temperature", "1", "--seed", "3")):
        assert sample(capsys, fsdp, *args) == sample(capsys, run, *args)


def test_bad_paths_fail_with_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.sample", str(missing)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"error: {missing} does not exist\n"
    broken = tmp_path / "checkpoints" / files.step_dir_name(1)
    broken.mkdir(parents=True)
    (broken / files.META).write_text("{not json")
    for path, why in ((tmp_path, "holds no usable checkpoint"), (broken, "is unreadable")):
        with pytest.raises(SystemExit) as exit_:
            main([str(path)])
        message = exit_.value.code  # sys.exit(message): printed to stderr, exit status 1
        assert isinstance(message, str) and "\n" not in message
        assert str(path) in message and why in message
