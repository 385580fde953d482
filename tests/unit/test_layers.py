"""The house's layers, read from the source: which package may import which, no import cycle,
small modules, a thin entry point."""

import ast
from pathlib import Path

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


# The model's config: its schema, and the pure window schedule the schema's step arguments
# and the trainer's sequence length by phase share.
CONFIG_LAYER = {"model.config", "model.window_schedule"}


def in_config_layer(name: str) -> bool:
    """`name` is the config schema (model.config or one of its group modules) or the window
    schedule."""
    return name in CONFIG_LAYER or name.startswith("model.config.")


def test_trainer_imports_from_model_only_config_schemas() -> None:
    bad = {m: d for m, deps in GRAPH.items() if m.startswith("trainer") for d in deps
           if d.split(".")[0] == "model" and not in_config_layer(d)}  # fmt: skip
    assert not bad, bad


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import cycle of `graph` (module -> the modules it imports) as a path, or None:
    depth-first search for a back edge."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                return [*path, name, dep]
            if dep not in state and (cycle := visit(dep, [*path, name])):
                return cycle
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name, [])):
            return cycle
    return None


def test_no_import_cycle() -> None:
    """The project's import graph, packages' __init__ included, has no cycle, and the search
    finds one where there is one."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    cycle = find_cycle(GRAPH)
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


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
