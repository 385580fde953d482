"""The `optim` config group: which optimizers, their settings, and the LR schedule.

Every schema of `optim.*` is here (Muon's in optim/muon/config.py, re-exported), with the
vocabulary of its choices, so that this module imports nothing else of `optim/` but that, and
every implementation imports its settings from it.
A field's `resume` metadata says how a checkpoint treats it: "must_match" (the resumed run
must have the saved value), "operational" (how a run executes, never its numbers: changing it
is silent); unmarked fields may change on resume, with a warning.
"""

from dataclasses import dataclass, field

from optim.muon.config import (  # noqa: F401  (re-exported: the optim group's vocabulary)
    LR_SCALES,
    MASTER_WEIGHTS,
    MOMENTUM_FORMS,
    MUST_MATCH,
    NORMUON_AXES,
    NORMUON_FORMS,
    NS_COEFFICIENTS,
    NS_DTYPES,
    NS_FORMS,
    OPERATIONAL,
    QK_SPLITS,
    WEIGHT_DECAY_FORMS,
    MuonConfig,
    check_choices,
)
from optim.parallelism import PARALLELISMS, replaced_message
from stages.moved import refuse_keys, refuse_moved

# `optim.name` -> the group that takes the hidden matrices.
MATRIX_GROUP = {"muon_adamw": "muon", "adamw": "hidden"}
# Where Adam's ε enters (optim/adam.py), and the dtype of its moments.
EPS_PLACEMENTS = ("corrected", "raw")
STATE_DTYPES = ("param", "bf16", "fp32")
# The roles a parameter may take (optim/partition.py), and so route to (`optim.roles`).
ROLES = ("matrix", "embed", "head", "scalar")
# How the LR cooldown is drawn (optim/schedule.py: `lr_multiplier`).
COOLDOWN_FORMS = ("steps", "fraction", "from_step")
# When the tied token table's gradient joins the head's (optim/tied.py)
TIE_SUMS = ("update", "step")
# torch.compile backends for `optim.compile_backend` (as model.compile_backend's)
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


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
    """decoupled: p ← p·(1 − η·λ), then the step | cautious (record_2026_07_17's): p ← p − u −
    λ·η²·1[u⊙p > 0]⊙p in fp32, η the tensor's own LR, u the Adam step (optim/adam.py)."""
    eps_placement: str = field(default="corrected", metadata={"choices": EPS_PLACEMENTS})
    """corrected: m̂/(√v̂ + ε) as torch's AdamW | raw: √(1−β₂ᵗ)/(1−β₁ᵗ)·m/(√v + ε), ε on the
    raw √v (the 2025-11 record's)."""
    state_dtype: str = field(default="param", metadata={"choices": STATE_DTYPES})
    """The moments' dtype: the parameter's | bf16 for every parameter | fp32 for every
    parameter (record_2026_07_17's)."""
    update_every: int = 1
    """Update every k-th step with the sum of the k gradients since the last (2 in the
    2025-11 record: odd steps, gradients of steps s−1 and s); 1 = every step."""
    table: dict[str, AdamRow] = field(default_factory=dict)
    """Per-tensor settings: {name pattern (fnmatch, as optim.lr_mul): AdamRow}. Each pattern
    must match an Adam parameter, no parameter two patterns; unmatched ones keep the group's
    (record_2026_07_17's table, D.3)."""

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


@refuse_moved("optim.schedule")
@dataclass
class ScheduleConfig:
    """The LR multiplier every param group shares (`optim.schedule`): warmup, constant (or a
    plateau per stage, the stage table's lr_peak column: train.stages.rows.N.lr_peak),
    cooldown to a floor, over the scheduled steps (train.steps − train.extension_steps;
    extension steps run at the floor)."""

    warmup_steps: int = 0
    """Linear warmup from 0 to the full LR."""
    cooldown_frac: float = 0.4
    """The last fraction of the steps: linear decay to `min_lr_frac`."""
    min_lr_frac: float = 0.0
    """The LR floor at the end, as a fraction of each group's LR."""
    cooldown_form: str = field(default="steps", metadata={"choices": COOLDOWN_FORMS})
    """steps: over round(cooldown_frac · steps) whole steps | fraction: continuously in the fraction
    of training left (the 2025-01 record's formula) | from_step: from the whole step c = ⌊S·(1 −
    cooldown_frac)⌋ of the S scheduled steps, τ = min(1, (s − c)/(S − c)), factor p·(1 − τ) +
    min_lr_frac·τ with p the current peak (record_2026_07_17's). Plateaus by stage
    (train.stages.rows.N.lr_peak) need fraction or from_step."""

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


@refuse_keys("optim", {"distribute"}, replaced_message)
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
    compile: bool = field(default=False, metadata=OPERATIONAL)
    """Compile the update: Muon's matrices stepped as banks, stacks of one shape
    (optim/muon/banks.py), optim/adam.py's due tensors through one function (optim/adam_update.py),
    each one compiled graph; the same arithmetic as the uncompiled step to a few roundings
    (docs/optimizer-speed.md). The conf/optim files set it to model.compile's value."""
    compile_backend: str = field(
        default="inductor", metadata={"choices": COMPILE_BACKENDS, **OPERATIONAL}
    )
    """torch.compile backend of `compile`: inductor generates kernels; aot_eager and eager
    only trace (eager runs the banked step op for op as written)."""
    lr_mul: dict[str, float] = field(default_factory=dict)
    """Per-parameter LR multipliers: {name pattern: factor}, patterns matched (fnmatch) against
    the parameters' qualified names, e.g. {"*mlp.fc*": 2.0} (the 2025-11 record's C_fc ×2).
    Muon scales the whole step of a match (its cautious decay too); AdamW needs a setting
    torch's AdamW lacks (optim/adam.py). Every pattern must match a parameter."""
    tie_embed_head_until: int = 0
    """record_2026_07_17's tied token table and head (#51, #53; optim/tied.py): the step s (0-based)
    whose Adam update is the last tied one (record_2026_07_17: 921). Until then `embed.weight` takes
    no step of its own: at each Adam update its summed gradient is added to `lm_head.weight`'s, the
    head takes the step and the table becomes a copy of it; right after the update of step s the
    table's Adam state becomes the head's (m, v, update count) and from then on the two train apart.
    0 = never tied. Needs model.embed.tied_init, optim/adam.py (a setting torch's AdamW lacks) and s
    an update step: s + 1 divisible by optim.adamw.update_every."""
    tie_sum: str = field(default="update", metadata={"choices": TIE_SUMS})
    """Where the tied table's gradient joins the head's (optim.tie_embed_head_until): update (E's
    sum over an Adam update's steps is added to W's sum: record_2026_07_17, D.3) | step (E's
    gradient is added to W's every step, before the steps are summed, as autograd sums one tensor's
    two uses: record_medium_2025_12_31, whose lookup reads the head's own rows until the split)."""
    roles: dict[str, str] = field(default_factory=dict, metadata=MUST_MATCH)
    """Role routing: {name pattern (fnmatch): role}, overriding the role by shape
    (optim/partition.py), e.g. {"smear_gate.weight": "scalar"} puts a 2-D gate on Adam
    (record_2026_07_17's gates). Every pattern must match a parameter, none two with different
    roles."""

    def validate(
        self, total_steps: int, scheduled_steps: int | None = None,
        parallelism: str = "ddp_all_gather",
    ) -> None:  # fmt: skip
        """Raise ValueError naming the `optim.*` key that is wrong. `total_steps`: train.steps;
        `scheduled_steps`: the LR schedule's span (train.steps − train.extension_steps),
        default all of them; `parallelism`: dist.parallelism (optim/parallelism.py)."""
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
        if PARALLELISMS[parallelism].fsdp and self.compile:
            raise ValueError(
                f"optim.compile=true steps whole matrices and tables, which "
                f"dist.parallelism={parallelism} shards: use a ddp_* parallelism, or turn it off"
            )
        if parallelism == "ddp_row_shards" and self.offload:
            raise ValueError(
                "optim.offload=true can't run with dist.parallelism=ddp_row_shards; turn one off"
            )
        if self.compile and self.offload:
            # Muon's banked state is stacks that each parameter's state entries view; offload
            # frees and refills each state tensor's storage, which those views share.
            raise ValueError("optim.offload=true can't run with optim.compile=true; turn one off")
        self.schedule.validate(total_steps if scheduled_steps is None else scheduled_steps)

    def _validate_tie(self) -> None:
        until, every = self.tie_embed_head_until, self.adamw.update_every
        if not (isinstance(until, int) and until >= 0):
            raise ValueError(f"optim.tie_embed_head_until must be an integer >= 0, got {until!r}")
        if self.tie_sum not in TIE_SUMS:
            raise ValueError(
                f"optim.tie_sum must be one of {' | '.join(TIE_SUMS)}, got {self.tie_sum!r}"
            )
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
