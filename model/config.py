"""Typed configuration of the GPT (the `model` config group)."""

from dataclasses import dataclass


@dataclass
class ModelConfig:
    n_layer: int = 4  # transformer blocks
    n_head: int = 2  # attention heads per block
    n_embd: int = 128  # residual stream width; head_dim = n_embd // n_head
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 128 for fast matmuls
    rope_base: float = 10000.0  # rotary embedding base (wavelength scale)
    logit_softcap: float = 30.0  # logits = cap * tanh(logits / cap); 0 disables the cap
    compile: bool = False  # torch.compile the model (worth it on GPU; slow warm-up on CPU)

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
        if self.vocab_size < 50257:
            raise ValueError(
                f"model.vocab_size ({self.vocab_size}) must hold the GPT-2 vocabulary (50257)"
            )
        if self.rope_base <= 0:
            raise ValueError(f"model.rope_base must be positive, got {self.rope_base}")
        if self.logit_softcap < 0:
            raise ValueError(f"model.logit_softcap must be >= 0, got {self.logit_softcap}")
