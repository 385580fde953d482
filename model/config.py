"""Typed configuration of the GPT (the `model` config group).

The first block of fields is the dense GPT every run has. The rest are the speedrun records'
model options, each off by default, so a config that sets none of them builds exactly the
same model, parameter for parameter and bit for bit. Per-layer options (`window`,
`value_embeds`, `attention_layers`) are written as patterns over the layers of a reference
depth, one character per layer, and resampled to `n_layer` (`model/plan.py`).
"""

from dataclasses import dataclass, field

from model.window_schedule import validate_window_schedule, window_at, window_schedule_at

DTYPES = ("fp32", "bf16")
ROPES = ("full", "half_truncated")
VALUE_RESIDUALS = ("off", "fixed", "learned")
SOFTCAP_FORMS = ("tanh", "sigmoid")
LOSSES = ("auto", "fused", "plain")
ATTENTION_IMPLS = ("auto", "sdpa", "flex")
WINDOW_GRANULARITIES = ("block", "token")
LOSS_REDUCTIONS = ("mean", "sum")
LOSS_DTYPES = ("fp32", "bf16")
OPERATIONAL = {"resume": "operational"}  # how a checkpoint treats a field (trainer/config.py)


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
    rope_base: float = 10000.0
    """Rotary base (wavelength scale), rope=full."""
    logit_softcap: float = 30.0
    """The cap c of the softcap (`softcap_form`); 0 disables it."""
    qk_norm: bool = True
    """RMS-normalise each head's q and k before rotary, which bounds the attention logits."""
    compile: bool = field(default=False, metadata=OPERATIONAL)
    """torch.compile the model, with static shapes (trainer/launch/compile.py)."""
    compile_backend: str = field(default="inductor", metadata=OPERATIONAL)
    """torch.compile backend: inductor generates kernels; eager and aot_eager only trace."""

    # --- the speedrun records' options, each off by default ---------------------------------
    embed_rows: int = 0
    """Rows of the token and value embedding tables; 0 = vocab_size."""
    init_std: float = 1.0
    """Hidden linear weights ~ U(±√3·init_std/√fan_in): 1/√3 is PyTorch's default (the
    2024-11 record), 0.5 the 2025-01 record's."""
    dtype: str = field(default="fp32", metadata={"choices": DTYPES})
    """bf16: bf16 embedding tables, every linear casts its fp32 weight to bf16, a bf16
    residual stream (the 2025-01 record; pair with train.autocast=none) | fp32."""
    rope: str = field(default="full", metadata={"choices": ROPES})
    """full: base rope_base on every dim | half_truncated: 32 frequencies 1 … 1/1024 on the
    first half of each half-head, 0 on the rest."""
    rope_bf16: bool = False
    """Round the cos/sin tables to bf16 and rotate in bf16 (2024-11)."""
    rope_reciprocal: bool = False
    """rope=full frequencies as 1 / base^(2i/d), the records' rounding, not base^(−2i/d)."""
    merged_qkv: bool = False
    """One 3 × d × d parameter for q, k, v (Muon per slice)."""
    attn_scale: float = 0.0
    """softmax(scale · q·kᵀ); 0 = 1/√head_dim."""
    value_residual: str = field(default="off", metadata={"choices": VALUE_RESIDUALS})
    """v ← (1−λ)·v + λ·v₁ with v₁ block 0's raw values: off | fixed λ | learned λ per block."""
    value_residual_lambda: float = 0.5
    """λ, or its initial value when learned."""
    x0_shortcut: bool = False
    """x ← a·x + b·x0 before each block, (a, b) learned from (1, 0)."""
    unet: bool = False
    """Decoder layers add encoder outputs (last in, first out), weights from 1."""
    value_embeds: str = ""
    """Per-layer pattern: a digit = the value-embedding table added to that layer's values
    (v ← α·v + β·ve), "." = none; "" = no tables. The 2025-01 record: "012......012"."""
    attention_layers: str = ""
    """Per-layer pattern: "A" attention, "." MLP only; "" = all attention."""
    window: str = ""
    """Sliding-window attention, per-layer pattern: "L" long window, "S" short (half);
    "" = no window (all of the past)."""
    window_block: int = 128
    """The window moves in blocks of this many tokens."""
    window_tokens: int = 0
    """The long window at the last step, in tokens, growing linearly from 1 token with the
    step (`step_args`), rounded up to whole blocks; 0 = no window."""
    # --- window schedule by phase, and YaRN (the 2025-11 record; `step_args`) ---------------
    window_phases: list[int] = field(default_factory=list)
    """The long window in each of P equal phases of the scheduled steps (train.steps −
    train.extension_steps), in blocks of window_block tokens (the record: [3, 7, 11]); the
    short window is half of it, rounded down. [] = off (window_tokens's linear growth)."""
    window_after: int = 0
    """The long window from the end of the scheduled steps on, in blocks (the record: 13);
    0 = the last phase's."""
    window_final_eval: int = 0
    """The long window of the final validation only, in blocks (the record: 20); the short
    one keeps the last step's. 0 = the last step's windows."""
    yarn: bool = False
    """YaRN: at every change of the long window the rotary frequencies are rescaled and the
    attention scale raised (model/yarn.py); the forward takes the stage (`step_args`)."""
    # --- end of the window schedule's fields ------------------------------------------------
    document_mask: bool = False
    """Attend within a document only (documents start at EOT)."""
    attention_impl: str = field(default="auto", metadata={"choices": ATTENTION_IMPLS})
    """The kernel behind document / window masks: sdpa (a dense mask) | flex (FlexAttention
    over block masks) | auto: flex on CUDA, sdpa elsewhere."""
    fp8_head: bool = False
    """The LM head in FP8 while training (e4m3 forward, e5m2 gradients)."""
    fp8_scales: str = field(
        default="record_2025_01", metadata={"choices": ("record_2025_01", "record_2025_11")}
    )
    """The FP8 head's divisors (x_s, w_s, g_s), model/head.py: record_2025_01 (1/2, 2⁻⁹, 2⁻¹⁹)
    | record_2025_11 (√768/448, 2⁻⁹, 1/448)."""
    softcap_form: str = field(default="tanh", metadata={"choices": SOFTCAP_FORMS})
    """tanh: c·tanh(z/c) | sigmoid: c·σ(4z/c), the 2025-01 record's 30·σ(z/7.5)."""
    loss: str = field(default="auto", metadata={"choices": LOSSES})
    """Softcapped cross-entropy: fused (chunked, for CPU caches) | plain (the formula, which
    torch.compile fuses on GPU) | auto: fused on CPU, plain elsewhere."""

    # --- the 2025-11 record's options (docs/records.md, record C: C.1, C.2), off by default ---
    mlp_layers: str = ""
    """Per-layer pattern: "M" MLP, "." none; "" = an MLP everywhere. A layer with neither
    attention nor MLP is skipped whole (no x0 mix). The 2025-11 record: ".MMMMMMMMMMM"."""
    merged_qkvo: bool = False
    """One (4, d, d) parameter for W_q, W_k, W_v, W_o (each (out, in); Muon per slice)."""
    fc_in_out: bool = False
    """Store the MLP's C_fc as (in, out) = (d, 4d), used as u·C_fc (C_proj stays (out, in))."""
    attn_gate: bool = False
    """Per-head output gate y_h <- y_h·σ(u[:k]·G[h]ᵀ), G (heads × k) zero-init, k below."""
    smear: bool = False
    """e'_t = e_t + λ·σ(e_t[:k]·wᵀ)·e_(t−1) on the token embeddings (w 1 × k zero, λ from 0)."""
    gate_channels: int = 12
    """k: the leading channels of the stream that the attention and smear gates read."""
    skip_from: int = -1
    """Gated skip: the output of layer skip_from is added to the input of layer skip_to with
    weight σ(w), w from −1.5; −1 = off. The record: 4 → 7."""
    skip_to: int = -1
    """See skip_from."""
    backout_layer: int = -1
    """Before the final norm x <- x − λ·(output of this layer), λ from 0.5; −1 = off. Record: 8."""
    x0_mix_a_init: float = 1.0
    """The initial a of the x0 shortcut's (a, b); the 2025-11 record 1.1."""
    packed_scalars: bool = False
    """Every scalar of the model in one fp32 vector, the 2025-11 record's layout
    (model/scalars.py)."""
    scalars_multiple: int = 8
    """The packed vector is padded (with ones) to a multiple of this: the record's 8 ranks, kept
    whatever the rank count so the parameter count is the same everywhere."""
    head_bf16: bool = False
    """The LM head weight a bf16 parameter (the 2025-11 record); needs model.dtype=bf16."""
    window_granularity: str = field(default="block", metadata={"choices": WINDOW_GRANULARITIES})
    """block: the window is whole blocks of window_block tokens | token: query i sees keys j
    with i − j ≤ W tokens (W + 1 keys), long W = window_tokens, short W = short_window_tokens."""
    loss_reduction: str = field(default="mean", metadata={"choices": LOSS_REDUCTIONS})
    """The training loss over tokens: mean | sum (the 2025-11 record). Evaluation: the mean."""
    loss_dtype: str = field(default="fp32", metadata={"choices": LOSS_DTYPES})
    """fp32: cap and cross-entropy in fp32 at least | bf16: the cap in the logits' dtype, and in
    training the cross-entropy too (evaluation: fp32 cross-entropy); needs model.loss≠fused."""

    def step_args(
        self,
        step: int,
        total_steps: int,
        scheduled_steps: int | None = None,
        final_eval: bool = False,
    ) -> dict[str, float]:
        """The forward's step-dependent arguments for `step` (0 ... total_steps: the training
        update `step`, or an evaluation after `step` updates); the run's schedule
        (trainer/schedule.py) asks for them once per step. The schedules span the first
        `scheduled_steps` (default all) and hold their final values after; `final_eval`: the
        evaluation after the last update (`window_final_eval`).

        With window_phases: {"window_tokens": the long window, "short_window_tokens": the
        short one (both whole blocks, in tokens), and with yarn "yarn_stage": the index into
        `long_windows` (`window_schedule_at`)}. Otherwise {"window_tokens": window_at(...)}
        with window_tokens, or {}."""
        scheduled = total_steps if scheduled_steps is None else scheduled_steps
        if self.window_phases:
            long, short, stage = window_schedule_at(self, step, scheduled, final_eval)
            args = {
                "window_tokens": long * self.window_block,
                "short_window_tokens": short * self.window_block,
            }
            return {**args, "yarn_stage": stage} if self.yarn else args
        if not self.window_tokens:
            return {}
        if scheduled == total_steps:
            return {"window_tokens": window_at(step, total_steps, self.window_tokens)}
        # Extension steps keep the final window: the growth spans the scheduled steps.
        return {"window_tokens": window_at(min(step, scheduled), scheduled, self.window_tokens)}

    @property
    def long_windows(self) -> list[int]:
        """The long windows in blocks, in order: each phase's, then window_after if set. The
        YaRN stages follow it: stage k = after k changes (model/yarn.py)."""
        return [*self.window_phases, *([self.window_after] if self.window_after else [])]

    @property
    def differs_per_layer(self) -> bool:
        """Whether layers differ (windows, value embeddings, MLP-only layers, U-net skips)."""
        return bool(
            self.window or self.value_embeds or self.attention_layers or self.unet
            or self.mlp_layers or self.skip_from >= 0 or self.backout_layer >= 0
        )  # fmt: skip

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
        if self.window_tokens < 0:
            raise ValueError(f"model.window_tokens must be >= 0, got {self.window_tokens}")
        if self.window_phases:
            validate_window_schedule(self)
        elif bool(self.window) != bool(self.window_tokens):
            raise ValueError(
                "model.window (which layers have sliding windows) and model.window_tokens (how "
                "wide the window grows) go together: set both or neither (got "
                f"{self.window!r} and {self.window_tokens})"
            )
        else:
            for key in ("window_after", "window_final_eval", "yarn"):
                if getattr(self, key):
                    raise ValueError(f"model.{key} needs model.window_phases (the window by phase)")
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
        self._validate_record_c()

    def _validate_record_c(self) -> None:
        n = self.n_layer
        bad = set(self.mlp_layers) - set("M.")
        if bad:
            raise ValueError(
                f"model.mlp_layers={self.mlp_layers!r}: each layer is one of "
                f"['M', '.'], got {sorted(bad)}"
            )
        if self.merged_qkvo and self.merged_qkv:
            raise ValueError("model.merged_qkvo and model.merged_qkv: set one (qkvo holds W_o too)")
        gated = self.attn_gate or self.smear
        if gated and not 0 < self.gate_channels <= self.n_embd:
            raise ValueError(
                f"model.gate_channels must be in [1, model.n_embd], got {self.gate_channels}"
            )
        for key in ("skip_from", "skip_to", "backout_layer"):
            if not -1 <= getattr(self, key) < n:
                raise ValueError(
                    f"model.{key} must be −1 (off) or a layer index below "
                    f"model.n_layer ({n}), got {getattr(self, key)}"
                )
        off = self.skip_from < 0 and self.skip_to < 0
        if not off and not 0 <= self.skip_from < self.skip_to:
            raise ValueError(
                f"model.skip_from ({self.skip_from}) and model.skip_to "
                f"({self.skip_to}): both −1 (off), or from an earlier layer"
            )
        if self.skip_from >= 0 and self.unet:
            raise ValueError("model.skip_from and model.unet: one kind of skip at a time")
        if self.scalars_multiple <= 0:
            raise ValueError(
                f"model.scalars_multiple must be positive, got {self.scalars_multiple}"
            )
        if self.packed_scalars and (self.unet or self.value_residual == "learned"):
            raise ValueError(
                "model.packed_scalars has no place for model.unet's skip weights or "
                "model.value_residual=learned's λ: turn those off"
            )
        if self.packed_scalars and self.skip_from >= 0 and n < 2:
            raise ValueError(
                "model.packed_scalars reads the skip gate at index 1: needs model.n_layer >= 2"
            )
        if self.fp8_head and self.loss_reduction == "sum" and self.fp8_scales == "record_2025_01":
            raise ValueError(
                "model.loss_reduction=sum gives per-token logit gradients of O(1), which the "
                "FP8 head's 2025-01 gradient scale (×2¹⁹) overflows in e5m2: set "
                "model.fp8_scales=record_2025_11 (×448)"
            )
        if self.head_bf16 and self.dtype != "bf16":
            raise ValueError("model.head_bf16=true needs model.dtype=bf16 (its inputs are bf16)")
        if self.window_granularity == "token" and not self.window:
            raise ValueError("model.window_granularity=token needs model.window (which layers)")
        if self.loss == "fused" and self.loss_dtype == "bf16":
            raise ValueError(
                "model.loss=fused computes in fp32: use model.loss=plain or auto "
                "with model.loss_dtype=bf16"
            )
