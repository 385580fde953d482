"""The GPT: a pre-norm decoder-only transformer in the shape of the NanoGPT speedrun records.

Rotary position embeddings, QK-norm, ReLU² MLP, parameter-free RMSNorm, zero-initialised
output projections, an untied LM head and softcapped logits. Every hidden matrix is a
separate `nn.Linear` (q, k, v, o, fc, proj) so Muon orthogonalises each one on its own.

The forward pass reads as docs/records.md's: embed → (x0, value embeddings, masks: computed once)
→ blocks, the decoder half adding encoder outputs when U-net skips are on → norm → head →
softcapped loss. What each layer has comes from the layer plan (`model/plan.py`); options
that are off build nothing and cost nothing.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.attention import CausalSelfAttention, Context, init_bound
from model.config import ModelConfig
from model.flops import StepFlops
from model.head import head_logits
from model.layers import MLP, linear, rms_norm
from model.loss import softcap, softcap_cross_entropy
from model.masks import build_masks
from model.plan import LayerSpec, describe_plan, layer_plan
from model.rotary import Rotary


class Block(nn.Module):
    """x <- a·x + b·x0 (x0 shortcut); x <- x + attn(norm(x)) (unless MLP-only);
    x <- x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, spec: LayerSpec) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(cfg, spec) if spec.attention else None
        self.mlp = MLP(cfg)
        if cfg.x0_shortcut:
            self.x0_mix = nn.Parameter(torch.tensor([1.0, 0.0]))  # (a, b)

    def forward(self, x: Tensor, rotary: Rotary, ctx: Context) -> Tensor:
        if ctx.x0 is not None:
            x = self.x0_mix[0] * x + self.x0_mix[1] * ctx.x0
        if self.attn is not None:
            x = x + self.attn(rms_norm(x), rotary, ctx)
        return x + self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.plan = layer_plan(cfg)
        rows = cfg.embed_rows or cfg.vocab_size
        self.embed = nn.Embedding(rows, cfg.n_embd)
        tables = sorted({s.value_embed for s in self.plan if s.value_embed is not None})
        if tables:
            self.value_embeds = nn.ModuleDict(
                {str(t): nn.Embedding(rows, cfg.n_embd) for t in tables}
            )
        self.blocks = nn.ModuleList([Block(cfg, spec) for spec in self.plan])
        skips = [i for i, s in enumerate(self.plan) if s.skip_from is not None]
        self._skip_index = {layer: j for j, layer in enumerate(skips)}
        if skips:
            self.skip_weights = nn.Parameter(torch.ones(len(skips)))
        self.lm_head = linear(cfg, cfg.n_embd, cfg.vocab_size)
        self.rotary = Rotary(
            cfg.head_dim, cfg.rope_base, cfg.rope, cfg.rope_bf16, cfg.rope_reciprocal
        )
        self._windows = {s.window for s in self.plan if s.attention}
        # Micro-steps per optimizer step, each backpropagating loss / micro_steps: the FP8
        # head's gradient cast undoes that factor (model/head.py). Set by the trainer.
        self.micro_steps = 1
        self._flops: StepFlops | None = None  # counted on first use (N needs the parameters)
        self.reset_parameters()

    def fsdp_units(self) -> list[nn.Module]:
        """The modules FSDP2 shards as units of their own: every embedding table and every
        block. The rest (the LM head and the scalars) stays in the root unit: the FP8 head
        reads its weight directly, not through its forward, so it must be gathered when the
        model's own forward starts."""
        return [self.embed, *getattr(self, "value_embeds", {}).values(), *self.blocks]

    def count_flops(self, idx: Tensor, window_tokens: Tensor | float | None = None) -> Tensor:
        """Training FLOPs of one forward and backward over `idx` (model/flops.py), a 0-d
        tensor on its device; the forward's step arguments as it takes them."""
        if self._flops is None:
            self._flops = StepFlops.of(self)
        return self._flops(idx, window_tokens)

    def plan_summary(self) -> str:
        """The layer plan in one line, "" when every layer is alike."""
        return describe_plan(self.plan) if self.cfg.differs_per_layer else ""

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise as the records do: every residual-branch output and the head start at 0.

        With the output projections at zero each block starts as the identity, and with the
        head at zero the first loss is exactly ln(vocab_size), whatever the seed. Hidden
        matrices are uniform with std model.init_std/√fan_in; embeddings N(0, 1).
        """
        cfg = self.cfg
        nn.init.normal_(self.embed.weight, std=1.0)
        for table in getattr(self, "value_embeds", {}).values():
            nn.init.normal_(table.weight, std=1.0)
        bound = init_bound(cfg, cfg.n_embd)  # q, k, v and fc all read the d-wide stream
        for block in self.blocks:
            weights = block.attn.qkv_weights() if block.attn is not None else []
            for w in [*weights, block.mlp.fc.weight]:
                nn.init.uniform_(w, -bound, bound)
            if block.attn is not None:
                nn.init.zeros_(block.attn.o.weight)
            nn.init.zeros_(block.mlp.proj.weight)
        nn.init.zeros_(self.lm_head.weight)
        if cfg.dtype == "bf16":  # the record's bf16 tables: N(0, 1) rounded to bf16
            self.embed.to(torch.bfloat16)
            for table in getattr(self, "value_embeds", {}).values():
                table.to(torch.bfloat16)

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, window_tokens: Tensor | None = None
    ) -> Tensor:
        """Logits (B, T, vocab) when `targets` is None, else the mean cross-entropy loss.

        `window_tokens`: this step's sliding window from the schedule (a 0-d tensor, so that a
        compiled model does not recompile as it grows), rounded up here to whole blocks: N(s).
        """
        cfg = self.cfg
        window_blocks = None
        if window_tokens is not None:
            window_blocks = torch.ceil(window_tokens / cfg.window_block).long()
        x = rms_norm(self.embed(idx))
        ctx = Context(
            x0=x if cfg.x0_shortcut else None,
            value_embeds={int(t): ve(idx) for t, ve in getattr(self, "value_embeds", {}).items()},
            masks=build_masks(
                idx,
                cfg.document_mask,
                self._windows,
                window_blocks,
                cfg.window_block,
                impl=cfg.attention_impl,
            ),
        )
        outputs: list[Tensor] = []
        for i, block in enumerate(self.blocks):
            skip = self.plan[i].skip_from
            if skip is not None:  # U-net: add the paired encoder layer's output
                x = x + self.skip_weights[self._skip_index[i]] * outputs[skip]
            x = block(x, self.rotary, ctx)
            outputs.append(x)
        logits = head_logits(self.lm_head, rms_norm(x), cfg.fp8_head, self.micro_steps)
        return self._loss(logits, targets)

    def _loss(self, logits: Tensor, targets: Tensor | None) -> Tensor:
        cfg, cap = self.cfg, self.cfg.logit_softcap
        fused = cfg.loss == "fused" or (cfg.loss == "auto" and logits.device.type == "cpu")
        if targets is not None and cap > 0 and fused:
            # 30·σ(z/7.5) = 15·tanh(z/15) + 15, and a constant shift leaves the loss as it is.
            tanh_cap = cap if cfg.softcap_form == "tanh" else cap / 2
            return softcap_cross_entropy(logits.flatten(0, 1), targets.flatten(), tanh_cap)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 at least
        if cap > 0:
            logits = softcap(logits, cap, cfg.softcap_form)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
