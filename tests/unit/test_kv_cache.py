"""The KV cache (model/kv_cache.py) against the whole context: a forward over the new tokens
beside the cache gives the logits the whole sequence's forward gives at those positions,
documents and per-position parts included; the last position's logits alone are the whole
forward's last row; sampling with the cache draws the tokens sampling without it draws, past
the context's end too; what the cache cannot serve is refused by name."""

import itertools

import pytest
import torch

from model import GPT, ModelConfig
from model.config import update
from model.kv_cache import KVCache, blockers
from model.masks import EOT
from scripts.sample import generate
from tests.helpers import compose_config
from trainer.config import to_config

TINY = ModelConfig(n_layer=3, n_head=2, n_embd=32, vocab_size=50304)


def model_of(cfg: ModelConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    with torch.no_grad():  # zero-initialised projections would hide a wrong key or value
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def tokens(n: int, seed: int, eot_at: tuple[int, ...] = ()) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, EOT, (2, n), generator=g)
    idx[:, list(eot_at)] = EOT
    return idx


def chunked(model: GPT, idx: torch.Tensor, cuts: list[int]) -> torch.Tensor:
    """The logits of every position, from forwards over the chunks idx[:, a:b] beside one
    cache."""
    cache = KVCache(idx.size(1), model.cfg.attention.document_mask)
    edges = [0, *cuts, idx.size(1)]
    with torch.no_grad():
        return torch.cat([model(idx[:, a:b], cache=cache) for a, b in itertools.pairwise(edges)], 1)


@pytest.mark.parametrize(
    ("name", "cfg", "eot_at"),
    [
        ("default model", TINY, ()),
        ("documents masked", update(TINY, {"attention.document_mask": True}), (0, 7, 8, 15)),
    ],
)
def test_the_cached_forward_gives_the_whole_contexts_logits(name, cfg, eot_at) -> None:
    model, idx = model_of(cfg), tokens(20, 1, eot_at)
    with torch.no_grad():
        whole = model(idx)
    got = chunked(model, idx, [6, *range(7, 20)])  # a prompt of 6, then one token at a time
    torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-5)


def test_a_records_per_position_parts_are_served() -> None:
    """Record #21's model (value embeddings, U-net skips, x0 mix, the bf16 head and its
    softcap) at toy size, its windows off: the cache serves it."""
    conf = to_config(compose_config([
        "experiment=record_2025_01_26", "size=toy", "run_dir=.", "model.attention.window=",
        "model.attention.window_tokens=0",
        "model.numerics.dtype=fp32", "model.head.bf16=false", "model.head.fp8=false",
    ]))  # fmt: skip
    assert not blockers(conf.model)
    model, idx = model_of(conf.model, seed=3), tokens(12, 2, (0, 5))
    with torch.no_grad():
        whole = model(idx)
    torch.testing.assert_close(chunked(model, idx, [4, 8, 9]), whole, rtol=1e-5, atol=1e-5)


def test_last_gives_the_last_row_of_the_logits() -> None:
    model, idx = model_of(TINY), tokens(9, 3)
    with torch.no_grad():
        whole, last = model(idx), model(idx, last=True)
    assert last.shape == (2, 1, whole.size(-1))
    torch.testing.assert_close(last, whole[:, -1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("top_k", [1, 50])
def test_sampling_with_the_cache_draws_what_sampling_without_it_draws(top_k: int) -> None:
    """30 new tokens after a 5-token prompt with a context of 16: the cache fills, then each
    token reruns the cropped context, as without the cache throughout."""
    model, prompt = model_of(TINY), tokens(5, 4)[:1]

    def run(cached: bool) -> torch.Tensor:
        g = torch.Generator().manual_seed(7)
        return generate(model, prompt, 30, 1.0, top_k, g, 16, {}, cached)

    assert torch.equal(run(True), run(False))


def test_what_the_cache_cannot_serve_is_refused_by_name() -> None:
    conf = to_config(compose_config(["experiment=record_2026_07_17", "size=toy", "run_dir=."]))
    found = blockers(conf.model)
    assert {"model.attention.window", "model.attention.paired", "model.bigram.rows"} <= set(found)
    model = GPT(conf.model, conf.train.stages).eval()
    with pytest.raises(ValueError, match=r"a KV cache cannot serve this model: model\.attention"):
        model(tokens(4, 5), cache=KVCache(8))


def test_a_full_cache_says_so() -> None:
    model, cache = model_of(TINY), KVCache(8)
    with torch.no_grad():
        model(tokens(6, 6), cache=cache)
        with pytest.raises(ValueError, match="holds 8 positions: 6 cached \\+ 3 new"):
            model(tokens(3, 6), cache=cache)
