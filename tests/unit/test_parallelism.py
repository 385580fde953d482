"""One key, dist.parallelism, says how a run spreads over ranks. The four keys it replaced
(dist.strategy, optim.distribute, optim.muon.exchange, optim.muon.sharded_ns) fail with one line
naming it wherever they can still arrive (a command line, a config file, Python code), and a
checkpoint's saved config that has them reads as the parallelism it ran."""

import logging
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from optim.build import build_optimizer
from optim.config import MuonConfig, OptimConfig
from optim.muon.optimizer import Muon
from optim.parallelism import NAMES, PARALLELISMS, REPLACED
from tests.helpers import compose_config
from trainer.checkpoint.files import Loaded
from trainer.checkpoint.resume_rules import check_config, upgrade_saved
from trainer.checkpoint.upgrade import NAMES as PARAMETER_NAMING
from trainer.cli.overrides import check_command_line, compose_and_validate
from trainer.config import Config, DistConfig, to_config

CONF = Path(__file__).resolve().parents[2] / "conf"
OLD_KEYS = list(REPLACED)

# What each combination of the old keys ran, written out from their documented meanings (not
# from the table under test): dist.strategy decided DDP or FSDP; under FSDP sharded_ns chose
# Muon's sharded form and the other two did nothing; under DDP optim.distribute=sharded put
# every gradient through the optimizer's own exchange, which replaced Muon's; otherwise Muon's
# exchange was its own.
# (strategy, distribute, exchange, sharded_ns) -> today's parallelism
COMBINATIONS = {
    ("ddp", "replicated", "all_gather", "gather"): "ddp_all_gather",
    ("ddp", "replicated", "all_reduce", "gather"): "ddp_all_reduce",
    ("ddp", "replicated", "reduce_scatter", "tp"): "ddp_owners",
    ("ddp", "sharded", "all_gather", "gather"): "ddp_row_shards",
    ("ddp", "sharded", "reduce_scatter", "gather"): "ddp_row_shards",
    ("fsdp", "replicated", "all_gather", "gather"): "fsdp_gather",
    ("fsdp", "replicated", "reduce_scatter", "gather"): "fsdp_gather",
    ("fsdp", "replicated", "all_gather", "tp"): "fsdp_tp",
    ("fsdp", "replicated", "all_reduce", "tp"): "fsdp_tp",
}


def one_line(key: str) -> str:
    return "^" + re.escape(f"{key} is now dist.parallelism, one key")


def test_every_parallelism_is_one_the_old_keys_could_ask_for() -> None:
    """The names are exactly the arrangements that ran (none new, none lost), and each old
    value's one line names one of them."""
    assert set(COMBINATIONS.values()) == set(NAMES) == set(PARALLELISMS)
    assert all(new in NAMES for table in REPLACED.values() for new in table.values())
    assert DistConfig().parallelism == "ddp_all_gather"  # the old defaults' combination


@pytest.mark.parametrize("key", OLD_KEYS)
def test_an_old_key_on_the_command_line_names_the_new_one(key: str) -> None:
    value = next(iter(REPLACED[key]))
    with pytest.raises(ValueError, match=one_line(key)) as e:
        check_command_line([f"{key}={value}"], CONF, Config)
    assert "\n" not in str(e.value)
    for old, new in REPLACED[key].items():
        assert f"{key}={old} is {new}" in str(e.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [("dist:\n  strategy: fsdp\n", "dist.strategy"),
     ("optim:\n  distribute: sharded\n", "optim.distribute"),
     ("optim:\n  muon:\n    exchange: reduce_scatter\n", "optim.muon.exchange")],
)  # fmt: skip
def test_an_old_key_in_a_config_file_names_the_new_one(text: str, key: str, tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "experiment" / "mine.yaml").write_text(f"# @package _global_\n{text}")
    with pytest.raises(ValueError, match=one_line(key)):
        compose_and_validate(["experiment=mine"], conf)


def test_python_callers_get_the_new_name() -> None:
    with pytest.raises(TypeError, match=one_line("dist.strategy")):
        DistConfig(strategy="fsdp")
    with pytest.raises(TypeError, match=one_line("optim.distribute")):
        OptimConfig(distribute="sharded")
    with pytest.raises(TypeError, match=one_line("optim.muon.exchange")):
        MuonConfig(exchange="all_reduce")
    with pytest.raises(TypeError, match=one_line("optim.muon.sharded_ns")):
        Muon([torch.nn.Parameter(torch.zeros(4, 4))], sharded_ns="tp")
    with pytest.raises(AttributeError, match=one_line("dist.strategy")):
        _ = Config().dist.strategy
    with pytest.raises(ValueError, match=one_line("optim.muon.sharded_ns")):
        to_config({"optim": {"muon": {"sharded_ns": "tp"}}})


def saved_with_old_keys(conf: Config, old: tuple[str, str, str, str]) -> dict:
    """`conf` as a checkpoint from before dist.parallelism saved it: the four old keys at
    `old`'s values, no dist.parallelism."""
    saved = asdict(conf)
    del saved["dist"]["parallelism"]
    strategy, distribute, exchange, sharded_ns = old
    saved["dist"]["strategy"] = strategy
    saved["optim"]["distribute"] = distribute
    saved["optim"]["muon"] |= {"exchange": exchange, "sharded_ns": sharded_ns}
    return saved


@pytest.mark.parametrize(("old", "new"), list(COMBINATIONS.items()))
def test_a_checkpoint_saved_with_the_old_keys_resumes_as_what_it_ran(
    old: tuple[str, str, str, str], new: str, caplog: pytest.LogCaptureFixture
) -> None:
    conf = to_config(compose_config([f"dist.parallelism={new}", "run_dir=."]))
    saved = saved_with_old_keys(conf, old)
    assert upgrade_saved(saved) == asdict(conf)
    loaded = Loaded(Path("ckpt"), {"config": saved, "names": PARAMETER_NAMING}, {})
    with caplog.at_level(logging.WARNING, logger="train"):
        check_config(loaded, conf, warn=True)  # no refusal
    assert not caplog.records  # and nothing differs


def test_a_save_with_only_some_old_keys_reads_their_defaults_for_the_rest() -> None:
    """An old key absent from a save had its default: dist.strategy=fsdp alone ran fsdp_gather."""
    assert upgrade_saved({"dist": {"strategy": "fsdp"}}) == {"dist": {"parallelism": "fsdp_gather"}}
    sharded = upgrade_saved({"optim": {"distribute": "sharded", "muon": {"lr": 0.02}}})
    assert sharded == {"optim": {"muon": {"lr": 0.02}}, "dist": {"parallelism": "ddp_row_shards"}}


@pytest.mark.parametrize("name", NAMES)
def test_every_parallelism_builds_in_one_process(name: str) -> None:
    """In one process every parallelism is the plain optimizer: the same step as the default."""
    steps = []
    for parallelism in ("ddp_all_gather", name):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 1))
        opt = build_optimizer(model, OptimConfig(), device=torch.device("cpu"),
                              parallelism=parallelism)  # fmt: skip
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        steps.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*steps, strict=True))
