"""The floors of the project import one way: config <- models, data <- training <- launchers <- recipes.

Read from the import statements of every module (functions' bodies included), so that a lazy import
inside a function counts as much as one at the top. models and data stand side by side on one
floor and import neither each other nor anything above them; config imports no other package of
the project. The registry names builders as "module:function" strings (config/registry.py), which
the ranks import: those are not imports of the floor that names them.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Each package and the floor it stands on; a module may import its own package and lower floors.
FLOORS = {"config": 0, "models": 1, "data": 1, "training": 2, "launchers": 3, "recipes": 4}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    """(top-level package, line) of every absolute import in a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


def layer_violations(root: Path) -> list[str]:
    """'file:line: package (floor a) imports package (floor b)' for every import that does not go
    strictly down (or stay inside its own package)."""
    out = []
    for package, floor in FLOORS.items():
        for path in sorted((root / package).rglob("*.py")):
            for imported, line in sorted(imported_packages(path)):
                if imported in FLOORS and imported != package and FLOORS[imported] >= floor:
                    where = path.relative_to(root)
                    out.append(
                        f"{where}:{line}: {package} (floor {floor}) imports {imported} "
                        f"(floor {FLOORS[imported]})"
                    )
    return out


def test_every_floor_imports_only_the_floors_below() -> None:
    assert layer_violations(REPO) == []


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    """The check itself can fail: a copy of the tree with one lazy upward import added."""
    for package in FLOORS:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    schema = tmp_path / "config" / "schema.py"
    schema.write_text(
        schema.read_text() + "\n\ndef _late():\n    from training.engine import Trainer\n"
    )
    sideways = tmp_path / "models" / "tiny.py"
    sideways.write_text(sideways.read_text() + "\nimport data.sft\n")
    found = layer_violations(tmp_path)
    assert len(found) == 2, found
    assert found[0].startswith("config/schema.py:") and "imports training" in found[0]
    assert found[1].startswith("models/presets/tiny.py:") and "imports data (floor 1)" in found[1]
