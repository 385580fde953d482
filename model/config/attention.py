"""`model.attention`: what each attention layer computes and over which keys.

Per-layer options (`layers`, `window`) are patterns over the layers of a reference depth, one
character per layer, resampled to `model.n_layer` (`model/plan.py`). The window's schedules
(by stage, or linear) are `model/window_schedule.py`'s; the windows by stage are the run's
stage table's (train.stages), which the model is handed when built and the run's schedule
reads (model/forward_schedule.py, whose `check_stages` checks these keys against it).
"""

from dataclasses import dataclass, field

from stages.moved import refuse_moved

ROPES = ("full", "half_truncated", "interleaved_half")
VALUE_RESIDUALS = ("off", "fixed", "learned")
IMPLS = ("auto", "sdpa", "flex", "varlen")
WINDOW_GRANULARITIES = ("block", "token")
OUT_INITS = ("zero", "uniform")


@refuse_moved("model.attention")
@dataclass
class AttentionConfig:
    """The `model.attention` group."""

    layers: str = ""
    """Per-layer pattern: "A" attention, "." MLP only; "" = all attention."""
    impl: str = field(default="auto", metadata={"choices": IMPLS})
    """The kernel behind document / window masks: sdpa (a dense mask) | flex (FlexAttention
    over block masks) | varlen (a varlen flash kernel over the documents as segments, CUDA and
    a torch whose torch.nn.attention.varlen_attn takes window_size; token windows or none;
    model/varlen.py) | auto: flex on CUDA, sdpa elsewhere."""
    max_segments: int = 1024
    """impl=varlen: the most segments (the row's start, each document in it) one row may hold,
    in evaluation and in training stages without train.stages.rows.N.max_pieces (with it,
    max_pieces); the kernel's cu_seqlens has rows × this + 1 entries. More fail on the device;
    room left over costs the kernel empty segments."""
    scale: float = 0.0
    """softmax(scale · q·kᵀ); 0 = 1/√head_dim."""
    qk_norm: bool = True
    """RMS-normalise each head's q and k before rotary, which bounds the attention logits."""
    merged_qkv: bool = False
    """One 3 × d × d parameter for q, k, v (Muon per slice)."""
    merged_qkvo: bool = False
    """One (4, d, d) parameter for W_q, W_k, W_v, W_o (each (out, in); Muon per slice)."""
    weight_lambdas: bool = False
    """record_2026_07_17's (λ⁰, λ¹) per layer (#47, #48): q, k, v = u·(λ⁰·W_qkv)ᵀ and out =
    y·(λ¹·W_o)ᵀ, the scalar multiplying the weight (in its dtype), from (0.5, 1). In the packed
    vector with model.numerics.scalars_layout=weight_lambdas, else each attention's
    `weight_lambdas`."""
    init_std: float = 0.0
    """W_q, W_k, W_v (and W_o with out_init=uniform) ~ U(±√3·init_std/√d); 0 = model.init_std,
    as C_fc (record_medium_2025_12_31, #53: 1, std 1/√d, beside C_fc's 0.5)."""
    out_init: str = field(default="zero", metadata={"choices": OUT_INITS})
    """W_o at initialisation: zero (each block starts as the identity) | uniform (record_2026_07_17,
    #64: drawn like W_q, W_k, W_v)."""
    gate: bool = False
    """Per-head output gate y_h <- y_h·σ(u[:k]·G[h]ᵀ), G (heads × k) zero-init, k =
    model.gate_channels."""
    document_mask: bool = False
    """Attend within a document only (documents start at EOT)."""
    value_residual: str = field(default="off", metadata={"choices": VALUE_RESIDUALS})
    """v ← (1−λ)·v + λ·v₁ with v₁ block 0's raw values: off | fixed λ | learned λ per block."""
    value_residual_lambda: float = 0.5
    """λ, or its initial value when learned."""
    key_offset: bool = False
    """In the long-window layers, after rotary: k_t[c] <- k_(t−1)[c] for t ≥ 1 (the previous
    position of the packed sequence, across documents too), the un-shifted values, on the
    channels c the rotary leaves unrotated (#49): with interleaved_half 64–127 of 128
    (record_2026_07_17), with half_truncated 32–63 and 96–127 (record_medium_2025_12_31); needs
    a rope other than full."""
    xsa: str = ""
    """Per-layer pattern: "X" learnable XSA, "." none; "" = none (record_2026_07_17: ".X.XX..XX.X").
    y_h <- y_h − tanh(α_h)·⟨y_h, v̂_h⟩·v̂_h after attention, v̂ = v/max(‖v‖, 10⁻⁴) per head and
    token, α (n_layer × n_head, `xsa.alphas`) from 0 (model/xsa.py)."""
    paired: str = ""
    """Per-layer pattern: "P" paired-head attention, "." normal; "" = none (record_2026_07_17:
    "P.P..P...P."). Head h and head h + H/2 share a slot over 2T positions (h at 2t for h < H/2,
    else 2t+1), rotated at position 2t + (h mod 2), the window counted in those positions;
    no key offset, no XSA; needs an even model.n_head (model/paired.py)."""
    # --- rotary ---------------------------------------------------------------------------
    rope: str = field(default="full", metadata={"choices": ROPES})
    """full: base rope_base on every dim | half_truncated: 32 frequencies 1 … 1/1024 on the
    first half of each half-head, 0 on the rest | interleaved_half (record_2026_07_17): the same
    frequencies on adjacent pairs (2j, 2j+1) of the first half of the head, the second half
    static (model/rotary.py)."""
    rope_base: float = 10000.0
    """Rotary base (wavelength scale), rope=full."""
    rope_bf16: bool = False
    """Round the cos/sin tables to bf16 and rotate in bf16 (2024-11)."""
    rope_reciprocal: bool = False
    """rope=full frequencies as 1 / base^(2i/d), the records' rounding, not base^(−2i/d)."""
    yarn: bool = False
    """YaRN: at every change of the long window by stage (train.stages.rows.N.window) the
    rotary frequencies are rescaled and the attention scale raised (model/yarn.py); the
    forward takes the stage (model/forward_schedule.py)."""
    yarn_max_window: int = 0
    """YaRN rescales only at changes to a long window of at most this many blocks; a change to a
    longer one keeps the frequencies and the scale as they are (record_medium_2025_12_31: 13, so its
    windows 15 … 23 and the final evaluation's 27 apply none). 0 = every change."""
    # --- sliding windows ------------------------------------------------------------------
    window: str = ""
    """Sliding-window attention, per-layer pattern: "L" long window, "S" short (half);
    "" = no window (all of the past)."""
    window_block: int = 128
    """The window moves in blocks of this many tokens."""
    window_granularity: str = field(default="block", metadata={"choices": WINDOW_GRANULARITIES})
    """block: the window is whole blocks of window_block tokens | token: query i sees keys j
    with i − j ≤ W tokens (W + 1 keys), long W = window_tokens, short W = short_window_tokens."""
    window_tokens: int = 0
    """The long window at the last step, in tokens, growing linearly from 1 token with the
    step (model/forward_schedule.py), rounded up to whole blocks; 0 = no window, or the window
    by stage (train.stages.rows.N.window)."""

    def validate(self, head_dim: int) -> None:
        """Raise ValueError naming the `model.attention.*` key that is wrong."""
        if self.rope != "full" and head_dim % 4 != 0:
            raise ValueError(
                f"model.attention.rope={self.rope} needs a head dim divisible by 4, got {head_dim}"
            )
        if self.key_offset and self.rope == "full":
            raise ValueError(
                "model.attention.key_offset shifts the key channels the rotary leaves unrotated; "
                "rope=full rotates them all: set model.attention.rope=half_truncated or "
                "interleaved_half"
            )
        if self.key_offset and "L" not in self.window:
            raise ValueError(
                "model.attention.key_offset shifts keys in the long-window layers: "
                "model.attention.window has none"
            )
        for key in ("rope_base", "window_block"):
            if getattr(self, key) <= 0:
                raise ValueError(
                    f"model.attention.{key} must be positive, got {getattr(self, key)}"
                )
        self._validate_varlen()
        for key in ("scale", "window_tokens", "init_std", "yarn_max_window"):
            if getattr(self, key) < 0:
                raise ValueError(f"model.attention.{key} must be >= 0, got {getattr(self, key)}")
        for key, allowed in (("window", "LS"), ("layers", "A."), ("xsa", "X."), ("paired", "P.")):
            bad = set(getattr(self, key)) - set(allowed)
            if bad:
                raise ValueError(
                    f"model.attention.{key}={getattr(self, key)!r}: each layer is one of "
                    f"{list(allowed)}, got {sorted(bad)}"
                )
        if self.layers and "A" not in self.layers:
            raise ValueError("model.attention.layers leaves no layer with attention")
        if self.merged_qkvo and self.merged_qkv:
            raise ValueError(
                "model.attention.merged_qkvo and model.attention.merged_qkv: set one (qkvo holds "
                "W_o too)"
            )
        if self.window_granularity == "token" and not self.window:
            raise ValueError(
                "model.attention.window_granularity=token needs model.attention.window (which "
                "layers)"
            )

    def _validate_varlen(self) -> None:
        if self.max_segments < 1:
            raise ValueError(f"model.attention.max_segments must be >= 1, got {self.max_segments}")
        if self.impl != "varlen":
            return
        if self.window and self.window_granularity != "token":
            raise ValueError(
                "model.attention.impl=varlen: the kernel's window is token-granular (i − j ≤ W); "
                "whole-block windows need model.attention.impl=flex, or set "
                "model.attention.window_granularity=token"
            )
        if self.window_tokens:
            raise ValueError(
                "model.attention.impl=varlen takes the window as a Python number, so a compiled "
                "model recompiles at each new width: a window growing linearly "
                "(model.attention.window_tokens) would recompile every few steps; use a window "
                "by stage (train.stages.rows.N.window) or model.attention.impl=flex"
            )
