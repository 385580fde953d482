"""A preset's FineWeb shard count is one number, `data.fineweb_shards`, and it is right.

- Each preset's count is what its run reads: a stream preset's exactly, by the loader's rule
  on 100M-token shards (checked against the loader itself); a pieces preset's with the stated
  allowance of 1.5x the tokens its rows hold (its comment says why).
- No page contradicts it: docs/data.md's table "FineWeb shards per preset" lists every count,
  and any other count a page or a config file states (`--train-shards N`, "N shards",
  "N fetched") must sit on a line naming its preset and agree with that preset's count; a count
  naming no preset is an error (write `--for experiment=NAME` or link the table instead).
- A FineWeb directory that lacks the run's shards is refused with the command that fetches
  them.
"""

import math
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from data.build import find_shards
from data.corpus import fineweb
from data.loader import TokenLoader
from data.token_shards import write_shard
from tests.helpers import compose_config
from trainer.config import Config, to_config

REPO = Path(__file__).resolve().parents[2]
SHARD_TOKENS = 100_000_000  # every FineWeb10B training shard we read holds 10^8 tokens
PIECES_ALLOWANCE = 1.5  # pieces skip document tails whose share depends on FineWeb's lengths
TABLE = "FineWeb shards per preset"
PRESET = re.compile(r"\b(record_(?:medium_)?\d{4}_\d{2}_\d{2}|speedrun_124m)\b")
COUNT = re.compile(
    r"--train-shards[ =](\d+)"
    r"|(?<![\w.,/-])(\d+) (?:FineWeb |train |training )*shards?\b"
    r"|\b(\d+) fetched\b"
)


def preset(name: str) -> Config:
    return to_config(compose_config([f"experiment={name}", "run_dir=."]))


def counts() -> dict[str, int]:
    """Every experiment preset that states a FineWeb shard count, and the count."""
    names = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
    stated = {n: preset(n).data.fineweb_shards for n in names}
    return {n: c for n, c in stated.items() if c}


def stream_shards(shard_tokens: int, spans: Iterable[int]) -> int:
    """The shards the stream loader (data/loader.py) opens for global batches of `spans`
    tokens: a batch takes span + 1 tokens of one shard, or moves to the next shard's start."""
    shard, pos = 1, 0
    for span in spans:
        if pos + span + 1 > shard_tokens:
            shard, pos = shard + 1, 0
        pos += span
    return shard


def needed(conf: Config) -> int:
    t = conf.train
    if conf.data.align == "stream":
        return stream_shards(SHARD_TOKENS, (t.step_tokens(s) for s in range(t.steps)))
    assert conf.data.align == "pieces", f"no shard rule for data.align={conf.data.align}"
    rows = sum(t.batch_size * (t.seq_len_at(s) + 1) for s in range(t.steps))  # L + 1 a buffer
    return math.ceil(PIECES_ALLOWANCE * rows / SHARD_TOKENS)


def test_the_stream_rule_is_the_loaders(tmp_path: Path) -> None:
    """stream_shards against TokenLoader itself, on 1,000-token shards and steps of 3 rows of
    64 or 128 tokens (192 or 384 + 1 per batch)."""
    files = [tmp_path / f"x_train_{i:06d}.bin" for i in range(12)]
    for f in files:
        write_shard(f, np.zeros(1000, dtype=np.uint16))
    loader = TokenLoader(files, batch_size=3, seq_len=128)
    lengths = [64 if s % 3 else 128 for s in range(25)]
    for steps, length in enumerate(lengths, 1):
        loader.advance(length)
        assert loader.epoch == 0
        spans = [3 * n for n in lengths[:steps]]
        assert stream_shards(1000, spans) == loader.state_dict()["shard"] + 1, steps


@pytest.mark.parametrize("name", sorted(counts()))
def test_each_preset_states_what_its_run_reads(name: str) -> None:
    conf = preset(name)
    assert conf.data.source == "shards" and conf.data.dir.endswith("fineweb10B"), name
    assert conf.data.fineweb_shards == needed(conf), (
        f"conf/experiment/{name}.yaml: data.fineweb_shards={conf.data.fineweb_shards}, but "
        f"its {conf.train.steps} steps ({conf.train.tokens_after(conf.train.steps):,} tokens, "
        f"data.align={conf.data.align}) read {needed(conf)}"
    )


def test_the_record_presets_state_a_count() -> None:
    records = [p.stem for p in (REPO / "conf" / "experiment").glob("record_*.yaml")]
    assert sorted(records) == sorted(n for n in counts() if n.startswith("record_"))


def pages(repo: Path) -> list[Path]:
    return [
        repo / "README.md",
        *sorted((repo / "docs").rglob("*.md")),
        *sorted((repo / "conf").rglob("*.yaml")),
        *sorted((repo / "data" / "corpus").glob("*.py")),
    ]


def table(repo: Path) -> dict[str, int]:
    """docs/data.md's table: each preset named in a row's first cell, and the last cell."""
    text = (repo / "docs" / "data.md").read_text(encoding="utf-8")
    after = text.split(f"## {TABLE}\n", 1)[1] if f"## {TABLE}\n" in text else ""
    out: dict[str, int] = {}
    for line in after.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[-1].isdigit():
            out |= {n: int(cells[-1]) for n in PRESET.findall(cells[0])}
        elif out and not line.startswith("|"):
            break
    return out


def contradictions(repo: Path, stated: dict[str, int]) -> list[str]:
    """Every shard count a page states that names no single preset or differs from it."""
    found = []
    for page in pages(repo):
        own = page.stem if page.parent.name == "experiment" else None
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for m in COUNT.finditer(line):
                value = int(next(g for g in m.groups() if g is not None))
                named = {own} if own else set(PRESET.findall(line))
                where = f"{page.relative_to(repo)}:{n}: {m.group(0)!r}"
                if len(named) != 1:
                    found.append(f"{where} names no single preset (use --for experiment=NAME)")
                elif (name := named.pop()) not in stated:
                    found.append(f"{where} for {name}, which states no data.fineweb_shards")
                elif value != stated[name]:
                    found.append(f"{where}, but {name} has data.fineweb_shards={stated[name]}")
    return found


def test_the_table_lists_every_count() -> None:
    assert table(REPO) == counts(), f"docs/data.md's table {TABLE!r} against the presets"


def test_no_page_contradicts_the_presets() -> None:
    assert contradictions(REPO, counts()) == []


def test_a_missing_fineweb_names_the_command(tmp_path: Path) -> None:
    conf = preset("record_2025_01_26").data
    conf.dir = str(tmp_path / "fineweb")
    cmd = f"python -m data.corpus.fineweb --train-shards 7 --dir {conf.dir}"
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"fineweb_shards=7): fetch them with {cmd}")
    ):
        find_shards(conf)
    Path(conf.dir).mkdir()
    rng = np.random.default_rng(0)
    for name in fineweb.shard_names(3):
        write_shard(Path(conf.dir) / name, rng.integers(0, 50257, size=100))
    lacks = "lacks 4 FineWeb training shard(s) (fineweb_train_000004.bin ... fineweb_train_000007"
    with pytest.raises(FileNotFoundError, match=re.escape(lacks) + ".*" + re.escape(cmd)):
        find_shards(conf)
    conf.fineweb_shards = 3  # what is there, on purpose
    assert len(find_shards(conf).train) == 3
