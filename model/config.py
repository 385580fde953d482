"""Typed configuration of the GPT (the `model` config group).

The first block of fields is the dense GPT every run has. The rest are the speedrun records'
model options, each off by default, so a config that sets none of them builds exactly the
same model, parameter for parameter and bit for bit. Per-layer options (`window`,
`value_embeds`, `attention_layers`) are written as patterns over the layers of a reference
depth, one character per layer, and resampled to `n_layer` (`model/plan.py`).
"""

from dataclasses import dataclass, field

DTYPES = ("fp32", "bf16")
ROPES = ("full", "half_truncated")
VALUE_RESIDUALS = ("off", "fixed", "learned")
SOFTCAP_FORMS = ("tanh", "sigmoid")
LOSSES = ("auto", "fused", "plain")
ATTENTION_IMPLS = ("auto", "sdpa", "flex")


@dataclass
class ModelConfig:
    n_layer: int = 4  # transformer blocks
    n_head: int = 2  # attention heads per block
    n_embd: int = 128  # residual stream width; head_dim = n_embd // n_head
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 128 for fast matmuls
    rope_base: float = 10000.0  # rotary embedding base (wavelength scale), rope=full
    logit_softcap: float = 30.0  # the cap c of the softcap below; 0 disables the cap
    # QK-norm: RMS-normalise each head's q and k before rotary, which bounds the attention
    # logits; false feeds the raw projections to rotary (logits then grow with W_q, W_k)
    qk_norm: bool = True
    compile: bool = False  # torch.compile the model (worth it on GPU; slow warm-up on CPU)
    # torch.compile backend (trainer/compile.py): inductor generates kernels; eager and
    # aot_eager only trace (they count graph breaks and recompiles without a slow warm-up)
    compile_backend: str = "inductor"

    # --- the records' options (RECORDS.md), each off by default ---------------------------
    # Rows of the token and value embedding tables; 0 = vocab_size. (The head always has
    # vocab_size outputs.)
    embed_rows: int = 0
    # Hidden linear weights ~ U(±√3·init_std/√fan_in), std init_std/√fan_in. 1/√3 ≈ 0.577 is
    # PyTorch's default U(±1/√fan_in) (the 2024-11 record), 0.5 the 2025-01 record's.
    init_std: float = 1.0
    # bf16: embedding tables stored in bf16, every linear casts its fp32 weight to bf16 in
    # forward (CastedLinear), so the residual stream is bf16 (the 2025-01 record; pair with
    # train.autocast=none) | fp32: fp32 weights and stream (under autocast if enabled)
    dtype: str = field(default="fp32", metadata={"choices": DTYPES})
    # full: base rope_base on every dim | half_truncated: 32 frequencies 1 ... 1/1024 on the
    # first half of each half-head, 0 on the rest (fp32 tables)
    rope: str = field(default="full", metadata={"choices": ROPES})
    rope_bf16: bool = False  # round the cos/sin tables to bf16 and rotate in bf16 (2024-11)
    # rope=full frequencies as 1 / base^(2i/d), the records' rounding (2024-11), instead of
    # base^(-2i/d): one fp32 ulp apart on some frequencies
    rope_reciprocal: bool = False
    merged_qkv: bool = False  # one 3 x d x d parameter for q, k, v (Muon per slice)
    attn_scale: float = 0.0  # softmax(scale · q·k); 0 = 1/√head_dim
    # v <- (1-λ)v + λ·v₁ with v₁ block 0's raw values: off | fixed (λ constant) | learned
    # (one λ per block)
    value_residual: str = field(default="off", metadata={"choices": VALUE_RESIDUALS})
    value_residual_lambda: float = 0.5  # λ, or its initial value when learned
    x0_shortcut: bool = False  # x <- a·x + b·x0 before each block, (a, b) learned from (1, 0)
    unet: bool = False  # decoder layers add encoder outputs (last-in, first-out), weights init 1
    # Value embeddings: per-layer pattern, a digit = the table added to that layer's values
    # (v <- α·v + β·ve, (α, β) learned from (0.5, 0.5)), "." = none; "" = no tables.
    # The 2025-01 record: "012......012".
    value_embeds: str = ""
    attention_layers: str = ""  # per-layer pattern, "A" attention, "." MLP only; "" = all
    # Sliding-window attention: per-layer pattern, "L" long window, "S" short (half); the
    # window size follows optim.schedule.window_tokens; "" = no window (all of the past)
    window: str = ""
    window_block: int = 128  # the window moves in blocks of this many tokens
    document_mask: bool = False  # attend within a document only (documents start at EOT)
    # The kernel behind document / window masks: sdpa (a dense boolean mask, small sequences)
    # | flex (FlexAttention over block masks, where skipped tiles cost nothing) | auto: flex on
    # CUDA, sdpa elsewhere. Plain causal attention is always SDPA's is_causal kernel.
    attention_impl: str = field(default="auto", metadata={"choices": ATTENTION_IMPLS})
    fp8_head: bool = False  # LM head in FP8 while training (e4m3 forward, e5m2 gradients)
    # tanh: c·tanh(z/c) | sigmoid: c·σ(4z/c), the 2025-01 record's 30·σ(z/7.5)
    softcap_form: str = field(default="tanh", metadata={"choices": SOFTCAP_FORMS})
    # Softcapped cross-entropy: fused (chunked, for CPU caches) | plain (the formula, which
    # torch.compile fuses on GPU) | auto: fused on CPU, plain elsewhere (scripts/bench_loss.py)
    loss: str = field(default="auto", metadata={"choices": LOSSES})

    @property
    def differs_per_layer(self) -> bool:
        """Whether layers differ (windows, value embeddings, MLP-only layers, U-net skips)."""
        return bool(self.window or self.value_embeds or self.attention_layers or self.unet)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self) -> None:
        """Raise ValueError naming the `model.*` key that is wrong."""
        for key in ("n_layer", "n_head", "n_embd", "vocab_size"):
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
        if self.rope == "half_truncated" and self.head_dim % 4 != 0:
            raise ValueError(
                f"model.rope=half_truncated needs a head dim divisible by 4, got {self.head_dim}"
            )
        if self.vocab_size < 50257:
            raise ValueError(
                f"model.vocab_size ({self.vocab_size}) must hold the GPT-2 vocabulary (50257)"
            )
        if self.embed_rows and not 50257 <= self.embed_rows <= self.vocab_size:
            raise ValueError(
                f"model.embed_rows ({self.embed_rows}) must be 0 or between the GPT-2 vocabulary "
                f"(50257) and model.vocab_size ({self.vocab_size})"
            )
        if self.rope_base <= 0:
            raise ValueError(f"model.rope_base must be positive, got {self.rope_base}")
        for key in ("logit_softcap", "attn_scale"):
            if getattr(self, key) < 0:
                raise ValueError(f"model.{key} must be >= 0, got {getattr(self, key)}")
        if self.init_std <= 0:
            raise ValueError(f"model.init_std must be positive, got {self.init_std}")
        if self.window_block <= 0:
            raise ValueError(f"model.window_block must be positive, got {self.window_block}")
        for key, allowed in (("window", "LS"), ("attention_layers", "A."),
                             ("value_embeds", "0123456789.")):  # fmt: skip
            bad = set(getattr(self, key)) - set(allowed)
            if bad:
                raise ValueError(
                    f"model.{key}={getattr(self, key)!r}: each layer is one of {list(allowed)}, "
                    f"got {sorted(bad)}"
                )
        if self.attention_layers and "A" not in self.attention_layers:
            raise ValueError("model.attention_layers leaves no layer with attention")
        if self.compile:
            import torch._dynamo  # here, not at import: a config module stays light

            backends = torch._dynamo.list_backends(exclude_tags=())
            if self.compile_backend not in backends:
                raise ValueError(
                    f"model.compile_backend={self.compile_backend!r} is not a torch.compile "
                    f"backend; use inductor, or eager / aot_eager to trace without kernels"
                )
        if self.fp8_head and self.dtype != "bf16":
            raise ValueError("model.fp8_head=true needs model.dtype=bf16 (its inputs are bf16)")
