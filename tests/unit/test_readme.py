"""Every command README.md prints is one that runs as printed: each `train.py` command's
overrides name real keys and options and compose into a valid config, and each script
command names a script that exists with the flags it is given. (Running the short ones:
tests/e2e/test_readme_runs.py.)"""

import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from trainer.cli.overrides import check_command_line, compose_and_validate
from trainer.config import Config

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


def readme_commands() -> list[list[str]]:
    """The shell commands in README.md's bash blocks, as argument lists (comments dropped,
    continuation lines joined)."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def train_overrides(words: list[str]) -> list[str] | None:
    """The arguments after train.py of a `python train.py` / `torchrun ... train.py` command."""
    if "train.py" not in words or words[0] not in ("python", "torchrun"):
        return None
    return words[words.index("train.py") + 1 :]


TRAIN = [(" ".join(w), a) for w in readme_commands() if (a := train_overrides(w)) is not None]


def test_the_readme_has_its_commands() -> None:
    assert len(TRAIN) > 20
    assert any(a == [] for _, a in TRAIN)  # the default run


@pytest.mark.parametrize(("shown", "args"), TRAIN, ids=[s[:60] for s, _ in TRAIN])
def test_each_train_command_composes_a_valid_config(shown: str, args: list[str]) -> None:
    check_command_line(args, CONF, Config)
    if "-m" in args or "--multirun" in args:
        return  # each job of a sweep is one value of each swept key: checked above
    compose_and_validate(args, CONF)  # files a command reads are checked when it runs


def readme_scripts() -> dict[str, set[str]]:
    """Each script README.md runs (`python -m pkg.mod` or `python scripts/x.py`) with every
    --flag it is given anywhere in README.md."""
    scripts: dict[str, set[str]] = {}
    for w in readme_commands():
        if w[0] != "python" or len(w) < 2 or w[1] == "train.py":
            continue
        script = w[2] if w[1] == "-m" else w[1]
        flags = {a.split("=")[0] for a in w[2:] if a.startswith("--")}
        scripts.setdefault(script, set()).update(flags)
    return scripts


def script_path(script: str) -> Path:
    return REPO / (script if script.endswith(".py") else script.replace(".", "/") + ".py")


def test_the_scripts_the_readme_names_exist() -> None:
    scripts = readme_scripts()
    assert len(scripts) >= 5, scripts
    for script in scripts:
        assert script_path(script).is_file(), f"README.md runs {script}, which does not exist"


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # runpy, harmless
@pytest.mark.parametrize("script", sorted(readme_scripts()))
def test_each_script_takes_the_flags_the_readme_gives_it(
    script: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's own --help (run as `python ...` runs it) lists every flag README uses."""
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as done:
        if script.endswith(".py"):
            runpy.run_path(str(REPO / script), run_name="__main__")
        else:
            runpy.run_module(script, run_name="__main__", alter_sys=False)
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    missing = [flag for flag in sorted(readme_scripts()[script]) if flag not in out]
    assert not missing, f"README.md gives {script} {missing}, which its --help lacks"


def test_the_cpu_kinds_benchmark_times_the_readmes_toy_commands() -> None:
    """scripts/bench/cpu_kinds.py --toys times the toy commands as README shows them."""
    from scripts.bench.cpu_kinds import TOYS

    text = (REPO / "README.md").read_text(encoding="utf-8")
    for name, overrides in TOYS.items():
        assert f"python train.py {overrides}" in text, name
