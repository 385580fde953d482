"""`optim.muon`'s schema (`MuonConfig`) with the vocabulary of its choices, and what every
optim schema shares (the resume metadata, `check_choices`). Re-exported by optim/config.py,
the `optim` group's module; like it, this imports nothing else of `optim/` but the tables of
renamed option values (optim/renamed.py) and of the keys `dist.parallelism` replaced
(optim/parallelism.py)."""

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from optim.parallelism import replaced_message
from optim.renamed import RENAMED_VALUES, renamed_message
from stages.moved import refuse_keys

MUST_MATCH = {"resume": "must_match"}
OPERATIONAL = {"resume": "operational"}

MOMENTUM_FORMS = ("ema", "accumulate")
NS_COEFFICIENTS = ("classic", "polar_express", "custom")
# How each Newton–Schulz iteration is evaluated (optim/muon/newton_schulz.py: NS forms).
NS_FORMS = ("factored", "factored_unfused", "expanded", "gram")
NS_DTYPES = ("auto", "bf16", "fp32")
LR_SCALES = ("original", "match_rms_adamw", "unit_rms_norm", "none")
# How Muon's weight decay is applied (optim/muon/update.py: `finish`).
WEIGHT_DECAY_FORMS = ("decoupled", "cautious", "coupled")
# Which matrices Muon sees in a (4, d, d) W_q, W_k, W_v, W_o stack; NorMuon's statistics axis
# and arithmetic; the master copy of bf16 matrices (optim/muon/normuon.py, master.py).
QK_SPLITS = ("none", "head_pairs")
NORMUON_AXES = ("columns", "shape", "rows")
NORMUON_FORMS = ("fp32", "o_dtype", "fp32_mean_squares")
MASTER_WEIGHTS = ("none", "fp32_truncated")
# When the round-robin exchange runs: as Newton–Schulz finishes each run, or after it all.
OVERLAPS = ("auto", "async", "sync")
# The settings a param group of Muon may hold for itself (`MuonConfig.for_group`): its own
# Newton–Schulz, e.g. more iterations for its square matrices than for the rest.
NS_GROUP_KEYS = ("ns_steps", "ns_coefficients", "ns_custom", "ns_custom_norm_scale")


def check_choices(settings: object, prefix: str) -> None:
    """Raise ValueError naming the first field of `settings` whose value is not one of the
    `choices` its metadata lists (a standalone optimizer validates its settings here too), in
    one line naming today's value where it is an old one (optim/renamed.py)."""
    for f in fields(settings):  # type: ignore[arg-type]
        allowed, value = f.metadata.get("choices"), getattr(settings, f.name)
        if allowed is not None and value not in allowed:
            key = f"{prefix}{f.name}".removeprefix("optim.")
            if isinstance(value, str) and value in RENAMED_VALUES.get(key, {}):
                raise ValueError(renamed_message(key, value))
            raise ValueError(
                f"{prefix}{f.name} must be one of {' | '.join(allowed)}, "
                f"got {getattr(settings, f.name)!r}"
            )


@dataclass
class NSRow:
    """A row of `optim.muon.table`: the Newton–Schulz of the Muon matrices its pattern names
    (fnmatch on qualified names); an unset field keeps optim.muon's."""

    ns_steps: int | None = None
    ns_coefficients: str | None = None
    ns_custom: list[list[float]] | None = None
    ns_custom_norm_scale: float | None = None

    def given(self) -> dict[str, Any]:
        """The settings the row sets, as a param group carries them (NS_GROUP_KEYS)."""
        return {k: getattr(self, k) for k in NS_GROUP_KEYS if getattr(self, k) is not None}


@refuse_keys("optim.muon", {"exchange", "sharded_ns"}, replaced_message)
@dataclass
class MuonConfig:
    """Muon's settings (`optim.muon`), one object from the config to the update arithmetic:
    `optim/muon/optimizer.py` takes it whole, so a new setting is a field here and its use
    there."""

    lr: float = 0.02
    """Base LR, before the shape scale (`lr_scale`) and the schedule's multiplier."""
    momentum: float = 0.95
    """Momentum after its warmup."""
    momentum_warmup_start: float = 0.85
    """Momentum at step 0, raised linearly to `momentum`."""
    momentum_warmup_steps: int = 300
    """Steps of that warmup; 0 = constant momentum."""
    momentum_cooldown_steps: int = 0
    """Over the last this many of train.steps the momentum falls linearly from `momentum`
    towards `momentum_cooldown_end` (the 2025-11 record: 50); 0 = no cooldown. Where it
    overlaps the warmup (a run shorter than both), the warmup wins, as in the records."""
    momentum_cooldown_end: float = 0.85
    """Where that line would reach at train.steps (the last step, train.steps − 1, runs one
    step short of it: 0.852 in the 2025-11 record)."""
    nesterov: bool = True
    """Nesterov-style look-ahead on the momentum buffer."""
    momentum_form: str = field(default="ema", metadata={"choices": MOMENTUM_FORMS})
    """ema: buf ← μ·buf + (1−μ)·g, u = (1−μ)·g + μ·buf | accumulate: buf ← μ·buf + g,
    u = g + μ·buf (the 2024-11 record's)."""
    ns_steps: int = 5
    """Newton–Schulz iterations (Polar Express is retuned for each count)."""
    ns_coefficients: str = field(default="classic", metadata={"choices": NS_COEFFICIENTS})
    """classic: the fixed quintic | polar_express: per-iteration quintics | custom: the
    (a, b, c) tuples of `ns_custom`."""
    ns_custom: list[list[float]] = field(default_factory=list)
    """With ns_coefficients=custom: one [a, b, c] per iteration, the last repeated for any
    further one (one tuple: the same quintic every iteration, as torch.optim.Muon's
    ns_coefficients), at most ns_steps of them."""
    ns_custom_norm_scale: float = 1.0
    """With ns_coefficients=custom: the input is divided by this × its Frobenius norm (Polar
    Express's tuples want 1.02, a margin for bf16 rounding; the classic quintic 1)."""
    lr_scale: str = field(default="original", metadata={"choices": LR_SCALES})
    """LR factor by shape: original √max(1, rows/cols) | match_rms_adamw 0.2·√max(rows, cols)
    | unit_rms_norm √(rows/cols), i.e. √(out/in) of a (out, in) weight: the update's RMS→RMS
    operator norm is then η whatever the shape, wide matrices included | none."""
    extra_scale: float = 1.0
    """A factor on every matrix's step beside `lr_scale`'s (its cautious decay too): the LR
    a matrix steps with is lr × schedule × lr_scale(shape) × extra_scale × its lr_mul."""
    ns_form: str = field(default="factored", metadata={"choices": NS_FORMS})
    """How an iteration is evaluated: factored (fused sums) | factored_unfused (the 2025-01
    record's order) | expanded (the 2024-11 record's) | gram (the Gram iteration on
    elongated matrices: fewer FLOPs, more bf16 rounding)."""
    weight_decay: float = 0.0
    """The weight decay λ, applied as `weight_decay_form` says."""
    weight_decay_form: str = field(default="decoupled", metadata={"choices": WEIGHT_DECAY_FORMS})
    """decoupled: p ← p·(1 − η·λ), then the step | cautious (the 2025-11 record's): only
    where the update and the weight agree in sign, added to the update, O ← O + λ·η·[O⊙p ≥ 0]⊙p,
    so the decay scales with η² and the shape factor | coupled (L2, as TransformerEngine's Muon
    offers beside decoupled): the decay joins the gradient before the momentum, G ← G + λ·W,
    and goes through Newton–Schulz with it."""
    normuon_beta2: float = 0.0
    """NorMuon (the 2025-11 record's): after Newton–Schulz, each column of O (the mean of O²
    over the stored shape's rows, dim −2) is divided by the square root of its second-moment
    EMA with this β₂ (no bias correction), then O is rescaled to its former Frobenius norm.
    0 = off (Muon)."""
    normuon_axis: str = field(default="columns", metadata={"choices": NORMUON_AXES})
    """The axis of NorMuon's statistics: columns (the mean of O² over dim −2, one value per column,
    whatever the shape: the 2025-11 record's) | shape (over dim −1, one value per row, where rows ≥
    cols, else per column: the 2026-07 record's) | rows (over dim −1, one value per row, whatever
    the shape: record_medium_2025_12_31's, whose matrices are all tall or square but its 8 × 16
    gates, which it normalises per row too)."""
    normuon_form: str = field(default="fp32", metadata={"choices": NORMUON_FORMS})
    """NorMuon's arithmetic: fp32 (O in the second moment's dtype, fp32 for fp32 matrices) |
    o_dtype (O stays in its own, the Newton–Schulz dtype, through the normalisation and the
    cautious decay term, O ← bf16(O + λη·M⊙W), and a bf16 matrix's decay coefficient is
    bf16(λ·η), not bf16(λ·bf16(η)): the 2025-11 record's) | fp32_mean_squares (both norms from
    the fp32 mean squares r, the factor ρ rounded to O's dtype, Ô = O·ρ: the 2026-07 record's).
    Needs normuon_beta2 > 0 unless fp32."""
    qk_split: str = field(default="none", metadata={"choices": QK_SPLITS})
    """none | head_pairs: W_q and W_k of each (4, d, d) stack (model.attention.merged_qkvo)
    are orthogonalised and normalised as blocks of 2·head_dim rows (heads (0,1), (2,3), ...),
    W_v and W_o whole (the 2026-07 record's)."""
    master_weights: str = field(default="none", metadata={"choices": MASTER_WEIGHTS})
    """none | fp32_truncated (the 2026-07 record's, for bf16 matrices,
    model.numerics.bf16_matrices=true): each step updates an fp32 master, kept as the bf16
    weight plus a 16-bit mantissa buffer (+2 bytes per parameter), and the weight becomes the
    master truncated toward zero to bf16; the momentum and second moments are fp32 (+2 bytes
    per parameter against a bf16 momentum); cautious decay W ← W − (W⊙M)·λη·mη − O·mη."""
    eps: float = 1e-7
    """Added to the Frobenius norm before normalising."""
    ns_dtype: str = field(default="auto", metadata={"choices": NS_DTYPES})
    """Newton–Schulz precision: bf16 | fp32 | auto = bf16 where bf16 matmuls are native."""
    exchange_in_flight: int = field(default=0, metadata=OPERATIONAL)
    """Under dist.parallelism=fsdp_gather: how many shape buckets' exchanges (shards to their
    owners, rows back) may be live at once, bounding their buffers to that many buckets'; 0 =
    every bucket at once (the most overlap, the most memory). Bit for bit the same results."""
    exchange_overlap: str = field(default="auto", metadata={**OPERATIONAL, "choices": OVERLAPS})
    """Under dist.parallelism=ddp_all_gather | ddp_all_reduce: async starts each run of
    matrices' exchange as soon as its Newton–Schulz is done, so it travels while the next run
    computes (a run: the shape classes that share a batch); sync exchanges everything once
    Newton–Schulz is done, as a ring of point-to-point transfers on gloo; auto: async on
    NCCL, sync on gloo, where its ring beats gloo's own all-gather. Bit for bit the same."""
    free_grads: bool = field(default=True, metadata=OPERATIONAL)
    """Under dist.parallelism=fsdp_gather | fsdp_tp: drop each Muon gradient (`p.grad =
    None`) once its momentum has read it, so its memory is free before the exchange's
    buffers are taken (the trainer zeroes every gradient after the step anyway); false keeps
    them until `zero_grad`, for code that reads them after `step`."""
    exchange_chunk: int = field(default=0, metadata=OPERATIONAL)
    """Under dist.parallelism=fsdp_gather: at most this many matrices per bucket, a shape
    class cut in index order (−1: as many as ranks, so each rank owns about one per bucket;
    0: the whole class, one batched Newton–Schulz per shape). Smaller buckets bound the
    buffers further with exchange_in_flight. The same values where batched matmuls give a
    matrix the bits it gets alone (tests/e2e/test_sharded_muon.py)."""
    qk_clip: float = 0.0
    """QK-clip τ: after each step, heads whose max logit exceeded τ get W_q, W_k scaled by
    √(τ/max); 0 = off. Acts only with model.attention.qk_norm=false."""
    qk_clip_heads: list[str] = field(default_factory=list)
    """The heads QK-clip may scale: "L" (every head of attention layer L, counted from 0 in
    model order) or "L.h" (head h of it), e.g. ["0", "5.3"]; empty = every head. Every head's
    maximum is still logged. Checked against the model when the optimizer is built."""
    table: dict[str, NSRow] = field(default_factory=dict, metadata=MUST_MATCH)
    """Newton–Schulz by parameter: {name pattern: {ns_steps, ns_coefficients, ns_custom,
    ns_custom_norm_scale}}, e.g. {"*.attn.*": {ns_steps: 6}} for the square attention
    matrices; each row's matrices are a param group of their own, the others keep these
    settings. Every pattern must match a Muon parameter, and no parameter two patterns."""
    expert_keys: list[str] = field(default_factory=lambda: ["*.experts.*"])
    """Name patterns (fnmatch, on qualified names) of the (E, out, in) expert stacks: Muon
    orthogonalises each expert's matrix on its own, with the LR scale of one expert's shape.
    A Muon parameter of 3 or more dims that these do not name, and whose module does not
    declare a stack, is refused when the optimizer is built (optim/muon/stacks.py)."""

    def validate(self, total_steps: int | None = None) -> None:
        """Raise ValueError naming the `optim.muon.*` key that is wrong (a standalone `Muon`
        validates its settings here too, so the choices are checked here as well).
        `total_steps` (train.steps) is accepted for the callers' sake: a momentum warmup and
        cooldown that overlap in it are allowed (the warmup wins, optim/schedule.py)."""
        check_choices(self, "optim.muon.")
        if not self.lr >= 0:
            raise ValueError(f"optim.muon.lr must be >= 0, got {self.lr}")
        for key in ("momentum", "momentum_warmup_start", "momentum_cooldown_end", "normuon_beta2"):
            if not 0 <= getattr(self, key) < 1:
                raise ValueError(f"optim.muon.{key} must be in [0, 1), got {getattr(self, key)}")
        if not (isinstance(self.ns_steps, int) and self.ns_steps >= 1):
            raise ValueError(f"optim.muon.ns_steps must be an integer >= 1, got {self.ns_steps!r}")
        for key in ("momentum_warmup_steps", "momentum_cooldown_steps", "weight_decay", "qk_clip"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"optim.muon.{key} must be >= 0, got {getattr(self, key)}")
        if not self.eps > 0:
            raise ValueError(f"optim.muon.eps must be > 0, got {self.eps}")
        if not (isinstance(self.exchange_chunk, int) and self.exchange_chunk >= -1):
            raise ValueError(
                "optim.muon.exchange_chunk must be an integer >= 1, or 0 (a whole shape class) "
                f"or -1 (as many as ranks), got {self.exchange_chunk!r}"
            )
        if not (isinstance(self.exchange_in_flight, int) and self.exchange_in_flight >= 0):
            raise ValueError(
                "optim.muon.exchange_in_flight must be an integer >= 0 (0: unbounded), got "
                f"{self.exchange_in_flight!r}"
            )
        if not (self.extra_scale > 0 and math.isfinite(self.extra_scale)):
            raise ValueError(f"optim.muon.extra_scale must be > 0, got {self.extra_scale}")
        self._validate_custom()
        for pattern, row in self.rows().items():
            if not row.given():
                raise ValueError(f"optim.muon.table[{pattern!r}] sets nothing: give ns_steps, "
                                 "ns_coefficients, ns_custom or ns_custom_norm_scale")  # fmt: skip
            try:
                replace(self, table={}, **row.given()).validate()
            except ValueError as e:
                raise ValueError(f"optim.muon.table[{pattern!r}]: {e}") from e
        if self.qk_clip_heads and not self.qk_clip:
            raise ValueError(
                "optim.muon.qk_clip_heads is read only with optim.muon.qk_clip > 0: set the "
                "threshold or drop the heads"
            )
        if self.master_weights != "none" and self.qk_clip:
            # QK-clip rescales the bf16 weights after the step; the master would undo it.
            raise ValueError(
                "optim.muon.qk_clip > 0 is not supported with "
                f"optim.muon.master_weights={self.master_weights}"
            )
        if self.normuon_form != "fp32" and not self.normuon_beta2:
            raise ValueError(
                f"optim.muon.normuon_form={self.normuon_form} needs NorMuon "
                "(optim.muon.normuon_beta2 > 0)"
            )

    def rows(self) -> dict[str, NSRow]:
        """`table`'s rows as `NSRow`s (a config built in Python may give plain dicts)."""
        return {k: v if isinstance(v, NSRow) else NSRow(**v) for k, v in self.table.items()}

    def for_group(self, group: dict) -> "MuonConfig":
        """These settings with a param group's own values of NS_GROUP_KEYS (itself where the
        group holds none): a group of a standalone `Muon` may take its own Newton–Schulz
        steps and coefficients, as torch's optimizers take per-group settings."""
        own = {key: group[key] for key in NS_GROUP_KEYS if key in group}
        return replace(self, **own) if own else self

    def _validate_custom(self) -> None:
        """ns_custom's tuples: given exactly where ns_coefficients=custom reads them."""
        rows, key = self.ns_custom, "optim.muon.ns_custom"
        if self.ns_coefficients != "custom":
            if rows:
                raise ValueError(
                    f"{key} is read only with optim.muon.ns_coefficients=custom, got "
                    f"ns_coefficients={self.ns_coefficients}: set it to custom or drop {key}"
                )
            return
        if not rows:
            raise ValueError(
                f"optim.muon.ns_coefficients=custom needs {key}: one [a, b, c] per iteration"
            )
        for i, row in enumerate(rows):
            ok = len(row) == 3 and all(isinstance(x, int | float) and math.isfinite(x) for x in row)
            if not ok:
                raise ValueError(f"{key}[{i}] must be three finite numbers [a, b, c], got {row!r}")
        if len(rows) > self.ns_steps:
            raise ValueError(
                f"{key} gives {len(rows)} iterations, more than optim.muon.ns_steps "
                f"({self.ns_steps}): raise ns_steps or drop tuples"
            )
        scale = self.ns_custom_norm_scale
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"optim.muon.ns_custom_norm_scale must be > 0, got {scale}")
