"""Checkpoints on disk: one directory per save, complete or absent, never half-written.

Layout under `<run_dir>/checkpoints/`:

    step_000050/              a complete save
        model.pt              the unwrapped model's state_dict          } layout torch_save
        optimizers.pt         every optimizer's state_dict, in order    } (ddp_*)
        dcp/                  model + optimizer state, each rank's shards (layout dcp, fsdp)
        trainer.pt            loader position, per-rank RNG states, step, tokens, train time
        meta.json             format version, layout, step, world size, threads, config,
                              file sizes
    latest                    the name of the newest complete save, replaced atomically
    .tmp-step_000100-<pid>/   a save in progress (or one a crash abandoned): never loaded

A save writes every file into the temporary directory, fsyncs it, writes `meta.json` last,
renames the directory to its final name (atomic on POSIX) and only then replaces `latest`.
A crash at any point leaves every earlier save intact; `meta.json` lists the byte size of
each file, so a directory damaged afterwards (a truncated file) is recognised and passed over.
"""

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("train")

FORMAT_VERSION = 1
CHECKPOINTS_DIR = "checkpoints"
LATEST = "latest"
META = "meta.json"
PARTS = ("model", "optimizers", "trainer")
DCP_DIR = "dcp"  # a sharded save's model and optimizer state, in Distributed Checkpoint format
# The files each layout must hold: torch_save (a ddp_* dist.parallelism: whole tensors, written by
# rank 0) | dcp (fsdp_*: every rank writes its shards, trainer.pt by rank 0)
REQUIRED = {
    "torch_save": tuple(f"{name}.pt" for name in PARTS),
    "dcp": ("trainer.pt", f"{DCP_DIR}/.metadata"),
}
_PREFIX = "step_"
_TMP_PREFIX = ".tmp-"


class CheckpointError(ValueError):
    """A checkpoint that can't be used: missing, incomplete, corrupt or of another format."""


@dataclass
class Loaded:
    path: Path
    meta: dict[str, Any]
    parts: dict[str, Any]  # "model", "optimizers", "trainer" -> what was saved under them


def step_dir_name(step: int) -> str:
    return f"{_PREFIX}{step:06d}"


def save(root: Path, step: int, parts: dict[str, Any], meta: dict[str, Any], keep: int) -> Path:
    """Write a checkpoint of `step` under `root` atomically (`parts` by torch.save); keep the
    newest `keep`.

    On any error (disk full, I/O) the temporary directory is removed and the error raised:
    earlier checkpoints and `latest` are untouched.
    """
    tmp = begin(root, step)
    try:
        for name in PARTS:
            write_part(tmp, name, parts[name])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return commit(root, tmp, step, {**meta, "layout": "torch_save"}, keep)


def begin(root: Path, step: int) -> Path:
    """A fresh temporary directory for the save of `step` (abandoned ones removed first)."""
    root.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(root)
    tmp = root / f"{_TMP_PREFIX}{step_dir_name(step)}-{os.getpid()}"
    tmp.mkdir()
    return tmp


def write_part(tmp: Path, name: str, obj: Any) -> None:
    _write(tmp / f"{name}.pt", lambda f: torch.save(obj, f))


def commit(root: Path, tmp: Path, step: int, meta: dict[str, Any], keep: int) -> Path:
    """Finish the save in `tmp` (every file written): `meta.json` listing each file's size,
    the atomic rename to its final name, then `latest`; keep the newest `keep` saves."""
    final = root / step_dir_name(step)
    try:
        sizes = {
            str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()
        }
        meta = {**meta, "format_version": FORMAT_VERSION, "step": step, "files": sizes}
        meta["saved_at"] = time.time()
        _write(tmp / META, lambda f: f.write(json.dumps(meta, indent=1).encode()))
        for d in [tmp, *(p for p in tmp.rglob("*") if p.is_dir())]:
            _fsync_dir(d)
        if final.exists():  # a step saved again after resuming from an earlier save
            shutil.rmtree(final)
        tmp.rename(final)
        _fsync_dir(root)
        _replace_text(root / LATEST, final.name + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(root, keep, final)
    return final


def _write(path: Path, write: Any) -> int:
    """Write a file through `write(f)`, fsync it, and return its size in bytes."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_text(path: Path, text: str) -> None:
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}-{os.getpid()}")
    try:
        _write(tmp, lambda f: f.write(text.encode()))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _remove_abandoned(root: Path) -> None:
    """Delete temporary directories a killed save left behind (only rank 0 ever writes)."""
    for p in root.glob(f"{_TMP_PREFIX}*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _prune(root: Path, keep: int, newest: Path) -> None:
    """Keep the `keep` most recently saved checkpoints (by save time, not step: a run resumed
    from an earlier save makes the later steps of the abandoned attempt the oldest)."""
    saves = sorted(_complete(root), key=lambda pm: pm[1].get("saved_at", 0.0), reverse=True)
    for path, _ in saves[keep:]:
        if path != newest:
            shutil.rmtree(path, ignore_errors=True)


def _complete(root: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    for p in sorted(root.glob(f"{_PREFIX}*")):
        with contextlib.suppress(CheckpointError):
            yield p, validate(p)


def validate(path: Path) -> dict[str, Any]:
    """The metadata of the checkpoint directory `path`; raise CheckpointError saying why not."""
    meta_file = path / META
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a checkpoint directory")
    if not meta_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint: it has no {META}")
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{meta_file} is unreadable: {e}") from e
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {version!r}; this code reads {FORMAT_VERSION}"
        )
    files = meta.get("files", {})
    layout = meta.get("layout", "torch_save")
    if layout not in REQUIRED:
        raise CheckpointError(f"{meta_file} names an unknown layout {layout!r}")
    missing = [name for name in REQUIRED[layout] if name not in files]
    if missing:
        raise CheckpointError(f"{meta_file} lists no {', '.join(missing)}")
    for name, size in files.items():
        f = path / name
        actual = f.stat().st_size if f.is_file() else None
        if actual != size:
            found = "is missing" if actual is None else f"has {actual} bytes"
            raise CheckpointError(f"{f} is corrupt: {META} says {size} bytes, the file {found}")
    return meta


def find_latest(root: Path) -> Path | None:
    """The newest usable checkpoint under `root`: `latest` if valid, else the newest valid save.

    Damaged saves are passed over with a warning, so a crash that truncated the newest one
    resumes from the one before.
    """
    if not root.is_dir():
        return None
    named = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else ""
    candidates = [root / named] if named else []
    by_time = []
    for p in sorted(root.glob(f"{_PREFIX}*")):
        try:
            by_time.append((validate(p).get("saved_at", 0.0), p))
        except CheckpointError as e:
            if p not in candidates:
                log.warning("ignoring checkpoint: %s", e)
    candidates += [p for _, p in sorted(by_time, reverse=True) if p not in candidates]
    for p in candidates:
        try:
            validate(p)
            return p
        except CheckpointError as e:
            log.warning("ignoring checkpoint: %s", e)
    return None


def resolve(setting: str, run_dir: Path) -> Path | None:
    """The checkpoint `train.resume` asks for: None to start fresh.

    auto: the run directory's newest checkpoint, if any | never | a path to a checkpoint
    directory, to a checkpoints/ directory or to a run directory (their newest).
    """
    if setting == "never":
        return None
    if setting == "auto":
        return find_latest(run_dir / CHECKPOINTS_DIR)
    path = Path(setting).expanduser()
    if not path.exists():
        raise CheckpointError(f"train.resume={setting!r}: {path} does not exist")
    if (path / META).exists():
        validate(path)
        return path
    for root in (path, path / CHECKPOINTS_DIR):
        found = find_latest(root)
        if found is not None:
            return found
    raise CheckpointError(
        f"train.resume={setting!r}: {path} is not a checkpoint (no {META}) and holds no usable "
        f"checkpoint under it or under {path / CHECKPOINTS_DIR}"
    )


def load(path: Path) -> Loaded:
    """Read a checkpoint directory into CPU memory (tensors move to their device on load).

    A dcp save's model and optimizer state stay on disk: they load into this run's tensors,
    sharded or whole (`trainer/checkpoint/dcp_state.py`); `parts` then holds "trainer" only.
    """
    meta = validate(path)
    parts = {}
    names = PARTS if meta.get("layout", "torch_save") == "torch_save" else ("trainer",)
    for name in names:
        f = path / f"{name}.pt"
        try:
            parts[name] = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises RuntimeError, pickle errors, EOFError, ...
            # torch's message goes on to advise weights_only=False: never for a checkpoint
            # that should hold tensors only, so keep its first line.
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"{f} is corrupt or unreadable: {reason}") from e
    return Loaded(path, meta, parts)
