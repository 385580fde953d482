"""The root config schema: one dataclass per group, registered in Hydra's ConfigStore.

Every default lives here, in the dataclasses (each group's own next to the code that
implements it: `MuonConfig` in optim/muon.py, `DataConfig` in data/build.py, ...); the YAML
presets under `conf/` hold only what a preset changes. Hydra validates the YAML against these
dataclasses when it composes them, so an unknown key or a value of the wrong type fails at
startup with the key named. `validate()` then checks the values: each field's allowed values
from its metadata (`check_choices`, the one "must be one of"), ranges, divisibility and
cross-group constraints.
"""

import difflib
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import II, DictConfig, OmegaConf

from data.build import DataConfig
from model.config import ModelConfig
from optim.config import OptimConfig
from trainer.fault import FaultConfig
from trainer.nonfinite import ACTIONS
from trainer.run_dir import register_resolvers
from trainer.runtime import AUTOCASTS, BACKENDS, DEVICES
from trainer.strategy import FSDP_PARAM_DTYPES, STRATEGIES
from trainer.wandb_log import WandbConfig


@dataclass
class TrainConfig:
    steps: int = 200  # optimizer steps
    batch_size: int = 8  # global sequences per step (all ranks, all micro-steps)
    # sequences per rank per forward/backward; 0 = batch_size / world size (no accumulation).
    # Gradient-accumulation steps = batch_size / (world size x micro_batch_size).
    micro_batch_size: int = 0
    seq_len: int = 256  # tokens per sequence (one packed sequence per rank: batch = world size)
    # tokens per validation sequence; 0 = seq_len. Each rank evaluates as many of them at a
    # time as fit in its training micro-batch's tokens (at least one).
    val_seq_len: int = 0
    val_every: int = 50  # evaluate every this many steps (and always at the end); 0 = end only
    # fixed validation budget in tokens, the same at every evaluation; the data preset's
    val_tokens: int = II("data.val_tokens")
    log_every: int = 1  # console line every this many steps
    # auto (cuda when available, else cpu) | cpu | cuda
    device: str = field(default="auto", metadata={"choices": DEVICES})
    # bf16: matmuls in bfloat16 with fp32 master weights | none: fp32 | auto: bf16 on CUDA and on
    # CPUs with native bf16 matmul (AVX-512 BF16 / AMX), fp32 elsewhere (bf16 is ~10x slower
    # than fp32 on an AVX2-only CPU)
    autocast: str = field(default="auto", metadata={"choices": AUTOCASTS})
    # Checkpoints go to <run_dir>/checkpoints/step_NNNNNN (see trainer/checkpoint_files.py).
    checkpoint_every: int = 50  # save every this many steps; 0 = no periodic saves
    checkpoint_at_end: bool = True  # save after the last step
    # keep this many newest checkpoints, delete older ones. 1 is safe: a save is complete
    # (renamed into place) before the previous one is deleted; each save of the tiny default
    # model is ~160 MB, mostly the 50304-wide embedding and head with their AdamW moments
    checkpoint_keep: int = 1
    # auto: continue from <run_dir>/checkpoints if it holds one, else start fresh | never |
    # a path: a checkpoint directory, a checkpoints/ directory or a run directory
    resume: str = "auto"
    # A non-finite training loss or gradient: stop (name the step and the last good checkpoint)
    # | skip (drop that step's update and go on; its host sync then precedes the update)
    on_nonfinite: str = field(default="stop", metadata={"choices": ACTIONS})
    # Stop at the first evaluation whose val loss is at or below this (0 = train all steps);
    # the log and metrics.jsonl give the train time to reach it (evaluation excluded).
    target_val_loss: float = 0.0
    # Steps whose time does not count as train time (the records reset their clock at step
    # 10, after compilation warm-up): the first this many steps are run but not timed
    untimed_steps: int = 0
    fault: FaultConfig = field(default_factory=FaultConfig)

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step on `world_size` ranks; raises if they don't divide."""
        micro = self.micro_batch_size or self.batch_size // world_size
        if micro < 1 or self.batch_size % (world_size * micro):
            shown = self.micro_batch_size or "0, i.e. batch_size / world size"
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be divisible by the world size "
                f"({world_size}) x train.micro_batch_size ({shown}); change train.batch_size, "
                "train.micro_batch_size or the number of ranks"
            )
        return self.batch_size // (world_size * micro)


@dataclass
class DistConfig:
    # Ranks that `python train.py` starts itself through torch's elastic launcher (one node,
    # so a Hydra multirun job can be multi-process); 1 = this process alone. Under torchrun
    # leave it at 1: torchrun starts the ranks.
    nproc: int = 1
    max_restarts: int = 0  # with nproc > 1: relaunch all ranks this often after a failure
    # auto: nccl on CUDA, gloo on CPU | nccl | gloo
    backend: str = field(default="auto", metadata={"choices": BACKENDS})
    timeout_s: float = 600.0  # a collective waiting longer fails instead of hanging
    # ddp: every rank holds the whole model and optimizer state | fsdp: FSDP2 shards
    # parameters, gradients and optimizer state over the ranks (sharded Muon, DCP
    # checkpoints; trainer/strategy.py says when to use which)
    strategy: str = field(default="ddp", metadata={"choices": STRATEGIES})
    # fsdp only: dtype parameters are all-gathered and computed in (gradients are always
    # reduced in fp32) | auto: bf16 on CUDA, fp32 on CPU
    fsdp_param_dtype: str = field(default="auto", metadata={"choices": FSDP_PARAM_DTYPES})


@dataclass
class LoggingConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class Config:
    seed: int = 0  # seeds torch, numpy and python; same seed -> same run
    run_dir: str = "."  # where metrics.jsonl goes; Hydra sets it to its run directory
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> None:
        """Check every value once, before any work; raise ValueError naming the key."""
        check_choices(self)
        self.model.validate()
        self.data.validate()
        t = self.train
        for key in ("steps", "batch_size", "seq_len", "val_tokens", "log_every"):
            if getattr(t, key) <= 0:
                raise ValueError(f"train.{key} must be positive, got {getattr(t, key)}")
        if t.val_seq_len < 0:
            raise ValueError(f"train.val_seq_len must be >= 0, got {t.val_seq_len}")
        if t.micro_batch_size < 0:
            raise ValueError(f"train.micro_batch_size must be >= 0, got {t.micro_batch_size}")
        if t.val_every < 0:
            raise ValueError(f"train.val_every must be >= 0, got {t.val_every}")
        val_seq = t.val_seq_len or t.seq_len
        if t.val_tokens < val_seq:
            raise ValueError(
                f"train.val_tokens ({t.val_tokens}) must cover at least one validation sequence "
                f"of {val_seq} tokens (train.val_seq_len, or train.seq_len when it is 0)"
            )
        if t.checkpoint_every < 0:
            raise ValueError(f"train.checkpoint_every must be >= 0, got {t.checkpoint_every}")
        if t.checkpoint_keep < 1:
            raise ValueError(f"train.checkpoint_keep must be >= 1, got {t.checkpoint_keep}")
        if not t.resume:
            raise ValueError("train.resume must be auto, never or a checkpoint path")
        if t.untimed_steps < 0:
            raise ValueError(f"train.untimed_steps must be >= 0, got {t.untimed_steps}")
        if t.target_val_loss < 0:
            raise ValueError(f"train.target_val_loss must be >= 0, got {t.target_val_loss}")
        t.fault.validate()
        self.optim.validate(t.steps)
        if bool(self.model.window) != bool(self.optim.schedule.window_tokens):
            raise ValueError(
                "model.window (which layers have sliding windows) and "
                "optim.schedule.window_tokens (how wide the window grows) go together: set both "
                f"or neither (got {self.model.window!r} and {self.optim.schedule.window_tokens})"
            )
        d = self.dist
        if d.nproc < 1:
            raise ValueError(f"dist.nproc must be >= 1, got {d.nproc}")
        t.accumulation_steps(d.nproc)  # dist.nproc ranks must split the batch: fail before any
        if d.max_restarts < 0:
            raise ValueError(f"dist.max_restarts must be >= 0, got {d.max_restarts}")
        if d.timeout_s <= 0:
            raise ValueError(f"dist.timeout_s must be > 0, got {d.timeout_s}")
        if d.backend == "nccl" and t.device == "cpu":
            raise ValueError("dist.backend=nccl needs train.device=cuda (or auto on a GPU)")
        if self.model.attention_impl == "flex" and t.device == "cpu":
            raise ValueError(
                "model.attention_impl=flex can't train on a CPU (FlexAttention has no CPU "
                "backward in this torch); use model.attention_impl=auto or sdpa there"
            )


def check_choices(node: Any, prefix: str = "") -> None:
    """Every field whose metadata names its `choices` holds one of them, through the whole
    tree of dataclasses: the one "must be one of" check of the config."""
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            check_choices(value, f"{prefix}{f.name}.")
        elif "choices" in f.metadata and value not in f.metadata["choices"]:
            allowed = " | ".join(f.metadata["choices"])
            raise ValueError(f"{prefix}{f.name} must be one of {allowed}, got {value!r}")


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as {"train.steps": 200, ...}, for comparing configs key by key."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def register_configs() -> None:
    """Register the schema so `conf/config.yaml` is type-checked against it, and the resolvers
    its `hydra:` section uses (rank-aware run directory and logging)."""
    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)


def check_known(values: dict[str, Any], schema: Any, prefix: str = "") -> None:
    """Raise ValueError naming the first key of `values` that the dataclass `schema` lacks,
    with the nearest real key: `+train.step=3` would otherwise be accepted and ignored."""
    known = {f.name: f for f in fields(schema)}
    for key, value in values.items():
        if key not in known:
            near = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"; did you mean {prefix}{near[0]}?" if near else ""
            raise ValueError(f"unknown config key {prefix}{key}{hint}")
        group = known[key].default_factory  # a nested group's dataclass
        if isinstance(value, dict) and group is not MISSING and is_dataclass(group):
            check_known(value, group, f"{prefix}{key}.")


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
