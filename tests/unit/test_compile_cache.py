"""train.compile_cache: torch.compile's on-disk caches go where a user expects them (~/.cache,
not /tmp), and a second process compiling the same graph loads its kernels from there instead
of building them (inductor's FX graph cache: a miss, then a hit). A variable the user set wins.
Each run is its own process: inductor reads the variable once, when it first needs it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import TrainConfig
from trainer.launch.compile import use_compile_cache

ROOT = Path(__file__).resolve().parents[2]
COMPILE = """
import json, torch
from torch._dynamo.utils import counters
from trainer.launch.compile import use_compile_cache
where = use_compile_cache({cache!r})
f = torch.compile(lambda x: (x.sin() * 2).relu().sum(), dynamic=False)
f(torch.randn(64))
print(json.dumps({{"where": where, **counters["inductor"]}}))
"""


def compile_once(cache: Path, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", COMPILE.format(cache=str(cache))], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_run_loads_the_first_runs_kernels(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["PYTHONPATH"] = str(ROOT)
    cache = tmp_path / "cache"
    first = compile_once(cache, env)
    assert first["where"] == str(cache) and first.get("fxgraph_cache_miss") == 1
    assert "fxgraph_cache_hit" not in first and (cache / "fxgraph").is_dir()
    second = compile_once(cache, env)
    assert second.get("fxgraph_cache_hit") == 1 and "fxgraph_cache_miss" not in second


def test_the_default_is_under_the_users_cache_and_a_set_variable_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert TrainConfig().compile_cache == "~/.cache/gpt-speedrun/compile"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert use_compile_cache("~/.cache/gpt-speedrun/compile") == str(
        tmp_path / ".cache" / "gpt-speedrun" / "compile"
    )
    assert (tmp_path / ".cache" / "gpt-speedrun" / "compile").is_dir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    assert use_compile_cache(str(tmp_path / "mine")) == "/elsewhere"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert use_compile_cache("") is None  # torch's own default
