"""The FineWeb downloader against a loopback stand-in for the hub (real hf_hub_download calls)."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data.corpus import fineweb
from data.token_shards import HEADER_BYTES, read_header, write_shard
from tests.helpers import TINY, compose_config
from tests.hub_server import serve_hub

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub_files(tmp_path: Path) -> Path:
    """A tiny FineWeb lookalike: the val shard and three training shards."""
    files = tmp_path / "hub"
    files.mkdir()
    rng = np.random.default_rng(0)
    for name in fineweb.shard_names(3):
        write_shard(files / name, rng.integers(0, 50257, size=1000 + len(name)))
    return files


def test_downloads_and_validates_the_shards(hub_files: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    with serve_hub(hub_files, fineweb.REPO_ID) as (endpoint, gets):
        paths = fineweb.download(out, 2, endpoint=endpoint, progress=False)
        assert [p.name for p in paths] == [
            "fineweb_val_000000.bin",
            "fineweb_train_000001.bin",
            "fineweb_train_000002.bin",
        ]
        for p in paths:
            assert p.read_bytes() == (hub_files / p.name).read_bytes()
        assert sorted(gets) == sorted(p.name for p in paths)
        # A rerun for more shards fetches only the new one.
        fineweb.download(out, 3, endpoint=endpoint, progress=False)
        assert gets[3:] == ["fineweb_train_000003.bin"]


def test_a_damaged_local_shard_is_fetched_again(hub_files: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    with serve_hub(hub_files, fineweb.REPO_ID) as (endpoint, gets):
        fineweb.download(out, 1, endpoint=endpoint, progress=False)
        shard = out / "fineweb_train_000001.bin"
        shard.write_bytes(shard.read_bytes()[:-10])  # truncated
        fineweb.download(out, 1, endpoint=endpoint, progress=False)
        assert gets.count("fineweb_train_000001.bin") == 2
        assert read_header(shard) == read_header(hub_files / shard.name)


def test_a_bad_file_from_the_hub_is_deleted(hub_files: Path, tmp_path: Path) -> None:
    bad = hub_files / "fineweb_train_000001.bin"
    data = bytearray(bad.read_bytes())
    data[HEADER_BYTES : HEADER_BYTES + 2] = (60000).to_bytes(2, "little")  # id >= vocab
    bad.write_bytes(bytes(data))
    out = tmp_path / "data"
    bad_id = pytest.raises(
        fineweb.DownloadError, match=r"not a valid shard, deleted it: .*token id 60000"
    )
    with serve_hub(hub_files, fineweb.REPO_ID) as (endpoint, _), bad_id:
        fineweb.download(out, 1, endpoint=endpoint, progress=False)
    assert not (out / bad.name).exists()
    assert (out / "fineweb_val_000000.bin").exists(), "the good shard before it is kept"


def test_missing_file_on_the_hub_names_it(hub_files: Path, tmp_path: Path) -> None:
    (hub_files / "fineweb_train_000002.bin").unlink()
    missing = pytest.raises(fineweb.DownloadError, match=r"fineweb_train_000002\.bin.*NotFound")
    with serve_hub(hub_files, fineweb.REPO_ID) as (endpoint, _), missing:
        fineweb.download(tmp_path / "data", 2, endpoint=endpoint, progress=False)
    assert not (tmp_path / "data" / "fineweb_train_000002.bin").exists()
    locks = list((tmp_path / "data").rglob("*.lock"))
    assert not locks, "the failed attempt's lock files are removed"


def unreachable() -> str:
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_unreachable_hub_gives_one_clear_message(tmp_path: Path) -> None:
    out = tmp_path / "new" / "data"
    cmd = [sys.executable, "-m", "data.corpus.fineweb", "--train-shards", "1", "--dir", str(out)]
    t0 = time.monotonic()
    res = subprocess.run(
        [*cmd, "--endpoint", unreachable()], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert time.monotonic() - t0 < 15, "no retries against a hub that cannot be reached"
    assert res.returncode == 1
    assert "could not download fineweb_val_000000.bin" in res.stderr
    assert "run the same command again" in res.stderr
    assert "Traceback" not in res.stderr and "Retrying" not in res.stderr
    assert not (tmp_path / "new").exists(), "nothing is left behind, not even the directory"


def test_a_failed_download_keeps_what_was_there(hub_files: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    (out / ".cache" / "huggingface").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    (hub_files / "fineweb_train_000001.bin").unlink()
    missing = pytest.raises(fineweb.DownloadError, match=r"fineweb_train_000001\.bin")
    with serve_hub(hub_files, fineweb.REPO_ID) as (endpoint, _), missing:
        fineweb.download(out, 1, endpoint=endpoint, progress=False)
    kept = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert kept == [".cache", ".cache/huggingface", "fineweb_val_000000.bin", "notes.txt"], kept


def test_bad_shard_count_is_refused() -> None:
    with pytest.raises(ValueError, match="--train-shards"):
        fineweb.shard_names(104)


@pytest.mark.slow
def test_from_nothing_to_fineweb_training(tmp_path: Path) -> None:
    """The two commands of docs/data.md, with HF_ENDPOINT pointing at the stand-in hub."""
    files = tmp_path / "hub"
    files.mkdir()
    rng = np.random.default_rng(1)
    for name in fineweb.shard_names(2):
        write_shard(files / name, rng.integers(0, 50257, size=20_000))
    data = tmp_path / "fineweb10B"
    with serve_hub(files, fineweb.REPO_ID) as (endpoint, _):
        env = {**os.environ, "HF_ENDPOINT": endpoint}
        get = [
            sys.executable,
            "-m",
            "data.corpus.fineweb",
            "--train-shards",
            "2",
            "--dir",
            str(data),
        ]
        res = subprocess.run(get, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "data=fineweb10b" in res.stderr
    train = [sys.executable, "train.py", "data=fineweb10b", f"data.dir={data}", *TINY,
             "train.val_tokens=4096", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    res = subprocess.run(train, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "final val loss" in (tmp_path / "run" / "train.log").read_text()


def test_for_a_preset_fetches_the_count_it_states(tmp_path: Path) -> None:
    """`--for` fetches the val shard and the preset's data.fineweb_shards training shards into
    its data.dir, not one more, though the hub holds one more."""
    overrides = ["experiment=record_2025_01_26", f"data.dir={tmp_path / 'data'}"]
    count = compose_config(overrides).data.fineweb_shards
    files = tmp_path / "hub"
    files.mkdir()
    rng = np.random.default_rng(2)
    for name in fineweb.shard_names(count + 1):
        write_shard(files / name, rng.integers(0, 50257, size=500))
    cmd = [sys.executable, "-m", "data.corpus.fineweb", "--for", *overrides]
    with serve_hub(files, fineweb.REPO_ID) as (endpoint, gets):
        env = {**os.environ, "HF_ENDPOINT": endpoint}
        res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(gets) == sorted(fineweb.shard_names(count))
    got = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert got == sorted(fineweb.shard_names(count)), "only shards: no hub bookkeeping is left"
    assert f"train on them: python train.py {' '.join(overrides)}" in res.stderr


def test_for_a_config_without_a_count_names_the_key(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "data.corpus.fineweb", "--for", "experiment=smoke"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert "data.fineweb_shards=0" in res.stderr and "--train-shards N" in res.stderr
    assert "Traceback" not in res.stderr
