"""`python -m data.corpus.prepare` against a direct tiktoken encode of the same documents."""

import json
from pathlib import Path

import numpy as np
import pytest

from data.corpus import prepare as prep
from data.corpus import shard_writer
from data.corpus.split import is_val
from data.token_shards import load_shard
from data.tokenizer import EOT, gpt2_encoding

REPO = Path(__file__).resolve().parents[2]

# Documents with the cases tokenizers get wrong: unicode, a literal special token, whitespace.
DOCS = [
    f"Document {i}: the quick brown fox, naïve café, 東京, emoji 🙂. <|endoftext|> is text here. "
    + "More words follow in this one. " * (i % 7 + 1)
    for i in range(40)
]


def expected_stream(docs: list[str]) -> np.ndarray:
    enc = gpt2_encoding()
    return np.concatenate([[EOT, *enc.encode_ordinary(d)] for d in docs]).astype(np.uint16)


def write_inputs(tmp: Path, kind: str, docs: list[str] = DOCS, field: str = "text") -> list[str]:
    tmp.mkdir(parents=True, exist_ok=True)
    if kind == "txt":
        paths = [tmp / f"doc{i:03d}.txt" for i in range(len(docs))]
        for p, d in zip(paths, docs, strict=True):
            p.write_text(d, encoding="utf-8")
        return [str(p) for p in paths]
    if kind == "jsonl":
        path = tmp / "docs.jsonl"
        path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
        return [str(path)]
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp / "docs.parquet"
    pq.write_table(pa.table({field: docs, "id": list(range(len(docs)))}), path)
    return [str(path)]


def shard_stream(out: Path, pattern: str = "corpus_*.bin") -> np.ndarray:
    """All shards' tokens in stream order: val_000000 first, then train_000001, ..."""
    files = sorted(out.glob(pattern), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    return np.concatenate([load_shard(f) for f in files])


def run_prepare(tmp: Path, files: list[str], out: Path, **kw) -> dict:
    spec = prep.Spec(files=tuple(files), shard_tokens=kw.pop("shard_tokens", 500), **kw)
    # seq_len 64: these small shards must each hold one sequence of it (not the default 256)
    return prep.prepare(spec, out, cache_dir=str(tmp / "hf-cache"), progress=False, seq_len=64)


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_tokens_equal_a_direct_encode(tmp_path: Path, kind: str) -> None:
    files = write_inputs(tmp_path / "in", kind)
    summary = run_prepare(tmp_path, files, tmp_path / "out")
    want = expected_stream(DOCS)
    assert summary["tokens"] == len(want) == sum(len(gpt2_encoding().encode_ordinary(d)) + 1
                                                for d in DOCS)  # fmt: skip
    assert np.array_equal(shard_stream(tmp_path / "out"), want)
    names = summary["shards"]
    assert names[0] == "corpus_val_000000.bin" and names[1] == "corpus_train_000001.bin"
    assert all(len(load_shard(tmp_path / "out" / n)) == 500 for n in names[:-1])


def test_val_fraction_holds_out_whole_documents(tmp_path: Path) -> None:
    files = write_inputs(tmp_path / "in", "parquet")
    summary = run_prepare(tmp_path, files, tmp_path / "out", val_fraction=0.25)
    val_docs = [d for i, d in enumerate(DOCS) if is_val(i, 0.25)]
    train_docs = [d for i, d in enumerate(DOCS) if not is_val(i, 0.25)]
    assert len(val_docs) == 10
    out = tmp_path / "out"
    assert np.array_equal(shard_stream(out, "corpus_val_*.bin"), expected_stream(val_docs))
    assert np.array_equal(shard_stream(out, "corpus_train_*.bin"), expected_stream(train_docs))
    assert summary["val_tokens"] == len(expected_stream(val_docs))
    assert sorted(out.glob("corpus_train_*.bin"))[0].name == "corpus_train_000001.bin"


def test_an_interrupted_run_resumes_to_the_same_shards(tmp_path: Path, monkeypatch) -> None:
    files = write_inputs(tmp_path / "in", "jsonl")
    run_prepare(tmp_path, files, tmp_path / "ref", val_fraction=0.2, shard_tokens=300)
    want = {p.name: p.read_bytes() for p in (tmp_path / "ref").glob("*.bin")}

    real, writes = shard_writer.write_shard, []

    def dies_on_the_fourth(path, tokens) -> None:
        writes.append(Path(path).name)
        if len(writes) == 4:
            Path(path).with_suffix(".partial").write_bytes(b"x")  # debris of a killed write
            raise KeyboardInterrupt
        real(path, tokens)

    monkeypatch.setattr(shard_writer, "write_shard", dies_on_the_fourth)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_prepare(tmp_path, files, out, val_fraction=0.2, shard_tokens=300)
    first = list(writes)
    writes.clear()

    def logged(path, tokens) -> None:
        writes.append(Path(path).name)
        real(path, tokens)

    monkeypatch.setattr(shard_writer, "write_shard", logged)
    run_prepare(tmp_path, files, out, val_fraction=0.2, shard_tokens=300)
    assert {p.name: p.read_bytes() for p in out.glob("*.bin")} == want
    assert not set(first[:3]) & set(writes), "finished shards were written again"
    assert len(writes) == len(want) - 3
    writes.clear()
    run_prepare(tmp_path, files, out, val_fraction=0.2, shard_tokens=300)
    assert writes == [], "a complete output is left alone"


def test_changed_settings_on_an_existing_output_are_refused(tmp_path: Path) -> None:
    files = write_inputs(tmp_path / "in", "jsonl")
    run_prepare(tmp_path, files, tmp_path / "out")
    with pytest.raises(prep.PrepareError, match="shard_tokens differ"):
        run_prepare(tmp_path, files, tmp_path / "out", shard_tokens=400)


def test_a_hub_style_dataset_directory(tmp_path: Path) -> None:
    """--dataset goes through datasets.load_dataset(name), the hub path, on a local repo."""
    repo = tmp_path / "my-dataset"
    write_inputs(repo / "data", "parquet", field="content")
    spec = prep.Spec(dataset=str(repo), text_field="content", shard_tokens=500)
    prep.prepare(spec, tmp_path / "out", cache_dir=str(tmp_path / "hf"), progress=False,
                 seq_len=64)  # fmt: skip
    assert np.array_equal(shard_stream(tmp_path / "out"), expected_stream(DOCS))


def test_missing_text_field_names_it_and_the_columns(tmp_path: Path) -> None:
    files = write_inputs(tmp_path / "in", "jsonl", field="body")
    with pytest.raises(prep.PrepareError, match=r"--text-field 'text'.*\['body', 'id'\]"):
        run_prepare(tmp_path, files, tmp_path / "out")


def test_empty_input_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(prep.PrepareError, match=r"no documents|failed"):
        run_prepare(tmp_path, [str(tmp_path / "empty.jsonl")], tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.bin"))


def test_too_little_text_for_val_and_train(tmp_path: Path) -> None:
    files = write_inputs(tmp_path / "in", "jsonl", docs=DOCS[:2])
    with pytest.raises(prep.PrepareError, match="too little text"):
        run_prepare(tmp_path, files, tmp_path / "out", shard_tokens=10_000)


def test_non_utf8_files_fail_or_are_skipped_and_counted(tmp_path: Path) -> None:
    files = write_inputs(tmp_path / "in", "txt", docs=DOCS[:10])
    Path(files[3]).write_bytes(b"caf\xe9 latin-1 text")
    with pytest.raises(prep.PrepareError, match=r"1 file\(s\) are not UTF-8: .*doc003\.txt "
                       r"\(byte 0xe9 at offset 3\).*--bad-utf8 skip"):  # fmt: skip
        run_prepare(tmp_path, files, tmp_path / "a")
    summary = run_prepare(tmp_path, files, tmp_path / "b", bad_utf8="skip", shard_tokens=100)
    assert [s.split(" (")[0] for s in summary["skipped_files_not_utf8"]] == [files[3]]
    kept = [d for i, d in enumerate(DOCS[:10]) if i != 3]
    assert np.array_equal(shard_stream(tmp_path / "b"), expected_stream(kept))


def test_documents_without_text_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    rows = [{"text": d} for d in DOCS[:6]] + [{"text": None}, {"other": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = run_prepare(tmp_path, [str(path)], tmp_path / "out", shard_tokens=100)
    assert summary["skipped_documents_not_text"] == 2
    assert np.array_equal(shard_stream(tmp_path / "out"), expected_stream(DOCS[:6]))
