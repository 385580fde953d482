"""record_2026_07_17's FP8 MLP (docs/records.md, D.1 "FP8 MLP"; model.mlp.fp8): in training forwards
the MLP's projections are FP8 GEMMs (`model.fp8.scaled_mm`), the backward stays bf16.

With n the normed input (T×d, bf16) and the bf16 weights c_fc (4d×d, or d×4d stored (in, out)
under model.mlp.fc_in_out) and c_proj (d×4d, (out, in), or the record's (in, out) 4d×d under
model.mlp.proj_in_out: c_proj transposed, the same products):

    up (#84, current scales):
        a = max|n|,  n₈ = e4m3(n·448/a);  s_up = bf16(max|c_fc|/448),  c_fc₈ = e4m3(c_fc/s_up)
        pre = bf16((n₈·c_fc₈ᵀ)·(a/448)·s_up),  post = ReLU²(pre) in bf16
    down (#89, delayed scales; mlp.fp8=up_down, else the bf16 post·c_projᵀ):
        s_act = h_act·m/448, m = this layer's max post in the previous training forward
                (s_act = 1 at the first step)
        s_w   = bf16(max|c_proj|/448) of the current weights at quantisations q ≤ B, then
                h_w·max|c_proj|/448 of the weights at quantisation q − 1 (one update older)
        post₈ = e4m3(min(post/s_act, 448)),  c_proj₈ = e4m3(clamp(c_proj/s_w, ±448))
        out = bf16((post₈·c_proj₈ᵀ)·s_act·s_w)
    backward (bf16, the bf16 weights and the FP8-derived pre and post):
        ∂c_proj = gᵀ·post,  ∂pre = 2·(g·c_proj)·ReLU(pre),  ∂c_fc = ∂preᵀ·n,  ∂n = ∂pre·c_fc

h_act, h_w, B: mlp.fp8_act_headroom (1.80), fp8_weight_headroom (1.12), fp8_bootstrap (16);
quantisation q is the one of optimizer step q (q = 0 before the first update).

Roundings (where the record's are unverified, these are chosen and explicit, so an eager and a
compiled model agree):
- each quotient before an e4m3 cast is taken in fp32 from the bf16 values and rounded once, by
  the cast, the way inductor computes the record's fused quantisation; n·448/a is (n·448)/a,
  n·448 being exact. (The FP8 head rounds X/x_s to bf16 first: model/head.py.)
- the up projection's quotients are not clamped: n·448/a ≤ 448, and c_fc/s_up exceeds 448
  only by s_up's bf16 rounding (< 449.8), which rounds to 448 whether a cast saturates or not.
  The down projection's are clamped to ±448 first, as the record's, so no result depends on
  what a cast does above 448 (torch 2.13's CPU cast saturates; a non-saturating one gives NaN).
- s_up and the bootstrap s_w are rounded to bf16, as bf16(fp32(m/448)), as the record says;
  a/448, s_act and the delayed s_w stay fp32: (h·m)/448.
- a zero maximum (c_proj's zero init) gives the scale 1: its operand is all zeros, so the
  product is 0 whatever the scale, where 0/0 would give NaN.
- the up projection accumulates in full fp32, the down projection with Hopper's fast
  accumulation (use_fast_accum, CUDA only), as the record states.

With model.mlp.fp8_kernel=triton (mlp.fp8=up_down) one Triton kernel computes pre, post,
post₈ and the maxima of post by output tile from the FP8 GEMM's tiles (model/triton_mlp.py),
where the torch path makes the product, then ReLU², the amax and post₈'s cast, each a pass
over the T×4d activations; its roundings are these, in this order. Its backward's ∂pre is a
second kernel, the product g·c_projᵀ with ·2·ReLU(pre) applied to each tile in registers, where
the torch path writes the product and reads it back (its roundings, too, are the ones above).

Slots: the record runs 8 ranks of one micro-batch each. A rank that takes k micro-steps per
update (gradient accumulation: model.micro_steps) plays k of them: micro-step i is the record's
rank r·k + i (the same rows of the global batch, data/loader.py). Each slot keeps its own max
post, so micro-step i's s_act comes from micro-step i of the previous step, and c_proj is
quantised once per update: 8 GPUs × 1 and 1 GPU × 8 micro-steps see the same scales.

Only training forwards (module.training with grad enabled) run in FP8 and move the delayed
scales; evaluation is the plain bf16 MLP. The scales are saved per rank with each checkpoint
(`GPT.rank_state`, trainer/checkpoint/state.py), and `load_fp8_rank_state` maps them onto a
resumed run's ranks, whatever its world size.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import MlpConfig
from model.fp8 import scaled_mm

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def amax_scale(m: Tensor, headroom: float | None = None) -> Tensor:
    """The fp32 divisor (h·m)/448 of a maximum m (0-d), m/448 without a headroom; 1 where
    m = 0."""
    m = m.float()
    if headroom is not None:
        m = m * headroom
    return torch.where(m > 0, m / E4M3_MAX, torch.ones_like(m))


def bf16_scale(m: Tensor) -> Tensor:
    """bf16(m/448) as fp32: the rounded current scales (s_up, the bootstrap s_w)."""
    return amax_scale(m).bfloat16().float()


class FP8MlpState:
    """One layer's delayed scales on this rank (mlp.fp8=up_down): plain tensors, not buffers,
    since DDP broadcasts buffers from rank 0 before each forward, which would overwrite each
    rank's own maxima (the reason `max_logit` is a plain attribute: model/attention.py).

    `forwards`: training forwards so far (int64, 0-d); `act_max`: the last max post of each of
    the k slots (fp32, (k,)); `w_max`: max|c_proj| at the previous and at the latest
    quantisation (fp32, (2,)). Made at the first training forward, on its device."""

    def __init__(self, cfg: MlpConfig) -> None:
        self.act_headroom, self.weight_headroom = cfg.fp8_act_headroom, cfg.fp8_weight_headroom
        self.bootstrap = cfg.fp8_bootstrap
        self.forwards: Tensor | None = None
        self.act_max: Tensor | None = None
        self.w_max: Tensor | None = None

    def reset(self, slots: int, device: torch.device) -> None:
        """A fresh start: no forward yet, k = `slots`."""
        self.forwards = torch.zeros((), dtype=torch.int64, device=device)
        self.act_max = torch.zeros(slots, dtype=torch.float32, device=device)
        self.w_max = torch.zeros(2, dtype=torch.float32, device=device)

    def scales(self, c_proj: Tensor, slots: int) -> tuple[Tensor, Tensor, Tensor]:
        """(s_act, s_w, slot) of this forward for the weight `c_proj`; on the device, no host
        sync (the step's branches are `torch.where`s)."""
        if self.forwards is None:
            self.reset(slots, c_proj.device)
        if self.act_max.numel() != slots:
            raise ValueError(
                f"the FP8 MLP's state has {self.act_max.numel()} micro-step slots, the model "
                f"now takes {slots} micro-steps per update: set micro_steps before training"
            )
        step, slot = self.forwards // slots, self.forwards % slots
        now = c_proj.detach().abs().amax().bfloat16().float()  # = max|bf16(c_proj)|
        prev = torch.where(slot == 0, self.w_max[1], self.w_max[0])  # a new step: shift
        self.w_max = torch.stack([prev, now])
        s_w = torch.where(
            step <= self.bootstrap, bf16_scale(now), amax_scale(prev, self.weight_headroom)
        )
        mine = self.act_max.index_select(0, slot.reshape(1))[0]  # no host sync: no graph break
        delayed = amax_scale(mine, self.act_headroom)
        s_act = torch.where(step == 0, torch.ones_like(delayed), delayed)
        return s_act, s_w, slot

    def record(self, slot: Tensor, post_max: Tensor) -> None:
        """Keep this forward's max post in its slot, for the same slot's next forward."""
        self.act_max = self.act_max.index_put((slot,), post_max.float())
        self.forwards = self.forwards + 1

    def state_dict(self) -> dict:
        """The state on the CPU (empty before the first forward)."""
        if self.forwards is None:
            return {"forwards": 0, "act_max": torch.zeros(0), "w_max": torch.zeros(2)}
        return {
            "forwards": int(self.forwards),
            "act_max": self.act_max.cpu(),
            "w_max": self.w_max.cpu(),
        }


def _e4m3(x: Tensor, bound: float | None = None) -> Tensor:
    """e4m3 of the fp32 x, clamped to ±bound first when given."""
    return (x if bound is None else x.clamp(-bound, bound)).to(E4M3)


class FP8MlpFunction(torch.autograd.Function):
    """The MLP of the module docstring over n (T×d, bf16): (out, max post). `down`: (s_act,
    s_w) for the FP8 down projection, None for the bf16 one."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        n: Tensor,
        w_fc: Tensor,
        w_proj: Tensor,
        in_out: tuple[bool, bool],
        down: tuple[Tensor, Tensor] | None,
        fused: bool = False,
    ) -> tuple[Tensor, Tensor]:
        fc_in_out, proj_in_out = in_out
        c_fc, c_proj = w_fc.to(torch.bfloat16), w_proj.to(torch.bfloat16)
        fc_t = c_fc if fc_in_out else c_fc.T  # (d, 4d): pre = n·fc_t
        a = n.abs().amax().float()
        a_safe = torch.where(a > 0, a, torch.full_like(a, E4M3_MAX))  # a = 0: scale 1
        n8 = _e4m3(n.float() * E4M3_MAX / a_safe)
        s_up = bf16_scale(fc_t.abs().amax())
        fc8 = _e4m3(fc_t.float() / s_up)
        proj_t = c_proj if proj_in_out else c_proj.T  # (4d, d): out = post·proj_t
        post8 = post_max = None
        if fused and down is not None:  # mlp.fp8_kernel=triton (model/triton_mlp.py)
            from model.triton_mlp import fused_up_relu2

            pre, post, post8, tiles = fused_up_relu2(n8, fc8.T, a_safe / E4M3_MAX, s_up, down[0])
            post_max = tiles.amax()
        else:
            pre = scaled_mm(n8, fc8, a_safe / E4M3_MAX, s_up, torch.bfloat16)
            post = F.relu(pre).square()
        if down is None:
            out = post @ proj_t
        else:
            s_act, s_w = down
            if post8 is None:
                post8 = _e4m3(post.float() / s_act, E4M3_MAX)  # post ≥ 0: min(·, 448)
            proj8 = _e4m3(proj_t.float() / s_w, E4M3_MAX)
            out = scaled_mm(post8, proj8, s_act, s_w, torch.bfloat16, use_fast_accum=True)
        if post_max is None:
            post_max = post.amax()
        ctx.mark_non_differentiable(post_max)
        ctx.save_for_backward(n, pre, post, c_fc, c_proj)
        ctx.in_out, ctx.dtypes = in_out, (w_fc.dtype, w_proj.dtype)
        ctx.fused = fused and down is not None
        return out, post_max

    @staticmethod
    def backward(ctx, g: Tensor, _: Tensor) -> tuple:  # type: ignore[override]
        n, pre, post, c_fc, c_proj = ctx.saved_tensors
        fc_in_out, proj_in_out = ctx.in_out
        g = g.to(torch.bfloat16)
        grad_proj = post.T @ g if proj_in_out else g.T @ post  # as c_proj is stored
        proj_t = c_proj if proj_in_out else c_proj.T
        if ctx.fused:  # the same ops in one kernel (model/triton_mlp.py)
            from model.triton_mlp import fused_relu2_grad

            d_pre = fused_relu2_grad(g.contiguous(), proj_t, pre)
        else:  # 2·(g·c_projᵀ)·ReLU(pre), the product rounded to bf16, then the result once
            d_pre = (g @ proj_t.T).mul_(2).mul_(F.relu(pre))
        grad_n = d_pre @ (c_fc.T if fc_in_out else c_fc)
        grad_fc = n.T @ d_pre if fc_in_out else d_pre.T @ n
        fc_dtype, proj_dtype = ctx.dtypes
        return grad_n, grad_fc.to(fc_dtype), grad_proj.to(proj_dtype), None, None, None


class FP8Mlp:
    """What an MLP with model.mlp.fp8 on holds beside its weights: C_fc's layout and, with
    mlp.fp8=up_down, the layer's delayed scales (None for mlp.fp8=up)."""

    def __init__(self, cfg: MlpConfig) -> None:
        self.in_out = (cfg.fc_in_out, cfg.proj_in_out)
        self.state = FP8MlpState(cfg) if cfg.fp8 == "up_down" else None
        self.fused = cfg.fp8_kernel == "triton"
        if self.fused:  # its kernels as torch ops, before anything is compiled
            from model.triton_mlp import ops

            ops()

    def __call__(self, fc: Tensor, proj: Tensor, x: Tensor, micro_steps: int) -> Tensor:
        """A training forward over x (..., d) with the weights `fc` and `proj`; updates the
        delayed scales (`micro_steps`: the slots, module docstring)."""
        down, slot = None, None
        if self.state is not None:
            s_act, s_w, slot = self.state.scales(proj, micro_steps)
            down = (s_act, s_w)
        flat = x.flatten(0, -2)
        out, post_max = FP8MlpFunction.apply(flat, fc, proj, self.in_out, down, self.fused)
        if self.state is not None:
            self.state.record(slot, post_max)
        return out.view(*x.shape[:-1], -1)


def delayed_states(blocks: nn.ModuleList) -> dict[int, FP8MlpState]:
    """The FP8 MLPs' delayed scales by layer (none unless mlp.fp8=up_down)."""
    out = {}
    for i, block in enumerate(blocks):
        fp8 = getattr(block.mlp, "fp8", None)  # a mixture of experts has none
        if fp8 is not None and fp8.state is not None:
            out[i] = fp8.state
    return out


def fp8_rank_state(states: dict[int, FP8MlpState]) -> dict:
    """This rank's delayed scales for a checkpoint: {"fp8_mlp": {layer: state}}, {} if none."""
    if not states:
        return {}
    return {"fp8_mlp": {str(i): s.state_dict() for i, s in states.items()}}


def load_fp8_rank_state(
    states: dict[int, FP8MlpState],
    saved: list[dict],
    rank: int,
    world_size: int,
    slots: int,
    device: torch.device,
) -> str | None:
    """Put back what `fp8_rank_state` gave on every saved rank (`saved`, in rank order) into this
    rank's `states`, this run taking `slots` micro-steps per update; returns the line to log.

    The saved slots, rank after rank, are the record's ranks 0 … V−1 (module docstring); this
    rank's slot i is the record's rank v = rank·slots + i and takes saved slot v mod V. With
    the same global batch (V unchanged, whatever the world size) every slot gets its own maxima
    back and the run goes on with exactly the scales it would have had. The step count and
    the weight maxima are every rank's alike (the weights are): saved rank 0's. A checkpoint
    without them (saved with mlp.fp8≠up_down) starts the bootstrap afresh."""
    if not states:
        return None
    ranks = [s.get("fp8_mlp", {}) for s in saved]
    if not ranks or any(str(i) not in ranks[0] for i in states):
        for state in states.values():
            state.reset(slots, device)
        return "FP8 MLP: the checkpoint holds no delayed scales; they start afresh (bootstrap)"
    for i, state in states.items():
        layer = [r[str(i)] for r in ranks]
        pool = torch.cat([r["act_max"].float() for r in layer])  # saved slots 0 … V−1
        first = layer[0]
        done = first["forwards"] // max(first["act_max"].numel(), 1)  # updates so far
        mine = torch.arange(rank * slots, (rank + 1) * slots)
        act = pool[mine % pool.numel()] if pool.numel() else torch.zeros(slots)
        state.forwards = torch.tensor(done * slots, dtype=torch.int64, device=device)
        state.act_max = act.to(device)
        state.w_max = first["w_max"].float().to(device)
    saved_slots, k = pool.numel(), first["act_max"].numel()
    layout = f"saved {len(saved)} rank(s) × {k} micro-step(s), now {world_size} × {slots}"
    if saved_slots == world_size * slots:
        return f"FP8 MLP delayed scales: each slot takes its own ({layout})"
    if saved_slots == 0:
        return f"FP8 MLP delayed scales: none saved before the first step ({layout})"
    return f"FP8 MLP delayed scales: slot v takes saved slot v mod {saved_slots} ({layout})"
