"""Offline corpus tools: text in, token shards out (never imported by a training step).

    python -m data.corpus.fineweb --for experiment=NAME  the FineWeb10B shards a preset reads
    python -m data.corpus.prepare --files ... --out DIR  any corpus to GPT-2 token shards

`sample.py` builds the embedded Wikipedia sample (cleaned by `wikitext.py`) on first use;
`split.py` is the one rule for holding documents out for validation; `shard_writer.py` cuts
prepare's streams into shards (resumably), `hub.py` checks the hub can be reached at all.
"""
