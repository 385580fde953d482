"""Typed configuration of the GPT (the `model` config group).

The top-level fields are the dense GPT every run has; the speedrun records' options sit in
groups by what they configure, each off by default, so a config that sets none of them
builds exactly the same model, parameter for parameter and bit for bit:

    model.attention   kind, merged weights, gates, masks, rotary and YaRN, sliding windows
    model.embed       the token and value embedding tables, the smear
    model.residual    the x0 shortcut, skips, backout, per-sublayer scales
    model.mlp         which layers have an MLP, C_fc's and C_proj's layout, FP8 projections
    model.head        softcap, loss form, reduction and dtype, MTP, FP8 and bf16 head
    model.numerics    the model's dtype, the FP8 head's scales, packed scalars
    model.bigram      the bigram-hash embedding: a mechanism with its own section
                      (model/config/bigram.py), its parameters' optimizer settings included

Per-layer options (`attention.window`, `embed.value_embeds`, `attention.layers`,
`mlp.layers`) are patterns over the layers of a reference depth, one character per layer,
resampled to `n_layer` (`model/plan.py`). A key of the former flat schema (`model.attention.window`)
fails with one line naming its group (`model/config/moved.py`), and an option value once named
after a record (`model.head.loss=record_2026_07`) with one line naming today's value
(`model/config/renamed.py`).

What changes by stage (the long window, the MTP weights) is no model key: it is a column of
the run's stage table, train.stages (stages/table.py). The config carries no table: the model
is handed it when built (`GPT(cfg, stages)`, for its YaRN tables) and the run's schedule reads
each step's row from it (model/forward_schedule.py).
"""

import copy
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from model.config.across import validate_across_groups
from model.config.attention import AttentionConfig
from model.config.bigram import BigramConfig
from model.config.head import HeadConfig
from model.config.moved import MOVED, moved_key, moved_message
from model.config.numerics import NumericsConfig
from model.config.stream import EmbedConfig, MlpConfig, ResidualConfig
from stages.moved import moved_message as stage_moved_message
from stages.moved import moved_within

OPERATIONAL = {"resume": "operational"}  # how a checkpoint treats a field (trainer/config.py)

__all__ = [
    "AttentionConfig",
    "BigramConfig",
    "EmbedConfig",
    "HeadConfig",
    "MlpConfig",
    "ModelConfig",
    "NumericsConfig",
    "ResidualConfig",
    "update",
]


@dataclass
class ModelConfig:
    """The `model` group. Every field must match on resume (it decides which tensors exist),
    except those marked operational."""

    n_layer: int = 4
    """Transformer blocks."""
    n_head: int = 2
    """Attention heads per block."""
    n_embd: int = 128
    """Residual stream width; head_dim = n_embd // n_head."""
    vocab_size: int = 50304
    """Logits of the head: GPT-2's 50257 padded to a multiple of 128 for fast matmuls."""
    init_std: float = 1.0
    """Hidden linear weights ~ U(±√3·init_std/√fan_in): 1/√3 is PyTorch's default (the
    2024-11 record), 0.5 the 2025-01 record's."""
    gate_channels: int = 12
    """k: the leading channels of the stream that the attention and smear gates read."""
    compile: bool = field(default=False, metadata=OPERATIONAL)
    """torch.compile the model, with static shapes (trainer/launch/compile.py)."""
    compile_backend: str = field(default="inductor", metadata=OPERATIONAL)
    """torch.compile backend: inductor generates kernels; eager and aot_eager only trace."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    residual: ResidualConfig = field(default_factory=ResidualConfig)
    mlp: MlpConfig = field(default_factory=MlpConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    numerics: NumericsConfig = field(default_factory=NumericsConfig)
    bigram: BigramConfig = field(default_factory=BigramConfig)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the config lacks: a key of the flat schema names its group.
        if moved_within(f"model.{name}"):
            raise AttributeError(stage_moved_message(f"model.{name}"))
        if name in MOVED:
            raise AttributeError(moved_message(name))
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def differs_per_layer(self) -> bool:
        """Whether layers differ (windows, value embeddings, MLP-only layers, skips)."""
        r = self.residual
        return bool(
            self.attention.window or self.embed.value_embeds or self.attention.layers
            or self.attention.xsa or self.attention.paired
            or self.mlp.layers or r.unet or bool(r.skips) or r.backout_layer >= 0
        )  # fmt: skip

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self) -> None:
        """Raise ValueError naming the `model.*` key that is wrong."""
        for key in ("n_layer", "n_head", "n_embd", "vocab_size", "init_std"):
            if getattr(self, key) <= 0:
                raise ValueError(f"model.{key} must be positive, got {getattr(self, key)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"head dim model.n_embd / model.n_head = {self.head_dim} must be even "
                "(rotary embeddings rotate pairs of channels)"
            )
        if self.vocab_size < 50257:
            raise ValueError(
                f"model.vocab_size ({self.vocab_size}) must hold the GPT-2 vocabulary (50257)"
            )
        self.attention.validate(self.head_dim)
        self.embed.validate(self.vocab_size)
        self.residual.validate(self.n_layer)
        self.mlp.validate()
        self.head.validate()
        self.numerics.validate()
        if self.compile:
            import torch._dynamo  # here, not at import: a config module stays light

            backends = torch._dynamo.list_backends(exclude_tags=())
            if self.compile_backend not in backends:
                raise ValueError(
                    f"model.compile_backend={self.compile_backend!r} is not a torch.compile "
                    f"backend; use inductor, or eager / aot_eager to trace without kernels"
                )
        validate_across_groups(self)
        self.bigram.validate(self.n_embd)


def update(cfg: Any, changes: dict[str, Any]) -> Any:
    """A copy of the config dataclass `cfg` with `changes` set, keys dotted as on the command
    line ({"attention.window": "LS", "n_layer": 2}); `cfg` is left as it was."""
    out = copy.deepcopy(cfg)
    for key, value in changes.items():
        node, parts = out, key.split(".")
        for part in parts[:-1]:
            node = getattr(node, part)
        if not (is_dataclass(node) and parts[-1] in {f.name for f in fields(node)}):
            hint = moved_message(key) if moved_key(key) else f"no key {key!r}"
            if moved_within(f"model.{key}"):
                hint = stage_moved_message(f"model.{key}")
            raise AttributeError(f"{type(cfg).__name__}: {hint}")
        setattr(node, parts[-1], value)
    return out
