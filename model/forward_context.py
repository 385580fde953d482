"""What one forward of the GPT shares across its layers, computed once before the first: the
masks (dense, block or varlen segments, or a KV cache's), the attention scale of the step's
YaRN stage, x0 and the second table's x02, the value-embedding lookups (model/context.py's
`Context`). The model's parts are not in it: they act at the forward's named points
(model/points.py)."""

from torch import Tensor, nn

from model.config.kernel_step import KernelStep
from model.context import Context
from model.embedding import value_lookups
from model.kv_cache import KVCache, blockers
from model.layers import rms_norm
from model.masks import build_masks
from model.step_inputs import StepInputs
from model.varlen import Segments, varlen_masks


def build_context(
    model: nn.Module,  # the GPT (model/gpt.py), whose parts and settings it reads
    idx: Tensor,
    x0: Tensor,
    step: StepInputs,
    bigram: Tensor | None,
    kernel_step: KernelStep | None = None,
    cache: KVCache | None = None,
) -> Context:
    """The context of `model`'s forward over `idx`; with `cache`, of the tokens after the
    cached ones, masked by the cache (model/kv_cache.py)."""
    att, res = model.cfg.attention, model.cfg.residual
    if cache is not None:
        if found := blockers(model.cfg):
            raise ValueError(f"a KV cache cannot serve this model: {', '.join(found)}")
        cache.begin(idx)
    if att.impl == "varlen":
        masks, scale = varlen_inputs(model, idx, kernel_step)
    else:
        kinds, paired = model._mask_kinds
        masks = None
        if cache is None:
            masks = build_masks(
                idx, att.document_mask, kinds, step.window, att.window_block, impl=att.impl,
                token_window=att.window_granularity == "token", short_window=step.short,
                paired=paired,
            )  # fmt: skip
        # YaRN's scale of the stage, else the config's (None: SDPA's own 1/√D)
        scale = step.attn_scale if step.attn_scale is not None else att.scale or None
    return Context(
        x0=x0 if res.x0_shortcut or res.x0_after_attention or res.mudd else None,
        x02=None if model.embed2 is None else rms_norm(model.embed2(idx)),
        value_embeds=value_lookups(model.value_embeds, idx),
        masks=masks,
        yarn_stage=step.yarn_stage,
        attn_scale=scale,
        bigram_term=bigram,
        micro_steps=model.micro_steps,
        kv=cache,
    )


def varlen_inputs(
    model: nn.Module, idx: Tensor, step: KernelStep | None
) -> tuple[dict[str | None, Segments], float | None]:
    """model.attention.impl=varlen: the masks as segments and the scale as a Python float
    (YaRN's of the stage, else the config's; None: the kernel's 1/√D). Training takes the
    step's segments a row and longest segment, evaluation max_segments and whole rows."""
    att = model.cfg.attention
    if step is None:
        raise ValueError(
            "model.attention.impl=varlen: the forward needs kernel_step (the run's schedule "
            "gives it: model/forward_schedule.py)"
        )
    B, T = idx.shape
    row_segments, max_len = step.row_segments, step.max_len
    if not model.training:
        row_segments, max_len = att.max_segments, 0
    windows = {None: -1, "long": step.long, "short": step.short}
    kinds, paired = model._mask_kinds
    masks = varlen_masks(
        idx, att.document_mask, kinds, paired, windows, B * row_segments, min(max_len or T, T)
    )
    if model.yarn_scale_list is not None:
        return masks, model.yarn_scale_list[step.yarn_stage]
    return masks, att.scale or None
