"""Every preset composes and validates; bad values fail before any work, naming the key."""

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from data.config import DataConfig
from model.config import ModelConfig
from optim.config import OptimConfig
from tests.helpers import CONF_DIR, compose_config
from trainer.config import Config, DistConfig, LoggingConfig, TrainConfig, to_config

GROUPS = ["model", "optim", "data", "train", "experiment", "logging", "hparams_search", "launcher"]


def presets(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def test_every_group_has_presets() -> None:
    assert {"tiny", "gpt2_124m"} <= set(presets("model"))
    assert {"muon_adamw", "adamw"} <= set(presets("optim"))
    assert {"sample", "synthetic"} <= set(presets("data"))
    assert presets("experiment")


# What a preset needs from the command line to run alone: a directory; record_2026_07_17's and M's
# models their windows and MTP weights by stage, columns of the stage table their experiments
# give.
NEEDS = {("model", name): ["train.stages.rows=[{window:3,mtp_weights:[1.0]}]"]
         for name in ("record_2026_07", "record_medium_2025_12")}  # fmt: skip


# Composing a preset resolves its settings, some by the CPU's bf16: CI reruns this emulated.
@pytest.mark.cpu_bf16
@pytest.mark.parametrize(("group", "name"), [(g, n) for g in GROUPS for n in presets(g)])
def test_every_preset_composes_and_validates(group: str, name: str, tmp_path: Path) -> None:
    needs = [f"data.dir={tmp_path}"] if (group, name) == ("data", "local") else []
    needs += NEEDS.get((group, name), [])
    cfg = compose_config([f"{group}={name}", f"run_dir={tmp_path}", *needs])
    conf = to_config(cfg)
    assert isinstance(conf, Config)


# The schema of each group whose presets are plain values (experiments are checked whole).
SCHEMAS = {
    "model": ModelConfig,
    "optim": OptimConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "dist": DistConfig,
    "logging": LoggingConfig,
}
DEFAULT_PRESETS = {"model": "tiny", "optim": "muon_adamw", "data": "sample", "train": "default"}
DEFAULT_PRESETS |= {"dist": "default", "logging": "default"}


def check_preset(schema: type, values: dict, where: str) -> None:
    """Raise naming the key if `values` has a key `schema` lacks or a value of the wrong type,
    or restates one of the schema's defaults (a preset holds only what it changes)."""
    node = OmegaConf.structured(schema)
    OmegaConf.merge(node, values)  # unknown key: ConfigKeyError; wrong type: ValidationError
    defaults = OmegaConf.to_container(node)

    def walk(v: dict, d: dict, path: str) -> None:
        for key, value in v.items():
            if isinstance(value, dict):
                walk(value, d[key], f"{path}{key}.")
            elif value == d[key] and value != "???":
                raise ValueError(f"{where}: {path}{key}: {value!r} restates the schema default")

    walk(values, defaults, "")


@pytest.mark.parametrize(("group", "name"), [(g, n) for g in SCHEMAS for n in presets(g)])
def test_presets_and_schema_agree(group: str, name: str) -> None:
    """Every key of every preset exists in the schema with a value of its type, no preset
    restates a default (the dataclass is the one place for it), and the default presets
    are empty: they are the schema."""
    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{name}.yaml")) or {}
    values = {k: v for k, v in values.items() if k != "defaults"}
    check_preset(SCHEMAS[group], values, f"conf/{group}/{name}.yaml")
    if DEFAULT_PRESETS.get(group) == name:
        assert values == {}, f"conf/{group}/{name}.yaml is a default preset: the schema is it"


@pytest.mark.parametrize("name", presets("experiment"))
def test_experiment_keys_exist_in_the_schema(name: str) -> None:
    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml"))
    values = {k: v for k, v in values.items() if k not in ("defaults", "hydra")}
    # Experiments may pin any value (a record's preset must not move with the defaults), but
    # each must be a schema key of the right type: merge raises otherwise.
    merged = OmegaConf.merge(OmegaConf.structured(Config), values)
    assert all(key in merged for key in values)


@pytest.mark.parametrize(
    ("values", "error", "key"),
    [
        ({"n_layers": 3}, ConfigKeyError, "n_layers"),
        ({"n_layer": "three"}, ValidationError, "n_layer"),
        ({"n_layer": 4}, ValueError, "n_layer: 4 restates"),
    ],
)
def test_the_preset_check_can_fail(values: dict, error: type, key: str) -> None:
    with pytest.raises(error, match=key):
        check_preset(ModelConfig, values, "conf/model/bad.yaml")


def test_local_data_needs_its_directory(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"data\.dir"):
        to_config(compose_config(["data=local", f"run_dir={tmp_path}"]))


def test_val_budget_follows_the_data_preset_unless_set(tmp_path: Path) -> None:
    fineweb = to_config(compose_config(["data=fineweb10b", f"run_dir={tmp_path}"]))
    assert fineweb.train.val_tokens == 10_485_760
    assert fineweb.data.dir.endswith("fineweb10B")
    own = to_config(compose_config(["data=fineweb10b", "train.val_tokens=4096", "run_dir=."]))
    assert own.train.val_tokens == 4096


def test_default_is_tiny_muon_on_sample(tmp_path: Path) -> None:
    conf = to_config(compose_config([f"run_dir={tmp_path}"]))
    assert (conf.model.n_layer, conf.model.n_embd, conf.model.n_head) == (4, 128, 2)
    assert conf.optim.name == "muon_adamw"
    assert conf.data.source == "sample"


def test_adamw_preset_only_changes_the_optimizer(tmp_path: Path) -> None:
    a = to_config(compose_config([f"run_dir={tmp_path}"]))
    b = to_config(compose_config(["optim=adamw", f"run_dir={tmp_path}"]))
    assert b.optim.name == "adamw"
    assert b.optim.adamw == a.optim.adamw and b.model == a.model and b.train == a.train


def test_required_key_names_exist(tmp_path: Path) -> None:
    """External tools rely on these exact keys."""
    cfg = compose_config([f"run_dir={tmp_path}"])
    for key in [
        "seed",
        "train.steps",
        "train.val_every",
        "train.val_tokens",
        "train.seq_len",
        "train.batch_size",
        "optim.muon.lr",
        "model.n_layer",
        "model.n_head",
        "model.n_embd",
        "train.checkpoint_every",
        "train.checkpoint_keep",
        "train.resume",
        "train.on_nonfinite",
    ]:
        node = cfg
        for part in key.split("."):
            node = node[part]
        assert node is not None, key


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.n_embd=99", "model.n_embd"),
        ("model.n_head=6", "model.n_embd"),
        ("model.n_embd=22", "head dim"),
        ("train.steps=0", "train.steps"),
        ("train.batch_size=-1", "train.batch_size"),
        ("train.seq_len=0", "train.seq_len"),
        ("train.val_tokens=10", "train.val_tokens"),
        ("train.device=tpu", "train.device"),
        ("train.autocast=fp8", "train.autocast"),
        ("optim.muon.lr=-0.1", "optim.muon.lr"),
        ("optim.muon.momentum=1.0", "optim.muon.momentum"),
        ("optim.muon.ns_steps=0", "optim.muon.ns_steps"),
        ("optim.muon.ns_coefficients=cubic", "optim.muon.ns_coefficients"),
        ("optim.muon.lr_scale=big", "optim.muon.lr_scale"),
        ("optim.adamw.embed_lr=-1", "optim.adamw.embed_lr"),
        ("optim.adamw.eps=0", "optim.adamw.eps"),
        ("optim.schedule.cooldown_frac=1.5", "optim.schedule.cooldown_frac"),
        ("optim.schedule.warmup_steps=190", "optim.schedule.warmup_steps"),
        ("data.val_fraction=0", "data.val_fraction"),
        ("data.source=imagenet", "data.source"),
        ("dist.parallelism=carrier_pigeon", "dist.parallelism"),
        ("train.micro_batch_size=-1", "train.micro_batch_size"),
        ("dist.nproc=0", "dist.nproc"),
        ("dist.max_restarts=-1", "dist.max_restarts"),
        ("dist.backend=mpi", "dist.backend"),
        ("dist.timeout_s=0", "dist.timeout_s"),
        ("dist.backend=nccl train.device=cpu", "dist.backend=nccl"),
        ("model.attention.impl=flex train.device=cpu", "model.attention.impl=flex"),
        ("train.checkpoint_every=-5", "train.checkpoint_every"),
        ("train.checkpoint_keep=0", "train.checkpoint_keep"),
        ("train.resume=''", "train.resume"),
        ("train.on_nonfinite=ignore", "train.on_nonfinite"),
        ("train.fault.kill_at_step=-1", "train.fault.kill_at_step"),
        ("data.align=words", "data.align"),
        ("data.source=shards", "data.dir"),
        ("data.align=bos data.source=synthetic", "data.align=bos"),
        ("logging.wandb.mode=sometimes", "logging.wandb.mode"),
        ("train.target_val_loss=-1", "train.target_val_loss"),
    ],
)
def test_bad_values_fail_naming_the_key(override: str, key: str, tmp_path: Path) -> None:
    cfg = compose_config([*override.split(), f"run_dir={tmp_path}"])
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        to_config(cfg)


def test_unknown_key_is_rejected_at_composition() -> None:
    with pytest.raises(ConfigCompositionException, match="n_layers"):
        compose_config(["model.n_layers=3"])


def test_wrong_type_is_rejected_with_the_key() -> None:
    with pytest.raises((ConfigCompositionException, ValidationError), match=r"train\.steps"):
        compose_config(["train.steps=many"])


def test_unknown_preset_names_the_choices() -> None:
    with pytest.raises((MissingConfigException, ConfigCompositionException), match="gpt5"):
        compose_config(["model=gpt5"])


def test_plain_dict_is_checked_against_the_schema() -> None:
    with pytest.raises(
        ValueError, match=r"unknown config key train\.stepz; did you mean train\.steps"
    ):
        to_config({"train": {"stepz": 3}})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+train.step=3", r"train\.step; did you mean train\.steps\?"),
        ("+optim.muon.lrr=0.1", r"optim\.muon\.lrr; did you mean optim\.muon\.lr\?"),
        ("+nonsense=1", r"unknown config key nonsense$"),
    ],
)
def test_added_keys_the_schema_lacks_are_refused(override: str, message: str) -> None:
    """Hydra's `+key=value` (the fix its own error suggests for a typo) adds a key to the
    composed config; it must fail like any unknown key, not be carried along and ignored."""
    with pytest.raises(ValueError, match=message):
        to_config(compose_config([override, "run_dir=."]))


@pytest.mark.parametrize(
    ("batch", "micro", "world", "steps"),
    [(8, 0, 1, 1), (8, 0, 2, 1), (8, 2, 2, 2), (8, 1, 2, 4), (8, 4, 1, 2), (12, 2, 3, 2)],
)
def test_accumulation_steps_keep_the_global_batch(
    batch: int, micro: int, world: int, steps: int
) -> None:
    t = TrainConfig(batch_size=batch, micro_batch_size=micro)
    assert t.accumulation_steps(world) == steps
    # ranks x micro-steps x micro-batch is the global batch, whatever the world size
    assert world * steps * (micro or batch // world) == batch


@pytest.mark.parametrize(("batch", "micro", "world"), [(8, 3, 1), (8, 3, 2), (6, 0, 4), (8, 8, 2)])
def test_indivisible_global_batch_names_both_keys(batch: int, micro: int, world: int) -> None:
    with pytest.raises(ValueError, match=r"train\.batch_size .* train\.micro_batch_size"):
        TrainConfig(batch_size=batch, micro_batch_size=micro).accumulation_steps(world)
