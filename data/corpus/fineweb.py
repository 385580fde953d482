"""Download the public FineWeb10B GPT-2 token shards that speedrun records train on.

    python -m data.corpus.fineweb --for experiment=record_2025_01_26   # what that preset reads
    python -m data.corpus.fineweb --train-shards N                      # val shard + N x 100M

The files come from the Hugging Face dataset repo `kjj0/fineweb10B-gpt2` (`HF_ENDPOINT`,
`HF_TOKEN` and mirrors work as for any hub download): the validation shard
`fineweb_val_000000.bin` and the training shards `fineweb_train_000001.bin` onward, 100M tokens
each, in the shard format `data/token_shards.py` reads. `--for` takes the overrides of a training
command and fetches the count its config states (`data.fineweb_shards`, docs/data.md) into its
`data.dir`. A file already present and valid is skipped; the others are fetched in parallel,
and each one's header, length and token ids are checked before it is moved under its shard
name, so nothing that looks like a shard is ever half-written or invalid. The hub is probed
once before any download, so offline the command fails at once; a failed run leaves behind
only the valid shards (no hub bookkeeping, no directory it made).
"""

import argparse
import logging
import os
import shlex
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from data.corpus.hub import hub_unreachable, quiet_hub_logging
from data.token_shards import ShardError, check_token_ids, load_shard, read_header
from data.tokenizer import GPT2_VOCAB_SIZE

log = logging.getLogger(__name__)

REPO_ID = "kjj0/fineweb10B-gpt2"
DEFAULT_DIR = "~/.cache/gpt-speedrun/fineweb10B"  # where conf/data/fineweb10b.yaml looks
MAX_TRAIN_SHARDS = 103  # fineweb_train_000001.bin ... fineweb_train_000103.bin
VAL_FILE = "fineweb_val_000000.bin"
WORKERS = 8  # parallel downloads, as huggingface_hub.snapshot_download's default
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


class DownloadError(RuntimeError):
    """A shard could not be fetched or is not valid; the message says what to do."""


def shard_names(train_shards: int) -> list[str]:
    """The validation shard, then the first `train_shards` training shards."""
    if not 0 <= train_shards <= MAX_TRAIN_SHARDS:
        raise ValueError(
            f"the FineWeb training shard count (--train-shards, data.fineweb_shards) must be in "
            f"[0, {MAX_TRAIN_SHARDS}], got {train_shards}"
        )
    return [VAL_FILE, *(f"fineweb_train_{i:06d}.bin" for i in range(1, train_shards + 1))]


def fetch_command(train_shards: int, data_dir: str = DEFAULT_DIR) -> str:
    """The command that fetches the val shard and `train_shards` training shards."""
    cmd = ["python", "-m", "data.corpus.fineweb", "--train-shards", str(train_shards)]
    if data_dir != DEFAULT_DIR:
        cmd += ["--dir", data_dir]
    return shlex.join(cmd)


def preset_shards(overrides: list[str]) -> tuple[int, str]:
    """(data.fineweb_shards, data.dir) of the config `python train.py OVERRIDES` composes."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from data.config import DataConfig

    # conf/config.yaml composes on the trainer's schema (`config_schema`). The data tools
    # import nothing of the trainer, and the data keys need no schema: where none is
    # registered, an empty node stands in for it (types are the trainer's check, at train time).
    store = ConfigStore.instance()
    try:
        store.load("config_schema.yaml")
    except Exception:  # Hydra raises its own ConfigLoadError-like types here
        store.store(name="config_schema", node={})
    shown = " ".join(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            composed = compose(config_name="config", overrides=overrides).data
            data = OmegaConf.merge(OmegaConf.structured(DataConfig), composed)  # its defaults
            shards, data_dir = int(data.fineweb_shards), str(data.dir)
    except Exception as e:  # Hydra's composition errors have no common base
        raise ValueError(f"--for {shown}: {type(e).__name__}: {e}") from e
    if shards == 0:
        raise ValueError(
            f"--for {shown}: the config states no FineWeb shard count (data.fineweb_shards=0); "
            "name a record preset, add data.fineweb_shards=N, or pass --train-shards N"
        )
    return shards, data_dir


def is_valid(path: Path) -> bool:
    try:
        _validate(path)
        return True
    except ShardError:
        return False


def _validate(path: Path) -> None:
    read_header(path)
    check_token_ids(path, load_shard(path), GPT2_VOCAB_SIZE)


def download(
    data_dir: str | Path,
    train_shards: int,
    repo_id: str = REPO_ID,
    revision: str = "main",
    endpoint: str | None = None,
    progress: bool = True,
    workers: int = WORKERS,
) -> list[Path]:
    """Fetch the shards into `data_dir` (skipping valid ones); return their paths in order."""
    root = Path(data_dir).expanduser()
    paths = [root / name for name in shard_names(train_shards)]
    todo = []
    for path in paths:
        if not (path.exists() and is_valid(path)):
            path.unlink(missing_ok=True)  # a damaged copy from an earlier attempt
            todo.append(path.name)
    if not todo:
        return paths  # everything is here: no network needed
    again = (
        "Check the network (or set HF_ENDPOINT to a mirror), then run the same command again: "
        f"the valid shards already in {root} are kept."
    )
    why = hub_unreachable(endpoint)
    if why:  # before anything is created
        raise DownloadError(f"could not download {todo[0]} from {repo_id}: {why}\n{again}")
    made = [d for d in (root, *root.parents) if not d.exists()]  # to remove again on failure
    root.mkdir(parents=True, exist_ok=True)
    try:
        # The hub client keeps its locks, metadata and partial files under its local_dir's
        # .cache/ (for a resume); in a staging directory they go with it, and a file reaches
        # its shard name in data_dir only once checked, so a run training on data_dir never
        # sees an unchecked shard and a failed download leaves nothing but valid shards.
        with tempfile.TemporaryDirectory(prefix=".fineweb-download-", dir=root) as staging:
            hub = {"repo_id": repo_id, "revision": revision, "endpoint": endpoint}
            _fetch_all(root, Path(staging), todo, hub, workers, progress, again)
    except DownloadError:
        for d in made:  # innermost first
            try:
                d.rmdir()
            except OSError:  # not empty: it holds a shard that is kept
                break
        raise
    return paths


def _fetch_all(
    root: Path, staging: Path, names: list[str], hub: dict, workers: int, progress: bool,
    again: str,
) -> None:  # fmt: skip
    """Download `names` in parallel; each checked shard is moved into `root` as it arrives.

    `hf_hub_download` in a thread pool, not `snapshot_download` (which runs the same
    `hf_hub_download` calls in the same kind of pool): snapshot_download first lists the whole
    repository (two more API calls), drops a requested name that the listing lacks without an
    error, and writes a ref under HF_HUB_CACHE even with a local_dir. Here each name is asked
    for, and a missing one fails naming it.
    """
    failed: dict[str, str] = {}
    with (
        ThreadPoolExecutor(max_workers=max(1, workers)) as pool,
        tqdm(total=len(names), desc="FineWeb shards", unit="shard", disable=not progress) as bar,
    ):
        futures = {pool.submit(_fetch_one, root, staging, name, hub): name for name in names}
        for future in as_completed(futures):
            try:
                future.result()
            except DownloadError as e:
                failed[futures[future]] = str(e)
            bar.update()
    if failed:
        first, *others = sorted(failed)
        more = f" ({len(others)} more failed: {', '.join(others)})" if others else ""
        raise DownloadError(f"{failed[first]}{more}\n{again}")


def _fetch_one(root: Path, staging: Path, name: str, hub: dict) -> None:
    from huggingface_hub import hf_hub_download

    where = hub["endpoint"] or "the default endpoint, or HF_ENDPOINT"
    try:
        got = Path(hf_hub_download(
            hub["repo_id"], name, repo_type="dataset", revision=hub["revision"],
            local_dir=staging, endpoint=hub["endpoint"],
        ))  # fmt: skip
    except Exception as e:  # the client's HTTP, transport and file errors share no base class
        raise DownloadError(
            f"could not download {name} from the Hugging Face dataset {hub['repo_id']} "
            f"({where}): {type(e).__name__}: {e}"
        ) from e
    try:
        _validate(got)
    except ShardError as e:
        got.unlink(missing_ok=True)
        raise DownloadError(f"downloaded {name} is not a valid shard, deleted it: {e}") from e
    os.replace(got, root / name)  # same file system: atomic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    count = parser.add_mutually_exclusive_group(required=True)
    count.add_argument(
        "--for",
        dest="preset",
        nargs="+",
        metavar="OVERRIDE",
        help="a training command's overrides, e.g. experiment=record_2025_01_26: fetch the "
        "shards its config states (data.fineweb_shards) into its data.dir",
    )
    count.add_argument(
        "--train-shards",
        type=int,
        help=f"training shards of 100M tokens to fetch, 0-{MAX_TRAIN_SHARDS}",
    )
    parser.add_argument("--dir", help=f"data directory (the preset's data.dir, or {DEFAULT_DIR})")
    parser.add_argument("--repo-id", default=REPO_ID, help=f"dataset repo ({REPO_ID})")
    parser.add_argument("--revision", default="main", help="branch, tag or commit (main)")
    parser.add_argument("--endpoint", default=None, help="hub URL (default: HF_ENDPOINT or hub)")
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help=f"parallel downloads ({WORKERS})"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_hub_logging()
    try:
        shards, preset_dir = preset_shards(args.preset) if args.preset else (args.train_shards, "")
        data_dir = args.dir or preset_dir or DEFAULT_DIR
        paths = download(
            data_dir, shards, args.repo_id, args.revision, args.endpoint, workers=args.workers
        )
    except (DownloadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    tokens = sum(read_header(p) for p in paths)
    log.info("%d shards, %d tokens in %s", len(paths), tokens, Path(data_dir).expanduser())
    if args.preset:
        extra = [f"data.dir={data_dir}"] if data_dir != preset_dir else []
        log.info("train on them: %s", shlex.join(["python", "train.py", *args.preset, *extra]))
    else:
        log.info("train on them: python train.py data=fineweb10b data.dir=%s", data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
