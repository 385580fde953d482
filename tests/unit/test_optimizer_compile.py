"""The compiled optimizer (optim.compile) against today's eager one, for every record preset's
settings (../conf/experiment/record_*.yaml), on small parameters of each kind the preset
steps: head-pair W_q/W_k/W_v/W_o stacks, tall MLP matrices with their LR factors, bf16 and
fp32 matrices; Adam's tables (the token table tied to the head), the head, fp32 scalars and
bf16 gates.

- Muon over banks, uncompiled, is the per-parameter step: bit for bit where every op is
  the same (record_2026_07_17's fp32-master step, record_2025_11_29's), to a fused
  multiply-add's rounding where ATen fuses one (the other records' `p.add_(O, alpha=−η)`).
- Compiled (inductor, or aot_eager: BACKENDS), Muon and Adam equal the eager step to its roundings
  (`close`: within a few units in the last place of each weight's dtype, on a small
  fraction of the entries), and nothing recompiles as the LR and momentum change; a
  misread (C_proj's LR factor unread) is far outside that.
"""

import re

import pytest
import torch

from optim.adam import Adam
from optim.adam_table import row_of
from optim.config import OptimConfig
from optim.muon.optimizer import Muon
from optim.tied import TiedEmbedHead
from tests.helpers import compose_config
from trainer.config import to_config
from trainer.launch.compile import CompileCounts, reset_compile_state

PRESETS = ["record_2024_11_06", "record_2025_01_26", "record_2025_11_29", "record_2026_07_17",
           "record_medium_2025_12_31"]  # fmt: skip
# The backend each preset's compiled step is checked with. Inductor generates the same bank and Adam
# functions for every preset, at other shapes: the NorMuon records (whose fp32 master and truncation
# are where its roundings could differ) compile with it; the plain Muon records trace the same
# graphs with aot_eager (graph counts, recompiles, what is read), without inductor's C++ builds
# (about 25 s of CI's time). record_medium_2025_12_31's step on the weights themselves is bit for
# bit its banks' (below): it traces.
BACKENDS = {"record_2024_11_06": "aot_eager", "record_2025_01_26": "aot_eager",
            "record_2025_11_29": "inductor", "record_2026_07_17": "inductor",
            "record_medium_2025_12_31": "aot_eager"}  # fmt: skip
BITWISE = {"record_2026_07_17", "record_medium_2025_12_31"}  # every op the same
D, HEAD_ROWS, VOCAB = 32, 16, 64  # head_dim 8: head pairs of 16 rows
STEPS = 4  # two of Adam's update pairs; LR and momentum change every step


def settings(preset: str) -> OptimConfig:
    return to_config(compose_config([f"experiment={preset}", "run_dir=."])).optim


def muon_params(cfg: OptimConfig, dtype: torch.dtype, misread: bool = False
                ) -> list[torch.nn.Parameter]:  # fmt: skip
    """A (4, d, d) W_q, W_k, W_v, W_o stack, two tall MLP matrices (the second with its
    preset's LR factor, unless `misread`) and a second stack, as the preset marks them."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(4, D, D), (4 * D, D), (4 * D, D), (4, D, D)]
    params = [torch.nn.Parameter(((torch.rand(s, generator=gen) - 0.5) / 8).to(dtype))
              for s in shapes]  # fmt: skip
    for p in params:
        p.muon_head_rows = HEAD_ROWS if p.ndim == 3 and cfg.muon.qk_split != "none" else 0
        p.lr_mul = 1.0
        if p.ndim == 3:  # as the model's merged attention declares it (optim/muon/stacks.py)
            p.stack_of = "q, k, v, o"
    params[2].lr_mul = 1.0 if misread else next(iter(cfg.lr_mul.values()), 1.0)
    # record_medium_2025_12_31: its bf16 8 × 16 gates beside fp32 matrices
    if cfg.muon.normuon_axis == "rows":
        gate = torch.nn.Parameter(torch.zeros(8, 16, dtype=torch.bfloat16))  # zero, as its init
        gate.muon_head_rows, gate.lr_mul = 0, 0.1
        params.append(gate)
    return params


def adam_params(dtype: torch.dtype) -> dict[str, torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(1)
    head = torch.randn(VOCAB, D, generator=gen) * 0.005
    made = {
        "embed.weight": head.clone(), "lm_head.weight": head,
        "value_embeds.0.weight": torch.randn(VOCAB, D, generator=gen) * 0.01,
        "scalars": torch.rand(24, generator=gen), "smear_gate.weight": torch.zeros(1, 12),
    }  # fmt: skip
    return {n: torch.nn.Parameter(t.to(torch.float32 if n == "scalars" else dtype))
            for n, t in made.items()}  # fmt: skip


def build(preset: str, backend: str | None, banks: bool, misread: bool = False):
    """The preset's Muon (and its optim/adam.py Adam, where it has one) on the parameters
    above; `backend`: compiled with it, else eager."""
    cfg = settings(preset)
    dtype = torch.bfloat16 if cfg.muon.master_weights != "none" else torch.float32
    mp = muon_params(cfg, dtype, misread)
    muon = Muon(mp, cfg.muon, ns_dtype=torch.bfloat16, banks=banks, compile_backend=backend)
    parts, params = [muon], list(mp)
    if not cfg.adamw.torch_equivalent:
        named = adam_params(dtype)
        names = list(named)
        rows = {}
        for n in names:
            hits = [pat for pat in cfg.adamw.table if pat in (n, n.replace(".0.", ".*."))]
            if hits:
                rows[n] = row_of(hits[0], cfg.adamw)
        adam = Adam([{"params": list(named.values()), "param_names": names, "lr": 0.008}],
                    cfg.adamw, rows, compile_backend=backend)  # fmt: skip
        if cfg.tie_embed_head_until:
            adam.tie = TiedEmbedHead(named["embed.weight"], named["lm_head.weight"], 2)
        parts.append(adam)
        params += list(named.values())
    return parts, params


def run(preset: str, backend: str | None, banks: bool = True, start: list | None = None,
        misread: bool = False) -> list[torch.Tensor]:  # fmt: skip
    """STEPS steps of random gradients; `start` collects the parameters before them;
    `misread`: C_proj's LR factor left at 1 (the negative control)."""
    parts, params = build(preset, backend, banks, misread)
    if start is not None:
        start += [p.detach().clone() for p in params]
    gen = torch.Generator().manual_seed(2)
    for step in range(STEPS):
        for opt in parts:
            for group in opt.param_groups:
                group["lr"] = group["lr"] * (0.9 if step else 1.0)
                if "momentum" in group:
                    group["momentum"] = 0.85 + 0.03 * step
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
        for opt in parts:
            opt.step()
    return [p.detach().clone() for p in params]


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a − b| in units of the last place of a's dtype at a's magnitude, or at the tensor's
    RMS for entries smaller than that (whose rounding errors come from terms that size)."""
    bits = {torch.bfloat16: 8, torch.float32: 24}[a.dtype]
    x = a.double()
    size = x.abs().clamp_min(x.square().mean().sqrt().item())
    scale = torch.exp2((torch.frexp(size).exponent - bits).double())
    return (x - b.double()).abs() / scale


def worst(a: list[torch.Tensor], b: list[torch.Tensor], start: list[torch.Tensor]) -> float:
    """The largest |a − b| of any tensor, as a fraction of the RMS of that tensor's mean
    step in run `a` (how far it moved from `start`, over STEPS)."""
    out = 0.0
    for x, y, s in zip(a, b, start, strict=True):
        step = (x.double() - s.double()).square().mean().sqrt().item() / STEPS
        out = max(out, (x.double() - y.double()).abs().max().item() / step)
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_banked_muon_is_the_per_parameter_step(preset: str) -> None:
    """Uncompiled banks against the per-parameter path: record_2026_07_17's step (an fp32 master)
    and record_medium_2025_12_31's (the same order on the weights, its bf16 gate's momentum lerped
    in fp32 as ATen lerps a bf16 tensor) bit for bit; the others' `p.add_(O, alpha=−η)`, one
    rounding in ATen (a fused multiply-add) and two on a stack with a factor per row, within a few
    units in the last place after 4 steps (measured: at most 3, in 16 to 29 % of the entries)."""
    per_param = run(preset, None, banks=False)
    banked = run(preset, None, banks=True)
    if preset in BITWISE:
        assert all(torch.equal(a, b) for a, b in zip(per_param, banked, strict=True))
    else:
        assert max(ulps(a, b).max().item() for a, b in zip(per_param, banked, strict=True)) <= 4


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_compiled_optimizer_equals_the_eager_one(preset: str) -> None:
    """Compiled with BACKENDS: within 10 % of one step's RMS of today's eager step (measured:
    record_2026_07_17 bit for bit but for a few fp32 scalars; the others up to a few percent, where
    a fused multiply-add's rounding of the momentum sends a bf16 Newton–Schulz iteration of
    an ill-conditioned matrix another way), and one graph per part (no recompile as the LR
    and momentum change; Adam's second is the untied update after the split). C_proj's LR
    factor unread moves C_proj by a whole step: 10 times that bound."""
    reset_compile_state()
    start: list[torch.Tensor] = []
    eager = run(preset, None, banks=False, start=start)
    before = CompileCounts.now()
    compiled = run(preset, BACKENDS[preset])
    graphs = (CompileCounts.now() - before).graphs
    assert graphs <= (3 if settings(preset).tie_embed_head_until else 2), graphs
    assert worst(eager, compiled, start) <= 0.1
    if settings(preset).lr_mul:  # record_2025_11_29 and record_2026_07_17 scale an MLP matrix
        assert worst(eager, run(preset, None, misread=True), start) > 1.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.compile=true", "optim.offload=true"], "can't run with optim.compile=true"),
        (["dist.parallelism=ddp_row_shards", "optim.offload=true"],
         "can't run with dist.parallelism=ddp_row_shards"),
        (["optim.compile=true", "dist.parallelism=fsdp_gather"], "optim.compile=true steps whole"),
        (["optim.compile=true", "dist.parallelism=fsdp_tp"],
         "which dist.parallelism=fsdp_tp shards"),
        (["dist.parallelism=everywhere"], "dist.parallelism must be one of ddp_all_gather"),
    ],
)  # fmt: skip
def test_combinations_that_cannot_run_are_refused_by_name(overrides: list, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        to_config(compose_config([*overrides, "run_dir=."]))
