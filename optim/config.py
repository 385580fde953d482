"""The `optim` config group: which optimizers, their settings, and the LR schedule.

Every schema of `optim.*` is here, with the vocabulary of its choices, so that this module
imports nothing else of `optim/` and every implementation imports its settings from it.
A field's `resume` metadata says how a checkpoint treats it: "must_match" (the resumed run
must have the saved value), "operational" (how a run executes, never its numbers: changing it
is silent); unmarked fields may change on resume, with a warning.
"""

import itertools
from dataclasses import dataclass, field, fields

MUST_MATCH = {"resume": "must_match"}
OPERATIONAL = {"resume": "operational"}

# `optim.name` -> the group that takes the hidden matrices.
MATRIX_GROUP = {"muon_adamw": "muon", "adamw": "hidden"}
MOMENTUM_FORMS = ("ema", "accumulate")
NS_COEFFICIENTS = ("classic", "polar_express")
# How each Newton–Schulz iteration is evaluated (optim/muon/newton_schulz.py: NS forms).
NS_FORMS = ("factored", "factored_unfused", "expanded", "gram")
NS_DTYPES = ("auto", "bf16", "fp32")
LR_SCALES = ("original", "match_rms_adamw", "none")
# How ranks share Muon's Newton–Schulz work (optim/muon/exchange.py).
EXCHANGES = ("all_reduce", "all_gather", "reduce_scatter")
# How Muon orthogonalises FSDP2 dim-0 shards (optim/muon/sharded.py).
SHARDED_NS = ("gather", "tp")
# How Muon's weight decay is applied (optim/muon/update.py: `apply_update`).
WEIGHT_DECAY_FORMS = ("decoupled", "cautious")
# Which matrices Muon sees in a (4, d, d) W_q, W_k, W_v, W_o stack; NorMuon's statistics axis
# and arithmetic; the master copy of bf16 matrices (optim/muon/normuon.py, master.py).
QK_SPLITS = ("none", "head_pairs")
NORMUON_AXES = ("columns", "shape")
NORMUON_FORMS = ("fp32", "record_2025_11", "record_2026_07")
MASTER_WEIGHTS = ("none", "fp32_truncated")
# Where Adam's ε enters (optim/adam.py), and the dtype of its moments.
EPS_PLACEMENTS = ("corrected", "raw")
STATE_DTYPES = ("param", "bf16", "fp32")
# The roles a parameter may take (optim/partition.py), and so route to (`optim.roles`).
ROLES = ("matrix", "embed", "head", "scalar")
# How the LR cooldown is drawn (optim/schedule.py: `lr_multiplier`).
COOLDOWN_FORMS = ("steps", "fraction", "from_step")


def check_choices(settings: object, prefix: str) -> None:
    """Raise ValueError naming the first field of `settings` whose value is not one of the
    `choices` its metadata lists (a standalone optimizer validates its settings here too)."""
    for f in fields(settings):  # type: ignore[arg-type]
        allowed = f.metadata.get("choices")
        if allowed is not None and getattr(settings, f.name) not in allowed:
            raise ValueError(
                f"{prefix}{f.name} must be one of {' | '.join(allowed)}, "
                f"got {getattr(settings, f.name)!r}"
            )


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
    """classic: the fixed quintic | polar_express: per-iteration quintics."""
    lr_scale: str = field(default="original", metadata={"choices": LR_SCALES})
    """LR factor by shape: original √max(1, rows/cols) | match_rms_adamw 0.2·√max(rows, cols)
    | none."""
    ns_form: str = field(default="factored", metadata={"choices": NS_FORMS})
    """How an iteration is evaluated: factored (fused sums) | factored_unfused (the 2025-01
    record's order) | expanded (the 2024-11 record's) | gram (the Gram iteration on
    elongated matrices: fewer FLOPs, more bf16 rounding)."""
    weight_decay: float = 0.0
    """The weight decay λ, applied as `weight_decay_form` says."""
    weight_decay_form: str = field(default="decoupled", metadata={"choices": WEIGHT_DECAY_FORMS})
    """decoupled: p ← p·(1 − η·λ), then the step | cautious (the 2025-11 record's): only
    where the update and the weight agree in sign, added to the update, O ← O + λ·η·[O⊙p ≥ 0]⊙p,
    so the decay scales with η² and the shape factor."""
    normuon_beta2: float = 0.0
    """NorMuon (the 2025-11 record's): after Newton–Schulz, each column of O (the mean of O²
    over the stored shape's rows, dim −2) is divided by the square root of its second-moment
    EMA with this β₂ (no bias correction), then O is rescaled to its former Frobenius norm.
    0 = off (Muon)."""
    normuon_axis: str = field(default="columns", metadata={"choices": NORMUON_AXES})
    """The axis of NorMuon's statistics: columns (the mean of O² over dim −2, one value per
    column, whatever the shape: the 2025-11 record's) | shape (over dim −1, one value per row,
    where rows ≥ cols, else per column: the 2026-07 record's)."""
    normuon_form: str = field(default="fp32", metadata={"choices": NORMUON_FORMS})
    """NorMuon's arithmetic: fp32 (O in the second moment's dtype, fp32 for fp32 matrices) |
    record_2025_11 (O stays in the Newton–Schulz dtype through the normalisation and the
    cautious decay term, O ← bf16(O + λη·M⊙W), and a bf16 matrix's decay coefficient is
    bf16(λ·η), not bf16(λ·bf16(η))) | record_2026_07 (both norms from the fp32 mean squares r,
    the factor ρ rounded to O's dtype, Ô = O·ρ). Needs normuon_beta2 > 0 unless fp32."""
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
    exchange: str = field(default="all_gather", metadata={"choices": EXCHANGES, **OPERATIONAL})
    """How ranks share the Newton–Schulz work: all_gather | all_reduce | reduce_scatter (Muon
    gradients skip DDP and go to their owners)."""
    sharded_ns: str = field(default="gather", metadata={"choices": SHARDED_NS})
    """Under dist.strategy=fsdp: gather (each matrix to an owner) | tp (tensor-parallel on
    the row shards, in place)."""
    qk_clip: float = 0.0
    """QK-clip τ: after each step, heads whose max logit exceeded τ get W_q, W_k scaled by
    √(τ/max); 0 = off. Acts only with model.attention.qk_norm=false."""

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


@dataclass
class AdamRow:
    """A row of `optim.adamw.table`: the Adam settings of the parameters its pattern matches
    (optim/adam_table.py); an unset beta keeps optim.adamw's."""

    lr_mul: float = 1.0
    """Factor on the group's LR: the tensor's LR is group LR × lr_mul × f(s)."""
    beta1: float | None = None
    """β₁ of these tensors (unset: optim.adamw.beta1)."""
    beta2: float | None = None
    """β₂ of these tensors (unset: optim.adamw.beta2)."""
    wd_mul: float = 1.0
    """Factor on optim.adamw.weight_decay for these tensors (0 = no decay)."""


@dataclass
class AdamWConfig:
    """torch's AdamW (`optim.adamw`), one param group and LR per role of parameter."""

    embed_lr: float = 0.3
    """Token (and value) embedding tables."""
    head_lr: float = 0.008
    """The untied LM head."""
    scalar_lr: float = 0.04
    """Every 0-D / 1-D parameter (gains, biases, lambdas)."""
    hidden_lr: float = 0.002
    """The hidden matrices, with optim.name=adamw only."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-10
    weight_decay: float = 0.0
    """λ, applied as `weight_decay_form` says (× a table row's wd_mul)."""
    weight_decay_form: str = field(default="decoupled", metadata={"choices": WEIGHT_DECAY_FORMS})
    """decoupled: p ← p·(1 − η·λ), then the step | cautious (record D's): p ← p − u −
    λ·η²·1[u⊙p > 0]⊙p in fp32, η the tensor's own LR, u the Adam step (optim/adam.py)."""
    eps_placement: str = field(default="corrected", metadata={"choices": EPS_PLACEMENTS})
    """corrected: m̂/(√v̂ + ε) as torch's AdamW | raw: √(1−β₂ᵗ)/(1−β₁ᵗ)·m/(√v + ε), ε on the
    raw √v (the 2025-11 record's)."""
    state_dtype: str = field(default="param", metadata={"choices": STATE_DTYPES})
    """The moments' dtype: the parameter's | bf16 for every parameter | fp32 for every
    parameter (record D's)."""
    update_every: int = 1
    """Update every k-th step with the sum of the k gradients since the last (2 in the
    2025-11 record: odd steps, gradients of steps s−1 and s); 1 = every step."""
    table: dict[str, AdamRow] = field(default_factory=dict)
    """Per-tensor settings: {name pattern (fnmatch, as optim.lr_mul): AdamRow}. Each pattern
    must match an Adam parameter, no parameter two patterns; unmatched ones keep the group's
    (record D's table, D.3)."""

    @property
    def torch_equivalent(self) -> bool:
        """Whether torch's AdamW computes these settings (else optim/adam.py does)."""
        ours = (self.eps_placement, self.state_dtype, self.update_every, self.weight_decay_form)
        return ours == ("corrected", "param", 1, "decoupled") and not self.table

    def validate(self) -> None:
        """Raise ValueError naming the `optim.adamw.*` key that is wrong."""
        check_choices(self, "optim.adamw.")
        if not (isinstance(self.update_every, int) and self.update_every >= 1):
            raise ValueError(
                f"optim.adamw.update_every must be an integer >= 1, got {self.update_every!r}"
            )
        for key in ("embed_lr", "head_lr", "scalar_lr", "hidden_lr", "weight_decay"):
            if getattr(self, key) < 0:
                raise ValueError(f"optim.adamw.{key} must be >= 0, got {getattr(self, key)}")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"optim.adamw.{key} must be in [0, 1), got {getattr(self, key)}")
        if self.eps <= 0:
            raise ValueError(f"optim.adamw.eps must be > 0, got {self.eps}")
        for pattern, row in self.table.items():
            key = f"optim.adamw.table[{pattern!r}]"
            if not isinstance(row, AdamRow):
                raise ValueError(f"{key} must be a row {{lr_mul, beta1, beta2, wd_mul}}")
            if not (row.lr_mul > 0 and row.wd_mul >= 0):
                raise ValueError(f"{key}: lr_mul must be > 0 and wd_mul >= 0, got {row}")
            for beta in ("beta1", "beta2"):
                value = getattr(row, beta)
                if value is not None and not 0 <= value < 1:
                    raise ValueError(f"{key}.{beta} must be in [0, 1), got {value}")


@dataclass
class ScheduleConfig:
    """The LR multiplier every param group shares (`optim.schedule`): warmup, constant,
    cooldown to a floor, over the scheduled steps (train.steps − train.extension_steps;
    extension steps run at the floor)."""

    warmup_steps: int = 0
    """Linear warmup from 0 to the full LR."""
    cooldown_frac: float = 0.4
    """The last fraction of the steps: linear decay to `min_lr_frac`."""
    min_lr_frac: float = 0.0
    """The LR floor at the end, as a fraction of each group's LR."""
    cooldown_form: str = field(default="steps", metadata={"choices": COOLDOWN_FORMS})
    """steps: over round(cooldown_frac · steps) whole steps | fraction: continuously in the
    fraction of training left (the 2025-01 record's formula) | from_step: from the whole step
    c = ⌊S·(1 − cooldown_frac)⌋ of the S scheduled steps, τ = min(1, (s − c)/(S − c)),
    factor p·(1 − τ) + min_lr_frac·τ with p the current peak (record D's)."""
    peaks: list[float] = field(default_factory=list)
    """The multiplier's plateau in each phase, the cooldown falling from the current one (the
    2025-11 record, whose batch grows by phase: [1.0, 1.51, 1.93]; record D: [1.0, 1.52,
    1.73]); [] = 1 throughout. Needs cooldown_form=fraction or from_step."""
    peak_edges: list[float] = field(default_factory=list)
    """Where the plateau steps up, in the fraction x = step / scheduled steps: peak i + 1
    from x > edge i on (the 2025-11 record: [0.33, 0.66]); one fewer than `peaks`. [] with
    several peaks: the P = len(peaks) equal phases of the scheduled steps, by the batch and
    window phases' rule min(⌊P·s / S⌋, P − 1) (record D: switches at exactly 460 and 920)."""

    def validate(self, total_steps: int) -> None:
        """Raise ValueError naming the `optim.schedule.*` key that is wrong; `total_steps` is
        the number of scheduled steps."""
        if self.warmup_steps < 0:
            raise ValueError(f"optim.schedule.warmup_steps must be >= 0, got {self.warmup_steps}")
        for key in ("cooldown_frac", "min_lr_frac"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(
                    f"optim.schedule.{key} must be in [0, 1], got {getattr(self, key)}"
                )
        cooldown = round(self.cooldown_frac * total_steps)
        if self.warmup_steps + cooldown > total_steps:
            raise ValueError(
                f"optim.schedule.warmup_steps ({self.warmup_steps}) + cooldown "
                f"({cooldown} = cooldown_frac * scheduled steps) exceed the scheduled steps "
                f"({total_steps} = train.steps - train.extension_steps)"
            )
        self._validate_peaks()

    def _validate_peaks(self) -> None:
        peaks, edges = list(self.peaks), list(self.peak_edges)
        if not peaks:
            if edges:
                raise ValueError(
                    f"optim.schedule.peak_edges ({edges}) needs optim.schedule.peaks (empty)"
                )
            return
        if not all(p > 0 for p in peaks):
            raise ValueError(f"optim.schedule.peaks must all be > 0, got {peaks}")
        if edges and len(edges) != len(peaks) - 1:
            raise ValueError(
                f"optim.schedule.peak_edges needs one edge fewer than optim.schedule.peaks "
                f"({len(peaks)}), or none (equal phases), got {len(edges)}: {edges}"
            )
        bounds = [0.0, *edges, 1.0]
        if not all(a < b for a, b in itertools.pairwise(bounds)):
            raise ValueError(
                f"optim.schedule.peak_edges must rise strictly inside (0, 1), got {edges}"
            )
        if self.cooldown_form not in ("fraction", "from_step"):
            raise ValueError(
                "optim.schedule.peaks needs optim.schedule.cooldown_form=fraction or from_step "
                f"(the cooldown falls from a phase's peak), got {self.cooldown_form!r}"
            )


@dataclass
class OptimConfig:
    """The `optim` group: the optimizers, their settings, the schedule, state offload."""

    name: str = field(default="muon_adamw", metadata={"choices": MATRIX_GROUP, **MUST_MATCH})
    """muon_adamw: Muon on the hidden matrices + AdamW on the rest | adamw: AdamW only."""
    muon: MuonConfig = field(default_factory=MuonConfig)
    adamw: AdamWConfig = field(default_factory=AdamWConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    offload: bool = field(default=False, metadata=OPERATIONAL)
    """Keep optimizer state in CPU memory between steps (optim/offload.py)."""
    lr_mul: dict[str, float] = field(default_factory=dict)
    """Per-parameter LR multipliers: {name pattern: factor}, patterns matched (fnmatch) against
    the parameters' qualified names, e.g. {"*mlp.fc*": 2.0} (the 2025-11 record's C_fc ×2).
    Muon scales the whole step of a match (its cautious decay too); AdamW needs a setting
    torch's AdamW lacks (optim/adam.py). Every pattern must match a parameter."""
    tie_embed_head_until: int = 0
    """Record D's tied token table and head (#51, #53; optim/tied.py): the step s (0-based)
    whose Adam update is the last tied one (record D: 921). Until then `embed.weight` takes no
    step of its own: at each Adam update its summed gradient is added to `lm_head.weight`'s,
    the head takes the step and the table becomes a copy of it; right after the update of
    step s the table's Adam state becomes the head's (m, v, update count) and from then on
    the two train apart. 0 = never tied. Needs model.embed.tied_init, optim/adam.py (a
    setting torch's AdamW lacks) and s an update step: s + 1 divisible by
    optim.adamw.update_every."""
    roles: dict[str, str] = field(default_factory=dict, metadata=MUST_MATCH)
    """Role routing: {name pattern (fnmatch): role}, overriding the role by shape
    (optim/partition.py), e.g. {"smear_gate.weight": "scalar"} puts a 2-D gate on Adam
    (record D's gates). Every pattern must match a parameter, none two with different roles."""

    def validate(self, total_steps: int, scheduled_steps: int | None = None) -> None:
        """Raise ValueError naming the `optim.*` key that is wrong. `total_steps`: train.steps;
        `scheduled_steps`: the LR schedule's span (train.steps − train.extension_steps),
        default all of them."""
        for pattern, factor in self.lr_mul.items():
            if not factor > 0:
                raise ValueError(f"optim.lr_mul[{pattern!r}] must be > 0, got {factor}")
        for pattern, role in self.roles.items():
            if role not in ROLES:
                raise ValueError(
                    f"optim.roles[{pattern!r}] must be one of {' | '.join(ROLES)}, got {role!r}"
                )
        self.muon.validate(total_steps)
        self.adamw.validate()
        self._validate_tie()
        self.schedule.validate(total_steps if scheduled_steps is None else scheduled_steps)

    def _validate_tie(self) -> None:
        until, every = self.tie_embed_head_until, self.adamw.update_every
        if not (isinstance(until, int) and until >= 0):
            raise ValueError(f"optim.tie_embed_head_until must be an integer >= 0, got {until!r}")
        if until and (until + 1) % every:
            raise ValueError(
                f"optim.tie_embed_head_until ({until}) must be a step on which Adam updates: "
                f"step + 1 divisible by optim.adamw.update_every ({every})"
            )
        if until and self.adamw.torch_equivalent:
            raise ValueError(
                "optim.tie_embed_head_until runs inside optim/adam.py's Adam: set one of "
                "optim.adamw.eps_placement / state_dtype / update_every (torch's AdamW has no tie)"
            )
