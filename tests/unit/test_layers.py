"""The house's layers, read from the source: which package may import which, no import cycle,
small modules, a thin entry point."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("model", "optim", "data", "trainer")


def modules() -> dict[str, Path]:
    """Every project module by dotted name (packages by their __init__)."""
    found = {"train": ROOT / "train.py"}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `path` imports, at any depth of its code (type-checking blocks and
    function bodies too): an import anywhere is a dependency."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        out |= {n for n in names if n in known}
    return out


GRAPH = {name: imports(path, modules()) for name, path in modules().items()}


def test_optim_imports_nothing_from_model_or_trainer() -> None:
    bad = {m: d for m, deps in GRAPH.items() if m.startswith("optim") for d in deps
           if d.split(".")[0] in ("model", "trainer", "data")}  # fmt: skip
    assert not bad, bad


def test_model_and_data_import_only_themselves() -> None:
    for top in ("model", "data"):
        bad = {m: d for m, deps in GRAPH.items() if m.split(".")[0] == top for d in deps
               if d.split(".")[0] != top}  # fmt: skip
        assert not bad, bad


def test_trainer_imports_from_model_only_config_schemas() -> None:
    bad = {m: d for m, deps in GRAPH.items() if m.startswith("trainer") for d in deps
           if d.split(".")[0] == "model" and d != "model.config"}  # fmt: skip
    assert not bad, bad


def test_no_import_cycle() -> None:
    """Depth-first search for a back edge, packages' __init__ included."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(GRAPH[name]):
            if state.get(dep) == 1:
                pytest.fail(f"import cycle: {' -> '.join([*path, name, dep])}")
            if dep not in state:
                visit(dep, [*path, name])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [])


def test_modules_stay_small_and_the_entry_thin() -> None:
    sources = [
        *modules().values(),
        *(ROOT / "scripts").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
    ]
    long = {str(p.relative_to(ROOT)): n for p in sources
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 350}  # fmt: skip
    assert not long, long
    assert len((ROOT / "train.py").read_text(encoding="utf-8").splitlines()) < 80
