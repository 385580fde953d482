"""The GPT: a pre-norm decoder-only transformer in the shape of the NanoGPT speedrun records.

Rotary position embeddings, QK-norm, ReLU² MLP, parameter-free RMSNorm, zero-initialised
output projections, an untied LM head and tanh-softcapped logits. Every hidden matrix is a
separate `nn.Linear` (q, k, v, o, fc, proj) so Muon orthogonalises each one on its own.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig
from model.loss import softcap_cross_entropy
from model.rotary import Rotary


def rms_norm(x: Tensor) -> Tensor:
    # No learnable gain: the records found it unnecessary, and it keeps AdamW's scalar group
    # free for parameters that matter.
    return F.rms_norm(x, (x.size(-1),))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.head_dim
        self.q = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.k = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.v = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.o = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: Tensor, rotary: Rotary) -> Tensor:
        B, T, C = x.shape
        shape = (B, T, self.n_head, self.head_dim)
        q, k, v = self.q(x).view(shape), self.k(x).view(shape), self.v(x).view(shape)
        # QK-norm bounds the attention logits, which lets the records run higher LRs stably.
        q, k = rotary(rms_norm(q)), rotary(rms_norm(k))
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.o(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.relu(self.fc(x)).square())


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, rotary: Rotary) -> Tensor:
        x = x + self.attn(rms_norm(x), rotary)
        return x + self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_base)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise as the records do: every residual-branch output and the head start at 0.

        With the output projections at zero each block starts as the identity, and with the
        head at zero the first loss is exactly ln(vocab_size), whatever the seed.
        """
        nn.init.normal_(self.embed.weight, std=1.0)
        for block in self.blocks:
            for lin in (block.attn.q, block.attn.k, block.attn.v, block.mlp.fc):
                # Uniform with std 1/sqrt(fan_in): unit-variance activations after RMSNorm.
                bound = (3.0 / lin.in_features) ** 0.5
                nn.init.uniform_(lin.weight, -bound, bound)
            nn.init.zeros_(block.attn.o.weight)
            nn.init.zeros_(block.mlp.proj.weight)
        nn.init.zeros_(self.lm_head.weight)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor:
        """Logits (B, T, vocab) when `targets` is None, else the mean cross-entropy loss."""
        x = rms_norm(self.embed(idx))
        for block in self.blocks:
            x = block(x, self.rotary)
        logits = self.lm_head(rms_norm(x))
        cap = self.cfg.logit_softcap
        if targets is not None and cap > 0:
            return softcap_cross_entropy(logits.flatten(0, 1), targets.flatten(), cap)
        logits = logits.float()
        if cap > 0:
            logits = cap * torch.tanh(logits / cap)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
