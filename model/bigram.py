"""The bigram-hash embedding (record_2026_07_17, D.1 forward step 2; #62, sign trick #83): a term b
per token from a hash of the token and its predecessor, added to the stream's first k
channels (model.bigram: rows, dim = k, signs; model/config/bigram.py).

For each row x_0 … x_(T−1) of the batch (the record's rank sequence: the hash restarts at
every row's start, ignores document boundaries, and is the same in evaluation), with R rows
of the table Bg and N rows of the sign table S:

    h_0 = R − 1                                              the reserved last row
    h_t = ((36,313·x_t) XOR (27,191·x_(t−1))) mod (R − 1)    t ≥ 2, and t = 1 with
                                                             bigram.position1=token
    σ_0 = 0,   σ_t = (x_(t−1) XOR x_t) mod N                 t ≥ 1 (N = 0: S ≡ +1)
    b_t = Bg[h_t] ⊙ S[σ_t]                                   (k channels)

The record hashes in int32, whose products cannot overflow for ids below ⌊(2³¹ − 1)/36,313⌋
= 59,137 (GPT-2's 50,304 included). Here the hash runs in int64: for such ids every product,
XOR and remainder is the same non-negative integer in both widths, so the rows are the
record's; larger ids (which would overflow the record's int32) stay exact.

Position 1 with bigram.position1=reserved_row is the record's own quirk (record #89):
it writes h_0 into its output buffer and then hashes positions 1… from that buffer, so
x_0 is read as R − 1 there, and 27,191·(R − 1) wraps in int32 before the XOR:

    h_1 = ((36,313·x_1) XOR wrap32(27,191·(R − 1))) mod (R − 1)     (floor modulo)

In int64 the same value comes out: XOR commutes with sign extension, and torch's `%` on
int32 is floor modulo as it is on int64. σ_1 still reads the real x_0.

Where b enters the stream (model/residual.py `inject_bigram`, λ^bg the part's (n_layer,)
fp32 `bigram.lambdas`, cast to the stream's dtype):

    x = x0 + λ^bg_0·b        before layer 0, into x0 as well with bigram.in_x0
    x <- x + λ^bg_ℓ·b        after the attention sublayer (and its x0 injection) of each
                             layer ℓ ≥ 1 with attention; layers without attention add nothing

The part is the model's `bigram` (`BigramHash`). Bg (`bigram.embed`, an nn.Embedding, so
Adam's embedding group) starts at zero, so the part starts as the identity. S
(`bigram.signs`, a buffer: state, saved in checkpoints, not trained) holds the signs of a
N(0, 1) draw from the CPU default generator, in the model's dtype; λ^bg starts at
bigram.lambda_init.
"""

import torch
from torch import Tensor, nn

from model.config import ModelConfig
from model.context import Context
from model.layers import declare
from model.part import Part
from model.residual import inject_bigram

HASH_CURRENT = 36_313  # the record's multiplier of x_t
HASH_PREVIOUS = 27_191  # the record's multiplier of x_(t−1)


def wrap32(value: int) -> int:
    """`value` as a two's-complement int32 holds it (the record's product overflows)."""
    return (value + 2**31) % 2**32 - 2**31


def bigram_indices(
    idx: Tensor, rows: int, signs: int, position1: str = "token"
) -> tuple[Tensor, Tensor | None]:
    """(h, σ) for token ids `idx` (B, T), each (B, T) int64 (module docstring); σ is None
    when `signs` is 0. `position1` is model.bigram.position1."""
    x = idx.long()
    cur, prev = x[:, 1:], x[:, :-1]
    first = torch.full_like(x[:, :1], rows - 1)
    mixed = HASH_PREVIOUS * prev
    if position1 == "reserved_row" and mixed.shape[1]:
        mixed[:, 0] = wrap32(HASH_PREVIOUS * (rows - 1))
    hashed = torch.bitwise_xor(HASH_CURRENT * cur, mixed) % (rows - 1)
    h = torch.cat([first, hashed], 1)
    if not signs:
        return h, None
    return h, torch.cat([torch.zeros_like(first), torch.bitwise_xor(prev, cur) % signs], 1)


class BigramHash(Part):
    """The part, built only when model.bigram.rows > 0: `embed` (rows × k), the table
    Bg; `signs` (signs × k), the buffer S, where bigram.signs > 0; `lambdas`
    (n_layer,) fp32, λ^bg. Drawn by `reset`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bg = self.cfg = cfg.bigram
        # `_weight` skips nn.Embedding's own N(0, 1) draw: the table starts at zero anyway,
        # and the other parameters' draws stay those of the model without the part.
        table = torch.zeros(bg.rows, bg.dim)
        self.embed = nn.Embedding(bg.rows, bg.dim, _weight=table)
        signs = None  # a None buffer: no S, and none in the state_dict
        if bg.signs:
            dtype = torch.bfloat16 if cfg.numerics.dtype == "bf16" else torch.float32
            signs = torch.ones(bg.signs, bg.dim, dtype=dtype)
        self.register_buffer("signs", signs)  # persistent: state, not trained
        self.lambdas = nn.Parameter(torch.empty(cfg.n_layer))
        # Each parameter's role and Adam settings travel with it (model/config/param_optim.py)
        declare(self.embed.weight, "embed", bg.optim.embed)
        declare(self.lambdas, "scalar", bg.optim.lambdas)

    @torch.no_grad()
    def reset(self) -> None:
        """Bg zero, λ^bg at its initial value, S the signs of a fresh N(0, 1) draw (CPU
        default generator, whatever device S is on)."""
        self.embed.weight.zero_()
        self.lambdas.fill_(self.cfg.lambda_init)
        if self.signs is not None:
            z = torch.randn(self.signs.shape)
            # ±1 even for a draw of exactly 0 (where sign() would give 0); otherwise sign(z).
            self.signs.copy_(torch.where(z < 0, -1.0, 1.0))

    def term(self, idx: Tensor) -> Tensor:
        """b (B, T, k) for `idx` (B, T), in the table's dtype."""
        bg = self.cfg
        h, sigma = bigram_indices(idx, bg.rows, bg.signs, bg.position1)
        b = self.embed(h)  # through the module, so FSDP gathers the table
        # ±1 is exact in any dtype: S meets b in b's (FSDP may gather Bg in another than S's)
        return b if sigma is None else b * self.signs[sigma].to(b.dtype)

    def start(self, idx: Tensor, x0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(x, x0, b) from x0 = RMSNorm(e′): the stream's start x = x0 + λ^bg_0·b; x0 that
        same tensor with model.bigram.in_x0 (the record's in-place add, done out of
        place), else as given; b for the later layers."""
        b = self.term(idx)
        x = inject_bigram(x0, b, self.lambdas[0])
        return x, x if self.cfg.in_x0 else x0, b

    def fsdp_units(self) -> list[nn.Module]:
        """Its table is a unit of its own, as the token table is."""
        return [self.embed]

    def cast_bf16(self) -> None:
        """Its table is bf16 as the token table (the gains stay fp32)."""
        self.embed.to(torch.bfloat16)

    def after_attention(self, x: Tensor, ctx: Context, layer: int) -> Tensor:
        """Its point (model/points.py): x + λ^bg_ℓ·b after layer ℓ's attention, for ℓ ≥ 1
        (layer 0's is in x from the start, `start`)."""
        if layer == 0:
            return x
        return inject_bigram(x, ctx.bigram_term, self.lambdas[layer])
