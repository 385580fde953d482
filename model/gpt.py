"""The GPT: a pre-norm decoder-only transformer in the shape of the NanoGPT speedrun records.

Rotary position embeddings, QK-norm, ReLU² MLP, parameter-free RMSNorm, zero-initialised
output projections, an untied LM head and softcapped logits. Every hidden matrix is a
separate `nn.Linear` (q, k, v, o, fc, proj) so Muon orthogonalises each one on its own.

The forward reads as docs/records.md's, one part per line:

    embed → smear → RMSNorm (+ bigram term)   model/embedding.py, model/bigram.py
    x0, value lookups, masks, YaRN: once      model/context.py, model/step_inputs.py, model/masks.py
    the layers of the plan, with their skips  model/plan.py, model/block.py, model/residual.py
    backout or MUDD → RMSNorm → head → loss   model/residual.py, model/mudd.py, model/head.py,
                                              model/loss.py

What each layer has comes from the layer plan; options that are off build nothing and cost
nothing. Parameter names (and so optimizer groups and checkpoints) are the module tree's:
`embed`, `value_embeds.<t>`, `blocks.<ℓ>.attn.*`, `blocks.<ℓ>.mlp.*`, `lm_head`, the scalars.
"""

from typing import Any

import torch
from torch import Tensor, nn

from model.bigram import BigramHash
from model.block import Block
from model.config import ModelConfig
from model.config.kernel_step import KernelStep
from model.context import Context
from model.embedding import smear, value_tables
from model.flops import StepFlops
from model.forward_context import build_context
from model.forward_schedule import check_stages, yarn_windows
from model.head import head_logits
from model.init import initialise
from model.kv_cache import KVCache
from model.layers import linear, rms_norm
from model.loss import model_loss
from model.mlp_fp8 import delayed_states, fp8_rank_state, load_fp8_rank_state
from model.mudd import MUDD, mudd_out
from model.part import Part
from model.plan import describe_plan, layer_plan, mask_kinds
from model.points import Points
from model.record_loss import record_head_loss
from model.residual import Skips, SublayerScales, X0Injection, X0Lambdas
from model.rotary import Rotary
from model.scalars import Scalars
from model.step_inputs import step_inputs
from model.tensor_parallel import plan as tensor_parallel_plan
from model.values import ValueGates
from model.varlen import varlen_support
from model.xsa import XSA
from model.yarn import yarn_table
from stages import StageTable


def built(*found: nn.Module | None) -> tuple[nn.Module, ...]:
    """Those of `found` that are built (on), in order: the parts acting at one point."""
    return tuple(p for p in found if p is not None)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, stages: StageTable | None = None) -> None:
        """The model of `cfg`; `stages`: the run's stage table (train.stages), whose long
        windows the YaRN tables follow (none: no stages)."""
        super().__init__()
        check_stages(cfg, stages or StageTable())
        cfg.validate()
        self.cfg = cfg
        self.plan = layer_plan(cfg)
        rows = cfg.embed.rows or cfg.vocab_size
        res, emb, plan = cfg.residual, cfg.embed, self.plan
        # The parts the config turned on; an option that is off is None and never called.
        # Registration order is the parameters' order (optimizer groups, checkpoints).
        self.embed = nn.Embedding(rows, cfg.n_embd)
        self.embed2 = nn.Embedding(rows, cfg.n_embd) if emb.second_table else None
        self.value_embeds = value_tables(cfg, plan, rows)
        self.blocks = nn.ModuleList([Block(cfg, spec, i) for i, spec in enumerate(plan)])
        self.skips = Skips(cfg, plan)
        self.lm_head = linear(cfg, cfg.n_embd, cfg.vocab_size)
        # w_smear (1 × k): an nn.Linear as the record's (bf16 in a bf16 model)
        self.smear_gate = linear(cfg, cfg.gate_channels, 1) if emb.smear else None
        self.scalars = Scalars(cfg)
        self.sublayer_scales = SublayerScales(cfg) if res.sublayer_scales else None
        self.xsa = XSA(cfg, plan) if "X" in cfg.attention.xsa else None
        self.value_gates = ValueGates(cfg, plan) if ValueGates.wanted(cfg, plan) else None
        self.x0_injection = X0Injection(cfg) if res.x0_after_attention else None
        self.x0_lambdas = X0Lambdas(cfg) if res.x0_lambdas else None
        self.mudd = MUDD(cfg, plan) if res.mudd else None
        self.bigram = BigramHash(cfg) if cfg.bigram.rows else None
        # Where each part acts (model/points.py): not a module, so nothing registers twice
        self.points = Points(
            self.scalars, x0_mix=self.x0_lambdas, sublayer_scales=self.sublayer_scales,
            value_gates=self.value_gates, after_heads=built(self.xsa),
            after_attention=built(self.x0_injection, self.bigram),
            after_layers=self.mudd,
        )  # fmt: skip
        att = cfg.attention
        windows = yarn_windows(cfg, stages)
        self.rotary = Rotary(
            cfg.head_dim, att.rope_base, att.rope, att.rope_bf16, att.rope_reciprocal, windows,
            att.window_block, att.yarn_max_window,
        )  # fmt: skip
        scales = None  # the attention scale of each YaRN stage, as exact as the config's floats
        if att.yarn:
            scales = yarn_table(
                self.rotary.inv_freq,
                windows,
                att.window_block,
                att.scale or cfg.head_dim**-0.5,
                att.yarn_max_window,
            ).attn_scales
        # As Python floats too: the varlen kernel takes its scale as one (model/varlen.py)
        self.yarn_scale_list: list[float] | None = scales
        if scales is not None:
            scales = torch.tensor(scales, dtype=torch.float64)
        self.register_buffer("yarn_scales", scales, persistent=False)
        self._mask_kinds = mask_kinds(self.plan)  # (normal, paired): the masks to build
        self.micro_steps = 1  # the trainer sets its own (the property below)
        self._flops: StepFlops | None = None  # counted on first use (N needs the parameters)
        if cfg.head.loss_kernel == "triton":  # the kernel as a torch op, before any compile
            from model.triton_loss import ops

            ops()
        self.reset_parameters()

    @property
    def micro_steps(self) -> int:
        """Micro-steps per optimizer step, each backpropagating loss / micro_steps: the FP8
        head's gradient cast undoes that factor (model/head.py), and the FP8 MLP keeps one
        delayed scale per micro-step (model/mlp_fp8.py). Set by the trainer."""
        return self._micro_steps

    @micro_steps.setter
    def micro_steps(self, k: int) -> None:
        """Also lays out the FP8 MLP's delayed scales for k slots on the model's device, a fresh
        start (a checkpoint puts its own back after), so that no forward creates state: a
        compiled forward would recompile once it had."""
        self._micro_steps = k
        device = next(self.parameters()).device
        for state in delayed_states(self.blocks).values():
            state.reset(k, device)

    def check_device(self, device: torch.device) -> None:
        """Raise ValueError, naming the key, where this model's kernels cannot run on
        `device` (the trainer asks before the first step)."""
        att = self.cfg.attention
        if att.impl == "varlen" and (why := varlen_support(device)) is not None:
            raise ValueError(
                f"model.attention.impl=varlen: {why}; use model.attention.impl=auto (FlexAttention "
                "on CUDA, SDPA elsewhere)"
            )
        if self.cfg.mlp.fp8_kernel == "triton":
            from model.triton_mlp import available as mlp_kernel

            if (why := mlp_kernel(device)) is not None:
                raise ValueError(
                    f"model.mlp.fp8_kernel=triton: {why}; use model.mlp.fp8_kernel=torch"
                )
        if self.cfg.head.loss_kernel == "triton":
            from model.triton_loss import available

            if (why := available(device)) is not None:
                raise ValueError(
                    f"model.head.loss_kernel=triton: {why}; use model.head.loss_kernel=torch"
                )

    def reset_parameters(self) -> None:
        """Initialise as the records do (model/init.py)."""
        initialise(self)

    def fsdp_units(self) -> list[nn.Module]:
        """The modules FSDP2 shards as units of their own: every embedding table and every
        block. The rest (the LM head and the scalars) stays in the root unit: the FP8 head
        reads its weight directly, not through its forward, so it must be gathered when the
        model's own forward starts."""
        blocks = [b for b in self.blocks if next(b.parameters(), None) is not None]  # not empty
        second = [] if self.embed2 is None else [self.embed2]
        values = [] if self.value_embeds is None else list(self.value_embeds.values())
        parts = [unit for part in self.parts() for unit in part.fsdp_units()]  # the bigram table
        return [self.embed, *second, *values, *parts, *blocks]

    def parts(self) -> list[Part]:
        """The parts that are on (model/part.py), in the order they are registered."""
        return [m for m in self.children() if isinstance(m, Part)]

    def tp_plan(self) -> dict[str, Any]:
        """`parallelize_module`'s plan for dist.tensor_parallel: each block's heads and MLP
        hidden units split over the TP ranks (model/tensor_parallel.py)."""
        return tensor_parallel_plan(self)

    def count_flops(
        self,
        idx: Tensor,
        window_tokens: Tensor | float | None = None,
        short_window_tokens: Tensor | float | None = None,
        yarn_stage: Tensor | None = None,
        mtp_weights: Tensor | None = None,
        kernel_step: KernelStep | None = None,
    ) -> Tensor:
        """Training FLOPs of one forward and backward over `idx` (model/flops.py), a 0-d
        tensor on its device; the forward's step arguments as it takes them (the YaRN stage
        the MTP weights and the varlen kernel's step change no FLOPs)."""
        if self._flops is None:
            self._flops = StepFlops.of(self)
        return self._flops(idx, window_tokens, short_window_tokens)

    def rank_state(self) -> dict:
        """What this rank keeps that the parameters don't and a checkpoint must: the FP8 MLP's
        delayed scales (model/mlp_fp8.py); {} when there is none."""
        return fp8_rank_state(delayed_states(self.blocks))

    def load_rank_state(self, saved: list[dict], rank: int, world_size: int) -> str | None:
        """Put back `rank_state()` of every saved rank (in rank order) on `rank` of
        `world_size`; returns a line saying what each rank took, None if nothing to do."""
        states = delayed_states(self.blocks)
        device = next(self.parameters()).device
        return load_fp8_rank_state(states, saved, rank, world_size, self.micro_steps, device)

    def plan_summary(self) -> str:
        """The layer plan in one line, "" when every layer is alike."""
        res = self.cfg.residual
        if not self.cfg.differs_per_layer:
            return ""
        extras = [f"gated skip {a} -> {b}" for a, b in res.skips]
        extras += [f"backout {res.backout_layer}"] if res.backout_layer >= 0 else []
        return " | ".join([describe_plan(self.plan), *extras])

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        window_tokens: Tensor | None = None,
        short_window_tokens: Tensor | None = None,
        yarn_stage: Tensor | None = None,
        mtp_weights: Tensor | None = None,
        kernel_step: KernelStep | None = None,
        cache: KVCache | None = None,
        last: bool = False,
    ) -> Tensor:
        """Logits (B, T, vocab) when `targets` is None, else the cross-entropy loss (the mean,
        or in training with model.head.reduction=sum the sum over tokens). `last`: the logits
        of the last position only (B, 1, vocab). `cache`: generation's keys and values so far;
        `idx` is then the tokens after them (model/kv_cache.py).

        The step arguments (model/step_inputs.py): `window_tokens`, the long sliding window, in
        tokens; `short_window_tokens`, the short one (token windows only; block windows halve
        the long one); `yarn_stage`, the YaRN stage (None = stage 0); `mtp_weights`, the
        multi-token weights (K_max,) that training with model.head.mtp needs (model/mtp.py);
        `kernel_step`, the same step as the varlen kernel's Python numbers, which
        model.attention.impl=varlen reads instead (model/varlen.py).
        """
        step = step_inputs(
            self.cfg.attention, self.yarn_scales, window_tokens, short_window_tokens, yarn_stage
        )
        x, x0, bigram = self._embed(idx)
        ctx = build_context(self, idx, x0, step, bigram, kernel_step, cache)
        x = self._layers(x, x0, ctx)
        if cache is not None:
            cache.end(idx.size(1))
        x = x[:, -1:] if last and targets is None else x
        return self._head(x, targets, mtp_weights if self.cfg.head.mtp else None)

    def _embed(self, idx: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """(x, x0, b): the stream's start, RMSNorm of the (smeared) token embeddings, with
        λ^bg_0·b added where the bigram part is on (model/bigram.py); x0, the same tensor
        with model.bigram.in_x0 (the record's in-place add), else without the term;
        b, the bigram term (None when off)."""
        e = self.embed(idx)
        if self.smear_gate is not None:
            e = smear(e, self.smear_gate, self.scalars.smear(), self.cfg.gate_channels)
        x0 = rms_norm(e)
        return (x0, x0, None) if self.bigram is None else self.bigram.start(idx, x0)

    def _layers(self, x: Tensor, x0: Tensor, ctx: Context) -> Tensor:
        """The plan's layers in order, each input with the skips that end there, then the
        backout (model/residual.py), or MUDD's mix (model/mudd.py); an empty layer only
        passes x on. After model.residual.attn_input_layer, attention reads that layer's
        output."""
        res = self.cfg.residual
        source = res.attn_input_layer
        outputs: list[Tensor] = []
        for i, block in enumerate(self.blocks):
            x = layer_input = self.skips.into(self.scalars, i, x, outputs, x0)
            if not self.plan[i].empty:
                attn_input = outputs[source] if 0 <= source < i else None
                x = block(x, self.rotary, ctx, self.points, attn_input)
            outputs.append(x)
        if self.points.after_layers is not None:  # MUDD's mix; layer_input is its c₉
            ve0 = ctx.value_embeds[0]
            c7, c3 = outputs[source], outputs[res.skips[0][0]]
            return mudd_out(x, self.points.after_layers.net, ctx.x0, c7, layer_input, ve0, c3)
        return self.skips.out(self.scalars, x, outputs)

    def _head(self, x: Tensor, targets: Tensor | None, mtp_weights: Tensor | None) -> Tensor:
        """RMSNorm → the LM head (FP8 in training where on) → the softcapped logits or loss;
        in training with model.head.loss=sigmoid_e5m2_grad head and loss in one
        (model/record_loss.py)."""
        cfg = self.cfg
        if self.training and targets is not None and cfg.head.loss == "sigmoid_e5m2_grad":
            if cfg.head.mtp and mtp_weights is None:
                raise ValueError("model.head.mtp: the training forward needs mtp_weights")
            return record_head_loss(
                self.lm_head, rms_norm(x), targets, mtp_weights, cfg.head,
                cfg.numerics.fp8_scales, self.micro_steps,
            )  # fmt: skip
        logits = head_logits(
            self.lm_head, rms_norm(x), cfg.head.fp8, self.micro_steps, cfg.numerics.fp8_scales
        )
        return model_loss(logits, targets, cfg.head, self.training, mtp_weights)
