"""`data.corpus.prepare` end to end: small corpora with its defaults (the printed train
command works as printed, an error leaves nothing behind), byte-identical shards whatever
the worker count, and the command line then training on its shards."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from data.corpus import prepare as prep
from data.loader import TokenLoader, val_batches
from data.token_shards import load_shard
from data.tokenizer import EOT, gpt2_encoding
from tests.e2e.test_fineweb import unreachable
from tests.helpers import TINY, compose_config
from tests.unit.test_prepare import DOCS as PREPARE_DOCS
from tests.unit.test_prepare import write_inputs
from train import train

REPO = Path(__file__).resolve().parents[2]

# 20 documents, ~4,300 tokens: far less than one default shard (100M tokens).
DOCS = [f"Document {i}. " + "The quick brown fox jumps over the lazy dog. " * 20 for i in range(20)]


def write_txt(tmp: Path, docs: list[str] = DOCS) -> list[str]:
    tmp.mkdir(parents=True, exist_ok=True)
    for i, d in enumerate(docs):
        (tmp / f"doc{i:02d}.txt").write_text(d, encoding="utf-8")
    return [str(tmp / f"doc{i:02d}.txt") for i in range(len(docs))]


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "data.corpus.prepare", "--num-proc", "1", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def api(tmp: Path, files: list[str], out: Path, **kw) -> dict:
    spec = prep.Spec(files=tuple(files), **kw)
    return prep.prepare(spec, out, cache_dir=str(tmp / "hf"), progress=False)


@pytest.mark.slow  # ~15 s: two steps of the default model on CPU
def test_default_settings_then_the_printed_command_trains(tmp_path: Path) -> None:
    files = write_txt(tmp_path / "in")
    out = tmp_path / "shards"
    res = cli("--files", *files, "--out", str(out), "--cache-dir", str(tmp_path / "hf"))
    assert res.returncode == 0, res.stderr[-3000:]
    printed = res.stderr.split("train on them: ", 1)[1].splitlines()[0]
    assert "train.val_tokens=" in printed
    cmd = shlex.split(printed)
    assert cmd[:2] == ["python", "train.py"]
    cmd = [sys.executable, *cmd[1:], "train.steps=2", "train.checkpoint_every=0",
           "train.checkpoint_at_end=false", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "final val loss" in (tmp_path / "run" / "train.log").read_text()


def test_a_corpus_of_one_shard_is_split_a_tenth_for_validation(tmp_path: Path) -> None:
    files = write_txt(tmp_path / "in")
    summary = api(tmp_path, files, tmp_path / "out")
    enc = gpt2_encoding()
    want = np.concatenate([[EOT, *enc.encode_ordinary(d)] for d in DOCS]).astype(np.uint16)
    val = load_shard(tmp_path / "out" / "corpus_val_000000.bin")
    train = load_shard(tmp_path / "out" / "corpus_train_000001.bin")
    assert summary["shards"] == ["corpus_val_000000.bin", "corpus_train_000001.bin"]
    assert len(val) == len(want) // 10 and np.array_equal(np.concatenate([val, train]), want)
    command = prep.train_command(summary)
    assert f"train.val_tokens={(len(val) - 1) // 256 * 256}" in command
    assert "train.batch_size" not in command, "the training shard holds a default batch"


def test_the_command_fits_the_shards(tmp_path: Path) -> None:
    summary = {"out": "d", "val_tokens": 600, "largest_train_shard": 1500}
    command = prep.train_command(summary)
    # 2 sequences of 256 need 513 <= 600 tokens; 5 x 256 + 1 <= 1500 training tokens
    assert command.endswith("data.dir=d train.val_tokens=512 train.batch_size=5")
    big = {"out": "d", "val_tokens": 10**8, "largest_train_shard": 10**8}
    assert prep.train_command(big) == "python train.py data=local data.dir=d"
    assert "train.seq_len=64 train.val_tokens=576" in prep.train_command(summary, seq_len=64)
    local = yaml.safe_load((REPO / "conf" / "data" / "local.yaml").read_text())
    assert local["val_tokens"] == prep.LOCAL_VAL_TOKENS


def test_too_little_text_writes_nothing(tmp_path: Path) -> None:
    files = write_txt(tmp_path / "in", DOCS[:1])
    out = tmp_path / "new" / "shards"
    with pytest.raises(prep.PrepareError, match=r"holds \d+ tokens: too little text"):
        api(tmp_path, files, out)
    assert not (tmp_path / "new").exists()


def test_too_small_a_validation_split_names_the_flag_and_keeps_user_files(tmp_path: Path) -> None:
    files = write_txt(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(prep.PrepareError, match=r"--val-fraction 0\.05 holds out \d+ tokens.*"
                       r"raise --val-fraction"):  # fmt: skip
        api(tmp_path, files, out, val_fraction=0.05)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    # The corrected command then works on the same --out.
    api(tmp_path, files, out, val_fraction=0.25)
    assert (out / "corpus_val_000000.bin").exists()


def test_an_error_after_the_first_shard_removes_it(tmp_path: Path) -> None:
    files = write_txt(tmp_path / "in", DOCS[:3])  # ~660 tokens
    out = tmp_path / "out"
    with pytest.raises(prep.PrepareError, match=r"leaving \d+ tokens, too little text.*"
                       r"raise --shard-tokens, or use --val-fraction"):  # fmt: skip
        api(tmp_path, files, out, shard_tokens=600)
    assert not out.exists()
    api(tmp_path, files, out, shard_tokens=300)  # the advice works on the same --out


def test_files_with_different_columns_are_named(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    b.write_text(json.dumps({"body": DOCS[0]}) + "\n")
    res = cli("--files", str(a), str(b), "--out", str(tmp_path / "out"),
              "--cache-dir", str(tmp_path / "hf"))  # fmt: skip
    assert res.returncode == 1
    err = res.stderr.splitlines()[-1]
    assert f"{a}: ['id', 'text']; {b}: ['body']" in err, err
    assert f"--text-field 'text' (missing from {b})" in err, err
    assert not (tmp_path / "out").exists()


def test_an_unreachable_hub_fails_at_once_and_writes_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "HF_ENDPOINT": unreachable()}
    env.pop("HF_HUB_OFFLINE", None)
    res = cli("--dataset", "someone/corpus", "--out", str(tmp_path / "out"),
              "--cache-dir", str(tmp_path / "hf"), env=env)  # fmt: skip
    assert res.returncode == 1
    assert "cannot reach the Hugging Face hub" in res.stderr and "HF_HUB_OFFLINE=1" in res.stderr
    assert "Retrying" not in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_output_is_byte_identical_whatever_num_proc(tmp_path: Path) -> None:
    files = write_inputs(tmp_path / "in", "jsonl")
    outs = []
    for n in (1, 2):
        out = tmp_path / f"out{n}"
        spec = prep.Spec(files=tuple(files), shard_tokens=300)
        prep.prepare(spec, out, num_proc=n, cache_dir=str(tmp_path / "hf"), progress=False,
                     seq_len=64)  # fmt: skip
        outs.append({p.name: p.read_bytes() for p in out.glob("*.bin")})
    assert outs[0] == outs[1] and len(outs[0]) > 3


@pytest.mark.slow
def test_cli_then_training_on_the_shards(tmp_path: Path) -> None:
    files = write_inputs(tmp_path / "in", "txt", docs=PREPARE_DOCS * 5)
    out = tmp_path / "shards"
    cmd = [sys.executable, "-m", "data.corpus.prepare", "--files", *files, "--out", str(out),
           "--shard-tokens", "2000", "--num-proc", "2",
           "--cache-dir", str(tmp_path / "hf")]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"data.dir={out}" in res.stderr
    train_files = sorted(out.glob("*_train_*.bin"))
    x, _ = TokenLoader(train_files, batch_size=2, seq_len=64, align="bos").next_batch()
    assert x.shape == (2, 64) and x[:, 0].tolist() == [EOT, EOT]
    assert len(list(val_batches(sorted(out.glob("*_val_*.bin")), 512, 2, 64))) == 4
    cfg = compose_config([*TINY, "data=local", f"data.dir={out}", f"run_dir={tmp_path / 'run'}",
                          "train.steps=3", "data.align=bos"])  # fmt: skip
    assert np.isfinite(train(cfg))
