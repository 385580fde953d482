"""Download the public FineWeb10B GPT-2 token shards that speedrun records train on.

    python -m data.corpus.fineweb --train-shards 9       # val shard + 9 x 100M training tokens

The files come from the Hugging Face dataset repo `kjj0/fineweb10B-gpt2` through
`huggingface_hub.hf_hub_download` (which honours `HF_ENDPOINT`, `HF_TOKEN` and mirrors): the
validation shard `fineweb_val_000000.bin` and the training shards `fineweb_train_000001.bin`
onward, 100M tokens each, in the shard format `data/shards.py` reads. A file already present
and valid is skipped; every downloaded file's header, length and token ids are checked, and a
bad one is deleted, so nothing that looks like a shard is ever half-written. The hub is
probed once before the first download, so offline the command fails at once; a failed run
leaves behind only the valid shards it had (no hub lock files, no directory it made). Train
on them with `python train.py data=fineweb10b`.
"""

import argparse
import logging
import shutil
import sys
from pathlib import Path

from huggingface_hub import hf_hub_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
from tqdm import tqdm

from data.corpus.hub import hub_unreachable, quiet_hub_logging
from data.shards import ShardError, check_token_ids, load_shard, read_header
from data.tokenizer import GPT2_VOCAB_SIZE

log = logging.getLogger(__name__)

REPO_ID = "kjj0/fineweb10B-gpt2"
DEFAULT_DIR = "~/.cache/gpt-speedrun/fineweb10B"  # where conf/data/fineweb10b.yaml looks
MAX_TRAIN_SHARDS = 103  # fineweb_train_000001.bin ... fineweb_train_000103.bin
VAL_FILE = "fineweb_val_000000.bin"


class DownloadError(RuntimeError):
    """A shard could not be fetched or is not valid; the message says what to do."""


def shard_names(train_shards: int) -> list[str]:
    """The validation shard, then the first `train_shards` training shards."""
    if not 0 <= train_shards <= MAX_TRAIN_SHARDS:
        raise ValueError(f"--train-shards must be in [0, {MAX_TRAIN_SHARDS}], got {train_shards}")
    return [VAL_FILE, *(f"fineweb_train_{i:06d}.bin" for i in range(1, train_shards + 1))]


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
) -> list[Path]:
    """Fetch the shards into `data_dir` (skipping valid ones); return their paths in order."""
    root = Path(data_dir).expanduser()
    names = shard_names(train_shards)
    made = [d for d in (root, *root.parents) if not d.exists()]  # to remove again on failure
    cache = root / ".cache"  # hf_hub_download's locks, metadata and partial files
    cache_before = set(cache.rglob("*")) if cache.exists() else None
    root.mkdir(parents=True, exist_ok=True)
    try:
        return _fetch(root, names, repo_id, revision, endpoint, progress)
    except DownloadError:
        _remove_new(cache, cache_before, made)
        raise


def _fetch(
    root: Path, names: list[str], repo_id: str, revision: str, endpoint: str | None,
    progress: bool,
) -> list[Path]:  # fmt: skip
    paths: list[Path] = []
    probed = False
    for name in tqdm(names, desc="FineWeb shards", unit="shard", disable=not progress):
        target = root / name
        if target.exists() and is_valid(target):
            paths.append(target)
            continue
        target.unlink(missing_ok=True)  # a damaged copy from an earlier attempt
        where = endpoint or "the default endpoint, or HF_ENDPOINT"
        again = (
            f"Check the network (or set HF_ENDPOINT to a mirror), then run the same command "
            f"again: the {len(paths)} valid shard(s) already in {root} are kept."
        )
        if not probed:
            probed = True
            why = hub_unreachable(endpoint)
            if why:
                raise DownloadError(f"could not download {name} from {repo_id}: {why}\n{again}")
        try:
            got = Path(
                hf_hub_download(
                    repo_id,
                    name,
                    repo_type="dataset",
                    revision=revision,
                    local_dir=root,
                    endpoint=endpoint,
                )
            )
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as e:
            raise DownloadError(
                f"could not download {name} from the Hugging Face dataset {repo_id} ({where}): "
                f"{type(e).__name__}: {e}\n{again}"
            ) from e
        try:
            _validate(got)
        except ShardError as e:
            got.unlink(missing_ok=True)
            raise DownloadError(f"downloaded {name} is not a valid shard, deleted it: {e}") from e
        paths.append(got)
    return paths


def _remove_new(cache: Path, before: set[Path] | None, made: list[Path]) -> None:
    """Undo the hub client's bookkeeping from a failed run: its lock and partial files (or the
    whole `.cache` it created), then the directories this run made, if they are empty."""
    if before is None:
        shutil.rmtree(cache, ignore_errors=True)
    elif cache.exists():
        new = sorted(set(cache.rglob("*")) - before, key=lambda p: len(p.parts), reverse=True)
        for p in new:  # deepest first, so a new directory is empty when its turn comes
            if not p.is_dir():
                p.unlink(missing_ok=True)
            elif not any(p.iterdir()):
                p.rmdir()
    for d in made:  # innermost first
        try:
            d.rmdir()
        except OSError:  # not empty: it holds something that is kept
            break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--train-shards",
        type=int,
        default=9,
        help=f"training shards of 100M tokens to fetch, 0-{MAX_TRAIN_SHARDS} (default 9)",
    )
    parser.add_argument("--dir", default=DEFAULT_DIR, help=f"data directory ({DEFAULT_DIR})")
    parser.add_argument("--repo-id", default=REPO_ID, help=f"dataset repo ({REPO_ID})")
    parser.add_argument("--revision", default="main", help="branch, tag or commit (main)")
    parser.add_argument("--endpoint", default=None, help="hub URL (default: HF_ENDPOINT or hub)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_hub_logging()
    try:
        paths = download(args.dir, args.train_shards, args.repo_id, args.revision, args.endpoint)
    except (DownloadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    tokens = sum(read_header(p) for p in paths)
    log.info("%d shards, %d tokens in %s", len(paths), tokens, Path(args.dir).expanduser())
    log.info("train on them: python train.py data=fineweb10b data.dir=%s", args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
