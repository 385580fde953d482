"""The `model.bigram` section: the bigram-hash embedding (record_2026_07_17, #62, sign trick #83),
the part `BigramHash` of model/bigram.py. Its formulas are that module's docstring."""

import math
from dataclasses import dataclass, field

from model.config.param_optim import ParamOptim

POSITION1 = ("token", "reserved_row")


@dataclass
class BigramOptim:
    """The Adam settings of the part's parameters (record_2026_07_17's D.3 rows), declared on them
    by the part: the optimizer reads them there, not from a table of names."""

    embed: ParamOptim = field(default_factory=ParamOptim)
    """The table Bg (an embedding: Adam's embed group)."""
    lambdas: ParamOptim = field(default_factory=ParamOptim)
    """λ^bg (Adam's scalar group)."""


@dataclass
class BigramConfig:
    rows: int = 0
    """Rows R of the table `bigram.embed` (record_2026_07_17, #62: 754,560); 0 = off. Token t ≥ 1 of
    a row reads row ((36,313·x_t) XOR (27,191·x_(t−1))) mod (R − 1), token 0 the last row;
    the term b is added to the stream's first `dim` channels."""
    dim: int = 192
    """Channels k of the table and of the stream it is added to (record_2026_07_17: 192); at most
    model.n_embd."""
    signs: int = 0
    """Rows N of the fixed ±1 sign table `bigram.signs` (#83, record_2026_07_17: 8,192): b_t =
    Bg[h_t] ⊙ S[(x_(t−1) XOR x_t) mod N]; 0 = no sign table (the #62 form)."""
    position1: str = field(default="token", metadata={"choices": POSITION1})
    """What token 1's hash reads as its predecessor: "token" = x_0, as every later token
    reads its own; "reserved_row" = the reserved row (R − 1), its product with 27,191
    wrapped in int32, as record #89's code computes."""
    lambda_init: float = 0.05
    """The initial λ^bg of every layer (record_2026_07_17, #74: 0.05): the (n_layer,) fp32
    `bigram.lambdas` scale the term added to x0 (λ^bg_0) and after the attention of each
    later layer with attention (λ^bg_ℓ), cast to the stream's dtype."""
    in_x0: bool = False
    """The layer-0 term is part of x0 itself, so every later read of x0 (the x0 injections and
    shortcut, the skip gate) sees it: record_2026_07_17's in-place add (#83). Off: only the stream
    gets it and x0 stays RMSNorm(e′) (the #62/#74 form)."""
    optim: BigramOptim = field(default_factory=BigramOptim)

    def validate(self, n_embd: int) -> None:
        if self.rows < 0 or self.rows == 1:
            raise ValueError(
                f"model.bigram.rows must be 0 (off) or at least 2 (the last row is the first "
                f"token's), got {self.rows}"
            )
        if self.signs < 0:
            raise ValueError(f"model.bigram.signs must be >= 0, got {self.signs}")
        if not math.isfinite(self.lambda_init):
            raise ValueError(f"model.bigram.lambda_init must be finite, got {self.lambda_init}")
        if not self.rows:
            for key, off in (("signs", 0), ("in_x0", False)):
                if getattr(self, key) != off:
                    raise ValueError(
                        f"model.bigram.{key} belongs to the bigram table: set model.bigram.rows"
                    )
            return
        if self.position1 not in POSITION1:
            raise ValueError(
                f"model.bigram.position1 must be one of {POSITION1}, got {self.position1!r}"
            )
        if not 0 < self.dim <= n_embd:
            raise ValueError(
                f"model.bigram.dim must be between 1 and model.n_embd ({n_embd}), got {self.dim}"
            )
        self.optim.embed.validate("model.bigram.optim.embed")
        self.optim.lambdas.validate("model.bigram.optim.lambdas")
