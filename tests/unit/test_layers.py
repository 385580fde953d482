"""The house's layers, read from the source: which package may import which, no import cycle,
small modules, a thin entry point. `stages` (the stage table and its rule) is the bottom layer:
it imports nothing of the project, and every package may import it. `scripts` (the benchmarks,
the GPU proof, the GPU dry run, sampling) is the top: it may import anything, nothing imports
it, and a script that builds a run builds it as training does (`trainer/build.py`)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("model", "optim", "data", "trainer", "stages", "scripts")
BOTTOM, TOP = "stages", "scripts"


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


def test_model_and_data_import_only_themselves_and_the_bottom() -> None:
    for top in ("model", "data"):
        bad = {m: d for m, deps in GRAPH.items() if m.split(".")[0] == top for d in deps
               if d.split(".")[0] not in (top, BOTTOM)}  # fmt: skip
        assert not bad, bad


def test_the_stage_table_imports_nothing_of_the_project() -> None:
    """stages/ is the bottom layer every package may import: it imports only itself."""
    bad = {m: d for m, deps in GRAPH.items() if m.split(".")[0] == BOTTOM for d in deps
           if d.split(".")[0] != BOTTOM}  # fmt: skip
    assert not bad, bad
    assert "stages.table" in GRAPH and GRAPH["stages"] >= {"stages.table"}


# The model's config: its schema, and the pure schedules of the forward's step arguments (the
# window, the MTP weights, and the forward's whole set) read from the stage table.
CONFIG_LAYER = {
    "model.config", "model.window_schedule", "model.mtp_schedule", "model.forward_schedule",
}  # fmt: skip


def in_config_layer(name: str) -> bool:
    """`name` is the config schema (model.config or one of its group modules), the window or
    MTP-weight schedule (torch-free functions of the config), or the stage table below all."""
    return name in CONFIG_LAYER or name.startswith("model.config.") or name.split(".")[0] == BOTTOM


def test_trainer_imports_from_model_only_config_schemas() -> None:
    bad = {m: d for m, deps in GRAPH.items() if m.startswith("trainer") for d in deps
           if d.split(".")[0] == "model" and not in_config_layer(d)}  # fmt: skip
    assert not bad, bad


def test_the_model_config_is_a_schema_only() -> None:
    """model/config/ imports nothing of the model's parts (only itself, the window and
    MTP-weight schedules and the stage table): reading or checking a config never builds, or
    imports, a model."""
    bad = {m: d for m, deps in GRAPH.items() if in_config_layer(m) for d in deps
           if not in_config_layer(d)}  # fmt: skip
    assert not bad, bad
    assert in_config_layer("model.config.attention") and not in_config_layer("model.gpt")


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


def test_nothing_imports_the_scripts() -> None:
    """The product (every package but scripts/, and the entry point) imports no script."""
    bad = {m: d for m, deps in GRAPH.items() if m.split(".")[0] != TOP for d in deps
           if d.split(".")[0] == TOP}  # fmt: skip
    assert not bad, bad


def builds_by_hand(path: Path) -> list[str]:
    """What `path` imports of the run's own builders (the optimizer object's
    `build_optimizer`, the data's `build_data`): a module that builds a run from them wires
    it by hand, beside `trainer.build.build_run`."""
    names = {"build_optimizer", "build_data"}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [f"{node.module}.{a.name}" for a in node.names if a.name in names]
            found += [node.module] if node.module in ("optim.build", "data.build") else []
    return found


def test_scripts_build_runs_as_training_does(tmp_path: Path) -> None:
    """Only the benchmarks' `PARTS` (scripts/bench/presets.py, train.py's parts) names the
    run's builders: every other script builds a run with `build_run` over `PARTS`. The check
    finds a script that builds an optimizer by hand."""
    fake = tmp_path / "hand_built.py"
    fake.write_text("from optim import build_optimizer\nfrom model import GPT\n")
    assert builds_by_hand(fake) == ["optim.build_optimizer"]
    bad = {m: found for m, path in modules().items() if m.split(".")[0] == TOP
           if (found := builds_by_hand(path)) and m != "scripts.bench.presets"}  # fmt: skip
    assert not bad, bad


def test_the_entry_stays_thin() -> None:
    # Modules have no line cap: one concept a module, however long that concept is.
    assert len((ROOT / "train.py").read_text(encoding="utf-8").splitlines()) < 80


def nothing_imports(graph: dict[str, set[str]], name: str) -> dict[str, str]:
    """The modules of `graph` that import `name` (module -> `name`)."""
    return {m: name for m, deps in graph.items() if name in deps}


def test_nothing_imports_the_entry_point() -> None:
    assert nothing_imports({"a": {"train"}, "b": set()}, "train") == {"a": "train"}
    bad = nothing_imports(GRAPH, "train")
    assert not bad, bad


def allowed_in(docstring: str, heading: str) -> set[str]:
    """The dotted names a docstring lists after `heading` (to the end of its paragraph)."""
    _, found, rest = docstring.partition(heading)
    assert found, f"no {heading!r} paragraph"
    return set(re.findall(r"trainer(?:\.\w+)+", rest.split("\n\n")[0]))


def room_of(module: str, rooms: set[str]) -> str | None:
    """The room (a trainer sub-package) `module` belongs to, or None (the centre)."""
    return next((r for r in rooms if module == r or module.startswith(f"{r}.")), None)


def within(name: str, allowed: set[str]) -> bool:
    return any(name == a or name.startswith(f"{a}.") for a in allowed)


def outside_rules(graph: dict[str, set[str]], rules: dict[str, set[str]]) -> dict[str, str]:
    """Each trainer import (module -> what it imports) that leaves its room for somewhere its
    room's rule (`rules`: room -> what it may import from the trainer) does not allow."""
    bad = {}
    for m, deps in graph.items():
        room = room_of(m, set(rules))
        for d in deps:
            if room and d.startswith("trainer.") and not within(d, {room, *rules[room]}):
                bad[m] = d
    return bad


def rooms() -> dict[str, set[str]]:
    """Each trainer sub-package -> what its docstring says it may import from the trainer."""
    found = {}
    for init in sorted((ROOT / "trainer").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        found[f"trainer.{init.parent.name}"] = allowed_in(doc, "Imports from the trainer:")
    return found


def test_rooms_import_only_what_their_docstring_allows() -> None:
    """A room's modules import from the rest of the trainer only what the room's docstring
    lists (checked from the source, and shown to find a breach)."""
    rules = {"trainer.observe": {"trainer.config"}, "trainer.launch": set()}
    fake = {"trainer.observe.m": {"trainer.config", "trainer.launch.dist", "trainer.observe.x"}}
    assert outside_rules(fake, rules) == {"trainer.observe.m": "trainer.launch.dist"}
    doc = "Owns x.\n\nImports from the trainer: trainer.a,\ntrainer.b.c.\n\nNot trainer.d."
    assert allowed_in(doc, "Imports from the trainer:") == {"trainer.a", "trainer.b.c"}
    found = rooms()
    assert set(found) == {"trainer.checkpoint", "trainer.cli", "trainer.launch", "trainer.observe"}
    bad = outside_rules(GRAPH, found)
    assert not bad, bad


def test_rooms_leave_the_loop_alone() -> None:
    """No room may import the loop's modules (the centre but for what every room shares), the
    loop or the entry point; observing imports no launch or checkpoint, checkpoints no
    loop, and the command line no checkpoint or observing."""
    trainer_doc = ast.get_docstring(ast.parse((ROOT / "trainer/__init__.py").read_text()))
    shared = allowed_in(trainer_doc or "", "Shared by every room:")
    found = rooms()
    for room, allowed in found.items():
        centre = {a for a in allowed if room_of(a, set(found)) is None}
        assert centre <= shared, (room, centre - shared)
    forbidden = {
        "trainer.observe": {"trainer.launch", "trainer.checkpoint", "trainer.cli"},
        "trainer.checkpoint": {"trainer.cli"},
        "trainer.cli": {"trainer.checkpoint", "trainer.observe"},
        "trainer.launch": {"trainer.checkpoint", "trainer.observe", "trainer.cli"},
    }
    for room, never in forbidden.items():
        assert not any(within(a, never) for a in found[room]), (room, found[room] & never)


def test_shared_modules_import_no_room() -> None:
    """What every room shares imports from the trainer only itself: a room that imported the
    loop through it would be one import away from a cycle."""
    trainer_doc = ast.get_docstring(ast.parse((ROOT / "trainer/__init__.py").read_text()))
    shared = allowed_in(trainer_doc or "", "Shared by every room:")
    assert shared == {
        "trainer.config",
        "trainer.config_checks",
        "trainer.config_across",
        "trainer.runtime",
        "trainer.run_dir",
        "trainer.reference",
    }
    fake = {"trainer.config": {"trainer.run_dir", "trainer.launch.dist"}}
    assert outside_rules(fake, {"trainer.config": shared}) == {
        "trainer.config": "trainer.launch.dist"
    }
    bad = outside_rules(
        {m: d for m, d in GRAPH.items() if m in shared}, {m: shared for m in shared}
    )
    assert not bad, bad


def test_the_command_line_starts_without_torch() -> None:
    """What train.py imports before the config is valid imports no torch: a typo on the
    command line fails in a fraction of a second."""
    code = (
        "import sys, trainer.cli.main, trainer.config\n"
        "sys.exit(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3] or 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
