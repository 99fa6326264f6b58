"""The floors of the project import one way, and no modules import each other in a circle.

Floors, lowest first: config <- models, data <- training <- launchers <- recipes. Read from the
import statements of every module (functions' bodies and `if TYPE_CHECKING:` blocks included), so
that a lazy import inside a function counts as much as one at the top. models and data stand side
by side on one floor and import neither each other nor anything above them; config imports no
other package of the project. The registry names builders as "module:function" strings
(config/registry.py), which the ranks import: those are not imports of the floor that names them.

Circles are looked for twice: between modules (importing `a.b.c` also runs the `__init__` of `a.b`,
so that counts as an import of `a.b`), and between the rooms of a package (`config.cost` and
`config.rules`, `training.checkpoint.store` and `training.resilience`), where a circle hides when each
side imports a different module of the other.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Each package and the floor it stands on; a module may import its own package and lower floors.
FLOORS = {"config": 0, "models": 1, "data": 1, "training": 2, "launchers": 3, "recipes": 4}


def modules(root: Path) -> dict[str, Path]:
    """Every module of the project's packages by dotted name (a package by its own name)."""
    found = {}
    for package in FLOORS:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path) -> list[tuple[str, int]]:
    """(dotted name, line) of every absolute import in a module; `from a import b` gives a.b."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def layer_violations(root: Path) -> list[str]:
    """'file:line: package (floor a) imports package (floor b)' for every import that does not go
    strictly down (or stay inside its own package)."""
    out = []
    for name, path in modules(root).items():
        package, floor = name.split(".")[0], FLOORS[name.split(".")[0]]
        for imported, line in sorted(set(imports(path))):
            top = imported.split(".")[0]
            if top in FLOORS and top != package and FLOORS[top] >= floor:
                where = path.relative_to(root)
                out.append(
                    f"{where}:{line}: {package} (floor {floor}) imports {top} (floor {FLOORS[top]})"
                )
    return sorted(out)


def module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project's modules its imports run (the packages on the way included)."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for imported, _ in imports(path):
            parts = imported.split(".")
            for i in range(2, len(parts) + 1):
                target = ".".join(parts[:i])
                # a module's own packages are running already when its body runs
                if target in known and not name.startswith(target + "."):
                    targets.add(target)
        graph[name] = targets - {name}
    return graph


def room(name: str) -> str:
    """The room a module lives in: its package below the top one (config.cost.memory ->
    config.cost), or the module itself directly under a top package (config.schema)."""
    parts = name.split(".")
    return ".".join(parts[:2])


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for name, targets in graph.items():
        rooms.setdefault(room(name), set()).update(
            room(t) for t in targets if room(t) != room(name)
        )
    return rooms


def test_every_floor_imports_only_the_floors_below() -> None:
    assert layer_violations(REPO) == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert circles(module_graph(REPO)) == []


def test_no_rooms_import_each_other_in_a_circle() -> None:
    assert circles(room_graph(module_graph(REPO))) == []


def _copy(root: Path) -> None:
    for package in FLOORS:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("*.pyc"))


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    """The check itself can fail: a copy of the tree with one lazy upward import added."""
    _copy(tmp_path)
    schema = tmp_path / "config" / "schema.py"
    schema.write_text(
        schema.read_text() + "\n\ndef _late():\n    from training.engine import Trainer\n"
    )
    sideways = next((tmp_path / "models").rglob("*.py"))
    sideways.write_text(sideways.read_text() + "\nimport data.sft\n")
    found = layer_violations(tmp_path)
    assert len(found) == 2, found
    assert found[0].startswith("config/schema.py:") and "imports training" in found[0]
    assert found[1].startswith("models/") and "imports data (floor 1)" in found[1]


def test_a_hidden_circle_is_caught(tmp_path: Path) -> None:
    """A lazy import that closes a circle between two modules, and one between two rooms."""
    _copy(tmp_path)
    finalize = tmp_path / "config" / "finalize.py"
    finalize.write_text(finalize.read_text() + "\n\ndef _late():\n    from config import tree\n")
    tree = tmp_path / "config" / "tree.py"
    tree.write_text(tree.read_text() + "\n\ndef _later():\n    import config.finalize\n")
    assert ["config.finalize", "config.tree"] in circles(module_graph(tmp_path))
    rooms = sorted({room(m) for m in module_graph(tmp_path) if m.count(".") >= 2})
    first, second = rooms[0], rooms[1]
    a = next(p for m, p in modules(tmp_path).items() if m.startswith(first + "."))
    b = next(p for m, p in modules(tmp_path).items() if m.startswith(second + "."))
    b_name = next(m for m in modules(tmp_path) if m.startswith(second + "."))
    a_name = next(m for m in modules(tmp_path) if m.startswith(first + "."))
    a.write_text(a.read_text() + f"\n\ndef _x():\n    import {b_name}\n")
    b.write_text(b.read_text() + f"\n\ndef _y():\n    import {a_name}\n")
    assert any(first in c and second in c for c in circles(room_graph(module_graph(tmp_path))))


def test_the_readme_maps_every_room() -> None:
    """The README's layout map names every package and room, and nothing that is not there."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    named = {word.rstrip("/") for word in block.split() if word.endswith("/") and "<" not in word}
    rooms = {
        path.parent.name
        for package in FLOORS
        for path in (REPO / package).rglob("__init__.py")
        if "__pycache__" not in path.parts
    }
    folders = {p.name for p in REPO.rglob("*") if p.is_dir() and ".venv" not in p.parts}
    assert rooms - named == set(), "rooms missing from the README's layout map"
    assert named - folders == set(), "the README's layout map names folders that do not exist"
