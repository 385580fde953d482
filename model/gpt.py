"""The GPT: a pre-norm decoder-only transformer in the shape of the NanoGPT speedrun records.

Rotary position embeddings, QK-norm, ReLU² MLP, parameter-free RMSNorm, zero-initialised
output projections, an untied LM head and softcapped logits. Every hidden matrix is a
separate `nn.Linear` (q, k, v, o, fc, proj) so Muon orthogonalises each one on its own.

The forward pass reads as docs/records.md's: embed → (smear) → (x0, value embeddings, masks:
computed once) → blocks, the decoder half adding encoder outputs when U-net skips are on (or
one gated skip) → (backout) → norm → head → softcapped loss. What each layer has comes from
the layer plan (`model/plan.py`); options that are off build nothing and cost nothing.
"""

import torch
from torch import Tensor, nn

from model.attention import CausalSelfAttention, Context, init_bound
from model.config import ModelConfig
from model.flops import StepFlops
from model.head import head_logits
from model.layers import MLP, linear, rms_norm
from model.loss import model_loss
from model.masks import build_masks
from model.plan import LayerSpec, describe_plan, layer_plan
from model.rotary import Rotary
from model.scalars import BACKOUT_INIT, SKIP_GATE_INIT, SMEAR_INIT, ScalarLayout
from model.yarn import yarn_table


class Block(nn.Module):
    """x <- a·x + b·x0 (x0 shortcut); x <- x + attn(norm(x)) (unless MLP-only);
    x <- x + mlp(norm(x)) (unless attention-only). A block with neither is never called."""

    def __init__(self, cfg: ModelConfig, spec: LayerSpec, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.attn = CausalSelfAttention(cfg, spec, layer) if spec.attention else None
        self.mlp = MLP(cfg) if spec.mlp else None
        if cfg.x0_shortcut and not cfg.packed_scalars and not spec.empty:
            self.x0_mix = nn.Parameter(torch.tensor([cfg.x0_mix_a_init, 0.0]))  # (a, b)

    def forward(self, x: Tensor, rotary: Rotary, ctx: Context) -> Tensor:
        if ctx.x0 is not None:
            mix = self.x0_mix if ctx.layout is None else ctx.packed[ctx.layout.x0_mix(self.layer)]
            x = mix[0] * x + mix[1] * ctx.x0
        if self.attn is not None:
            x = x + self.attn(rms_norm(x), rotary, ctx)
        if self.mlp is not None:
            x = x + self.mlp(rms_norm(x))
        return x


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
        self.blocks = nn.ModuleList([Block(cfg, spec, i) for i, spec in enumerate(self.plan)])
        skips = [i for i, s in enumerate(self.plan) if s.skip_from is not None]
        self._skip_index = {layer: j for j, layer in enumerate(skips)}
        if skips:
            self.skip_weights = nn.Parameter(torch.ones(len(skips)))
        self.lm_head = linear(cfg, cfg.n_embd, cfg.vocab_size)
        if cfg.smear:  # w_smear (1 × k): an nn.Linear as the record's (bf16 in a bf16 model)
            self.smear_gate = linear(cfg, cfg.gate_channels, 1)
        self.layout = None
        if cfg.packed_scalars:
            self.layout = ScalarLayout(cfg.n_layer, cfg.scalars_multiple)
            self.scalars = nn.Parameter(torch.empty(self.layout.size))
        else:  # the same scalars, one parameter each
            if cfg.skip_from >= 0:
                self.skip_gate = nn.Parameter(torch.tensor(SKIP_GATE_INIT))
            if cfg.smear:
                self.smear_lambda = nn.Parameter(torch.tensor(SMEAR_INIT))
            if cfg.backout_layer >= 0:
                self.backout_lambda = nn.Parameter(torch.tensor(BACKOUT_INIT))
        windows = cfg.long_windows if cfg.yarn else None
        self.rotary = Rotary(
            cfg.head_dim, cfg.rope_base, cfg.rope, cfg.rope_bf16, cfg.rope_reciprocal, windows,
            cfg.window_block,
        )  # fmt: skip
        if cfg.yarn:  # the attention scale of each YaRN stage, as exact as the config's floats
            scales = yarn_table(
                self.rotary.inv_freq, windows, cfg.window_block,
                cfg.attn_scale or cfg.head_dim**-0.5,
            ).attn_scales  # fmt: skip
            self.register_buffer(
                "yarn_scales", torch.tensor(scales, dtype=torch.float64), persistent=False
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
        blocks = [b for b in self.blocks if next(b.parameters(), None) is not None]  # not empty
        return [self.embed, *getattr(self, "value_embeds", {}).values(), *blocks]

    def count_flops(
        self,
        idx: Tensor,
        window_tokens: Tensor | float | None = None,
        short_window_tokens: Tensor | float | None = None,
        yarn_stage: Tensor | None = None,
    ) -> Tensor:
        """Training FLOPs of one forward and backward over `idx` (model/flops.py), a 0-d
        tensor on its device; the forward's step arguments as it takes them (the YaRN stage
        changes no FLOPs)."""
        if self._flops is None:
            self._flops = StepFlops.of(self)
        return self._flops(idx, window_tokens, short_window_tokens)

    def plan_summary(self) -> str:
        """The layer plan in one line, "" when every layer is alike."""
        cfg = self.cfg
        if not cfg.differs_per_layer:
            return ""
        extras = [f"gated skip {cfg.skip_from} -> {cfg.skip_to}"] if cfg.skip_from >= 0 else []
        extras += [f"backout {cfg.backout_layer}"] if cfg.backout_layer >= 0 else []
        return " | ".join([describe_plan(self.plan), *extras])

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
            weights += [block.mlp.fc.weight] if block.mlp is not None else []
            for w in weights:
                nn.init.uniform_(w, -bound, bound)
            if block.attn is not None:
                nn.init.zeros_(block.attn.out_weight())
                if hasattr(block.attn, "gate"):  # σ(0) = ½ on every head
                    nn.init.zeros_(block.attn.gate.weight)
            if block.mlp is not None:
                nn.init.zeros_(block.mlp.proj.weight)
        nn.init.zeros_(self.lm_head.weight)
        if hasattr(self, "smear_gate"):
            nn.init.zeros_(self.smear_gate.weight)
        if self.layout is not None:
            self.scalars.copy_(self.layout.initial(cfg.x0_mix_a_init))
        if cfg.dtype == "bf16":  # the record's bf16 tables: N(0, 1) rounded to bf16
            self.embed.to(torch.bfloat16)
            for table in getattr(self, "value_embeds", {}).values():
                table.to(torch.bfloat16)
            for gate in self._gates():  # the 2025-11 record's gates are bf16 parameters
                gate.to(torch.bfloat16)
            if cfg.head_bf16:
                self.lm_head.to(torch.bfloat16)

    def _gates(self) -> list[nn.Module]:
        gates = [b.attn.gate for b in self.blocks if b.attn is not None and hasattr(b.attn, "gate")]
        return gates + ([self.smear_gate] if hasattr(self, "smear_gate") else [])

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        window_tokens: Tensor | None = None,
        short_window_tokens: Tensor | None = None,
        yarn_stage: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, T, vocab) when `targets` is None, else the cross-entropy loss (the mean,
        or in training with model.loss_reduction=sum the sum over tokens).

        The step arguments come from the schedule as 0-d tensors, so that a compiled model
        does not recompile as they change. `window_tokens`: the long sliding window, rounded
        up here to whole blocks, N(s), or with token windows W in tokens; `short_window_tokens`:
        the short window in tokens (token windows only; block windows halve N(s));
        `yarn_stage`: the YaRN stage (model.yarn; None = stage 0).
        """
        cfg = self.cfg
        token = cfg.window_granularity == "token"
        window = short = None
        if window_tokens is not None and token:  # i − j ≤ W holds iff it holds for ⌊W⌋
            window = torch.floor(torch.as_tensor(window_tokens)).long()
            if short_window_tokens is not None:
                short = torch.floor(torch.as_tensor(short_window_tokens)).long()
        elif window_tokens is not None:
            window = torch.ceil(window_tokens / cfg.window_block).long()
        e = self.embed(idx)
        if cfg.smear:
            e = self._smear(e)
        x = rms_norm(e)
        # The loop hands step arguments over as float tensors; the stage indexes tables
        stage = yarn_stage.long() if cfg.yarn and yarn_stage is not None else None
        scale = None  # the stage's attention scale; indexed on device, so no host sync
        if stage is not None:
            scale = self.yarn_scales.index_select(0, stage.reshape(1))[0]
        ctx = Context(
            x0=x if cfg.x0_shortcut else None,
            value_embeds={int(t): ve(idx) for t, ve in getattr(self, "value_embeds", {}).items()},
            masks=build_masks(
                idx,
                cfg.document_mask,
                self._windows,
                window,
                cfg.window_block,
                impl=cfg.attention_impl,
                token_window=token,
                short_window=short,
            ),
            packed=getattr(self, "scalars", None),
            layout=self.layout,
            yarn_stage=stage,
            attn_scale=scale,
        )
        outputs: list[Tensor] = []
        for i, block in enumerate(self.blocks):
            skip = self.plan[i].skip_from
            if skip is not None:  # U-net: add the paired encoder layer's output
                x = x + self.skip_weights[self._skip_index[i]] * outputs[skip]
            if i == cfg.skip_to:  # the one gated skip
                x = x + torch.sigmoid(self._scalar("skip")) * outputs[cfg.skip_from]
            if not self.plan[i].empty:
                x = block(x, self.rotary, ctx)
            outputs.append(x)
        if cfg.backout_layer >= 0:  # take back part of an early layer's contribution
            x = x - self._scalar("backout") * outputs[cfg.backout_layer]
        logits = head_logits(
            self.lm_head, rms_norm(x), cfg.fp8_head, self.micro_steps, cfg.fp8_scales
        )
        return model_loss(logits, targets, cfg, self.training)

    def _scalar(self, name: str) -> Tensor:
        """The skip gate's logit, λ_smear or λ_back: an entry of the packed vector, or its own
        parameter."""
        if self.layout is None:
            return getattr(self, {"skip": "skip_gate", "smear": "smear_lambda",
                                  "backout": "backout_lambda"}[name])  # fmt: skip
        index = {"skip": self.layout.skip_gate, "smear": self.layout.smear,
                 "backout": self.layout.backout}[name]  # fmt: skip
        return self.scalars[index]

    def _smear(self, e: Tensor) -> Tensor:
        """e'_t = e_t + λ·σ(e_t[:k]·wᵀ)·e_(t−1) for t ≥ 1 within each row (the previous token
        may lie in the previous document), e'_0 = e_0; the mixed-in e_(t−1) is un-smeared."""
        gate = torch.sigmoid(self.smear_gate(e[:, 1:, : self.cfg.gate_channels]))
        return torch.cat([e[:, :1], e[:, 1:] + self._scalar("smear") * gate * e[:, :-1]], dim=1)
