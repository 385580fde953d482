"""The root config schema and the `train`, `dist` and `logging` groups, registered in Hydra.

Every default lives in the dataclasses, each package's in its own config.py (model/,
optim/, data/, and here the trainer's); the YAML presets under `conf/` hold only what a
preset changes. Hydra validates the YAML against these dataclasses when it composes them, so
an unknown key or a value of the wrong type fails at startup with the key named.
`Config.validate()` then checks every group's values (each group's `validate()`), the
choices each field's metadata names (`check_choices`) and cross-group constraints.

A field's `resume` metadata says how a checkpoint treats it (trainer/checkpoint/resume_rules.py).
"""

from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import II, DictConfig, OmegaConf

from data.config import DataConfig
from model.config import ModelConfig
from model.forward_schedule import check_stages
from optim.config import OptimConfig
from optim.parallelism import DEFAULT as DEFAULT_PARALLELISM
from optim.parallelism import NAMES as PARALLELISM_NAMES
from optim.parallelism import check_replicate, check_tensor_parallel, replaced_message
from stages import StageTable
from stages.moved import refuse_keys, refuse_moved
from trainer.config_across import check_across, check_finite
from trainer.config_checks import check_choices, check_known
from trainer.reference import ReferenceConfig
from trainer.run_dir import register_resolvers

MUST_MATCH = {"resume": "must_match"}
OPERATIONAL = {"resume": "operational"}

DEVICES = ("auto", "cpu", "cuda")
AUTOCASTS = ("auto", "bf16", "none")
NONFINITE_ACTIONS = ("stop", "skip")
BACKENDS = ("auto", "nccl", "gloo")
FSDP_PARAM_DTYPES = ("auto", "bf16", "fp32")
WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class FaultConfig:
    """Test-only fault injection (trainer/launch/fault.py); all off (0) in every real run."""

    kill_at_step: int = 0
    """SIGKILL rank `rank` during this step, once per run directory."""
    signal_at_step: int = 0
    """Send rank `rank` a SIGTERM during this step, once."""
    rank: int = 0
    nonfinite_at_step: int = 0
    """Make this step's training loss NaN on every rank."""
    nonfinite_grad_at_step: int = 0
    """Make a gradient NaN (the loss stays finite) on every rank."""
    slow_step_at: int = 0
    """Hold rank `rank` inside this step for slow_step_s seconds, as one long kernel does."""
    slow_step_s: float = 0.0
    """How long slow_step_at holds the step, in seconds."""

    @property
    def enabled(self) -> bool:
        settings = ("rank", "slow_step_s")  # where and how long, not faults of their own
        return any(getattr(self, f.name) for f in fields(self) if f.name not in settings)

    def validate(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"train.fault.{f.name} must be >= 0, got {getattr(self, f.name)}")


@refuse_moved("train")
@dataclass
class TrainConfig:
    """The `train` group: steps, batch shape, evaluation, precision, checkpoints."""

    steps: int = 200
    """Optimizer steps."""
    batch_size: int = 8
    """Global sequences per step (all ranks, all micro-steps)."""
    micro_batch_size: int = field(default=0, metadata=OPERATIONAL)
    """Sequences per rank per forward; 0 = batch_size / world size (no accumulation)."""
    seq_len: int = 256
    """Tokens per sequence (a packed sequence per rank when batch_size = world size)."""
    val_seq_len: int = 0
    """Tokens per validation sequence; 0 = seq_len."""
    extension_steps: int = 0
    """The last this many steps run past the schedules' end: the schedules (LR, stages)
    span the scheduled steps, steps − extension_steps, and then hold their final values (the
    2025-11 record: 40 of 2,160)."""
    stages: StageTable = field(default_factory=StageTable)
    """The stage table: one row per equal stage of the scheduled steps, each what the run
    does in it (sequence length, long window, piece cap and limit, LR plateau, MTP weights),
    and what follows the stages (stages/table.py; docs/config.md). Rows [] = one stage."""
    val_every: int = field(default=50, metadata=OPERATIONAL)
    """Evaluate every this many steps (and always at the end); 0 = at the end only."""
    val_tokens: int = II("data.val_tokens")
    """The fixed validation budget in tokens, the same at every evaluation."""
    log_every: int = field(default=1, metadata=OPERATIONAL)
    """A console line every this many steps."""
    device: str = field(default="auto", metadata={"choices": DEVICES, **OPERATIONAL})
    """auto (cuda when available, else cpu) | cpu | cuda."""
    threads: int = 0
    """torch threads per rank on a CPU; 0 = as launched (torch's default, one core per rank
    under torchrun or dist.nproc). A CPU's kernels may sum in an order that depends on it, so
    runs compared bit for bit (a resume, a test) use the same number."""
    autocast: str = field(default="auto", metadata={"choices": AUTOCASTS})
    """bf16: matmuls in bf16, fp32 master weights | none: fp32 | auto: bf16 on CUDA and on
    CPUs with native bf16 matmuls, fp32 elsewhere."""
    checkpoint_every: int = field(default=50, metadata=OPERATIONAL)
    """Save every this many steps to <run_dir>/checkpoints/; 0 = no periodic saves."""
    checkpoint_at_end: bool = field(default=True, metadata=OPERATIONAL)
    """Save after the last step."""
    checkpoint_keep: int = field(default=1, metadata=OPERATIONAL)
    """Keep this many newest checkpoints (a save is complete before an older one goes)."""
    resume: str = field(default="auto", metadata=OPERATIONAL)
    """auto: continue from the run directory's newest checkpoint, if any | never | a path (a
    checkpoint, a checkpoints/ directory or a run directory)."""
    on_nonfinite: str = field(
        default="stop", metadata={"choices": NONFINITE_ACTIONS, **OPERATIONAL}
    )
    """A non-finite loss or gradient: stop (naming the last good checkpoint) | skip the
    step's update and go on."""
    target_val_loss: float = 0.0
    """Stop at the first evaluation at or below this val loss; 0 = train every step."""
    untimed_steps: int = 0
    """The first this many steps run but do not count as train time (warm-up)."""
    compile_cache: str = field(default="~/.cache/gpt-speedrun/compile", metadata=OPERATIONAL)
    """Where torch.compile's caches persist between runs when anything compiles
    (model.compile, optim.compile): inductor's FX graph, AOTAutograd and autotune caches and
    its Triton kernels (TORCHINDUCTOR_CACHE_DIR), so a second run of a preset loads its
    kernels instead of building them; "" = torch's own place (/tmp/torchinductor_<user>,
    gone at a reboot). A TORCHINDUCTOR_CACHE_DIR already set wins."""
    fault: FaultConfig = field(default_factory=FaultConfig, metadata=OPERATIONAL)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig, metadata=OPERATIONAL)

    def micro_batch(self, world_size: int) -> int:
        """Sequences per rank per forward on `world_size` ranks; raises if they don't divide."""
        micro = self.micro_batch_size or self.batch_size // world_size
        if micro < 1 or self.batch_size % (world_size * micro):
            shown = self.micro_batch_size or "0, i.e. batch_size / world size"
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be divisible by the world size "
                f"({world_size}) x train.micro_batch_size ({shown}); change train.batch_size, "
                "train.micro_batch_size or the number of ranks"
            )
        return micro

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step on `world_size` ranks; raises if they don't divide."""
        return self.batch_size // (world_size * self.micro_batch(world_size))

    def val_rows(self, world_size: int) -> int:
        """Validation sequences per rank per forward: as many as a training micro-batch's
        tokens hold, at least one."""
        val_seq = self.val_seq_len or self.seq_len
        return max(1, self.micro_batch(world_size) * self.seq_len // val_seq)

    @property
    def scheduled_steps(self) -> int:
        """The steps the schedules span: all but the extension steps."""
        return self.steps - self.extension_steps

    def seq_len_at(self, step: int) -> int:
        """Tokens per sequence at update `step` (0-based): its stage's, or seq_len."""
        if not self.stages.column("seq_len"):
            return self.seq_len
        return self.stages.row(step, self.scheduled_steps).seq_len

    def step_tokens(self, step: int) -> int:
        """Training tokens of update `step` over all ranks: batch_size sequences."""
        return self.batch_size * self.seq_len_at(step)

    def tokens_after(self, steps: int) -> int:
        """Training tokens of the first `steps` updates (0 ... train.steps), summed stage by
        stage: for the 2025-11 record 707 × 131,072 + 707 × 262,144 + 746 × 393,216."""
        if not 0 <= steps <= self.steps:
            raise ValueError(f"steps must be in [0, {self.steps}], got {steps}")
        lengths = self.stages.column("seq_len")
        if not lengths:
            return steps * self.batch_size * self.seq_len
        total, n = 0, len(lengths)
        for i, length in enumerate(lengths):
            first = self.stages.start(i, self.scheduled_steps)
            end = self.steps if i == n - 1 else self.stages.start(i + 1, self.scheduled_steps)
            total += max(0, min(steps, end) - first) * self.batch_size * length
        return total

    def validate(self) -> None:
        """Raise ValueError naming the `train.*` key that is wrong."""
        for key in ("steps", "batch_size", "seq_len", "val_tokens", "log_every"):
            if getattr(self, key) <= 0:
                raise ValueError(f"train.{key} must be positive, got {getattr(self, key)}")
        for key in ("val_seq_len", "micro_batch_size", "val_every", "checkpoint_every",
                    "untimed_steps", "target_val_loss", "threads"):  # fmt: skip
            if getattr(self, key) < 0:
                raise ValueError(f"train.{key} must be >= 0, got {getattr(self, key)}")
        val_seq = self.val_seq_len or self.seq_len
        if self.val_tokens < val_seq:
            raise ValueError(
                f"train.val_tokens ({self.val_tokens}) must cover at least one validation "
                f"sequence of {val_seq} tokens (train.val_seq_len, or train.seq_len when it is 0)"
            )
        if self.checkpoint_keep < 1:
            raise ValueError(f"train.checkpoint_keep must be >= 1, got {self.checkpoint_keep}")
        if not 0 <= self.extension_steps < self.steps:
            raise ValueError(
                f"train.extension_steps must be in [0, train.steps = {self.steps}), got "
                f"{self.extension_steps}"
            )
        self.stages.validate(self.scheduled_steps)
        lengths = self.stages.column("seq_len")
        if lengths and self.seq_len != max(lengths):
            raise ValueError(
                f"train.seq_len ({self.seq_len}) must equal the largest of the stages' seq_len "
                f"(train.stages.rows.N.seq_len: {max(lengths)}): it sizes the batch buffers and "
                "the validation rows"
            )
        if not self.resume:
            raise ValueError("train.resume must be auto, never or a checkpoint path")
        self.fault.validate()
        self.reference.validate()


@refuse_keys("dist", {"strategy"}, replaced_message)
@dataclass
class DistConfig:
    """The `dist` group: ranks and how the model spreads over them."""

    nproc: int = 1
    """Ranks `python train.py` starts itself (one node; leave 1 under torchrun)."""
    max_restarts: int = 0
    """With nproc > 1: relaunch all ranks this often after a failure."""
    backend: str = field(default="auto", metadata={"choices": BACKENDS})
    """auto: nccl on CUDA, gloo on CPU | nccl | gloo."""
    timeout_s: float = 600.0
    """A collective waiting longer fails instead of hanging."""
    parallelism: str = field(default=DEFAULT_PARALLELISM, metadata={"choices": PARALLELISM_NAMES})
    """How the run spreads over ranks, one name for where each gradient is reduced and how the
    new weights reach every rank (optim/parallelism.py; docs/config.md): ddp_all_gather |
    ddp_all_reduce | ddp_owners | ddp_row_shards (every rank holds the whole model) |
    fsdp_gather | fsdp_tp (FSDP2 shards the model and the optimizer state by rows)."""
    fsdp_param_dtype: str = field(default="auto", metadata={"choices": FSDP_PARAM_DTYPES})
    """fsdp_*: the dtype parameters are gathered and computed in; auto = bf16 on CUDA, fp32 on
    CPU (gradients are always reduced in fp32)."""
    replicate: int = 1
    """fsdp_*: R > 1 lays the ranks out as an (R, W/R) mesh, HSDP: each of R replica groups
    shards the model over its W/R ranks, and the groups average their gradients (as DDP
    does); Muon's exchange stays within a shard group. 1 = one group of every rank."""
    tensor_parallel: int = 1
    """fsdp_gather: T > 1 splits each block's heads and MLP hidden units over T neighbouring
    ranks that read the same batch (model/tensor_parallel.py), and FSDP2 shards over the
    W/(R·T) groups of them. 1 = none."""

    def validate(self, train: TrainConfig) -> None:
        """Raise ValueError naming the `dist.*` key that is wrong."""
        if self.nproc < 1:
            raise ValueError(f"dist.nproc must be >= 1, got {self.nproc}")
        train.accumulation_steps(self.nproc)  # dist.nproc ranks must split the batch
        if self.max_restarts < 0:
            raise ValueError(f"dist.max_restarts must be >= 0, got {self.max_restarts}")
        if self.timeout_s <= 0:
            raise ValueError(f"dist.timeout_s must be > 0, got {self.timeout_s}")
        # under torchrun (nproc 1) the ranks are known only once launched (shard_model)
        ranks = self.nproc if self.nproc > 1 else None
        check_replicate(self.replicate, self.parallelism, ranks)
        check_tensor_parallel(self.tensor_parallel, self.replicate, self.parallelism, ranks)
        if self.backend == "nccl" and train.device == "cpu":
            raise ValueError("dist.backend=nccl needs train.device=cuda (or auto on a GPU)")


@dataclass
class WandbConfig:
    """Weights & Biases (`logging.wandb`; trainer/observe/wandb_log.py)."""

    enabled: bool = False
    """logging=wandb turns it on; rank 0 only."""
    project: str = "gpt-speedrun"
    entity: str | None = None
    """Team or user; None: the account's default."""
    name: str | None = None
    """The run's name; None: the run directory's path under outputs/."""
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    mode: str = field(default="online", metadata={"choices": WANDB_MODES})
    """online: needs an account | offline: writes <run_dir>/wandb, `wandb sync` later |
    disabled: calls succeed and do nothing."""


@dataclass
class LoggingConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def validate(self) -> None:
        """Nothing to check beyond the choices."""


@dataclass
class Config:
    seed: int = 0
    """Seeds torch, numpy and python: the same seed gives the same run."""
    run_dir: str = field(default=".", metadata=OPERATIONAL)
    """Where metrics and checkpoints go; Hydra sets it to its run directory."""
    model: ModelConfig = field(default_factory=ModelConfig, metadata=MUST_MATCH)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig, metadata=OPERATIONAL)
    logging: LoggingConfig = field(default_factory=LoggingConfig, metadata=OPERATIONAL)

    def validate(self) -> None:
        """Check every value once, before any work; raise ValueError naming the key."""
        check_choices(self)
        check_finite(self)  # first: a NaN passes the groups' range checks
        if not 0 <= self.seed < 2**32:  # numpy's seed range (runtime.seed_everything)
            raise ValueError(f"seed must be in [0, 4294967295] (0 to 2**32 - 1), got {self.seed}")
        self.train.validate()  # first: the stage table, which the model's check reads
        check_stages(self.model, self.train.stages)  # the model's window keys against the table
        self.model.validate()
        self.data.validate()
        self.optim.validate(self.train.steps, self.train.scheduled_steps, self.dist.parallelism)
        self.dist.validate(self.train)
        self.logging.validate()
        check_across(self)


def register_configs() -> None:
    """Register the schema so `conf/config.yaml` is type-checked against it, and the resolvers
    its `hydra:` section uses (rank-aware run directory and logging)."""
    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)


def to_config(cfg: DictConfig | Config | dict[str, Any]) -> Config:
    """Turn a composed DictConfig (or a plain dict) into a validated `Config` object."""
    if isinstance(cfg, Config):
        conf = cfg
    else:
        plain = OmegaConf.to_container(cfg) if isinstance(cfg, DictConfig) else cfg
        check_known(plain, Config)
        merged = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        conf = OmegaConf.to_object(merged)
    conf.validate()
    return conf
