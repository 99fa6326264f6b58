"""The recipe catalog, the CLI (`recipes ...`, `python -m recipes ...`) and the NeMo-Run entry points.

The project's packages have plain top-level names (config, models, data, training, launchers),
names a researcher's own folder may hold too: a `config.py` or a `data/` package beside a script
comes first on sys.path (Python puts the script's folder, or the working directory for `python -m`
and `python -c`, in front of every installed package). Importing `recipes` therefore binds its
sibling packages here, loaded from the folder that holds this package, before anything imports
them by name; a process that already holds one of those names from elsewhere gets an ImportError
naming both, since the two cannot share one name in one process. The ranks are kept apart from
the working directory by the launcher instead (PYTHONSAFEPATH, launchers/env.py).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SIBLINGS = ("config", "models", "data", "training", "launchers")  # what recipes imports by name
PROJECT_ROOT = Path(__file__).resolve().parent.parent  # the folder holding recipes and SIBLINGS


def _location(module: object) -> str:
    """Where a module was loaded from: its file, else its folders (a namespace package)."""
    file = getattr(module, "__file__", None)
    if file:
        return str(file)
    return ", ".join(str(p) for p in getattr(module, "__path__", [])) or repr(module)


def _is_ours(module: object, name: str) -> bool:
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and Path(file).resolve() == PROJECT_ROOT / name / "__init__.py"


def claim_siblings() -> None:
    """Load each sibling package from PROJECT_ROOT unless the process holds it already; ImportError
    when the process holds one of those names from anywhere else."""
    for name in SIBLINGS:
        held = sys.modules.get(name)
        if held is not None:
            if _is_ours(held, name):
                continue
            raise ImportError(
                f"this process imported a module named '{name}' from {_location(held)} before "
                f"`recipes`, which needs its own package '{name}' at {PROJECT_ROOT / name}: one "
                f"process cannot hold both under one name. Rename yours (and the imports of it), "
                f"or move it into a package of your own and import it as myproject.{name}.",
                name=name,
            )
        init = PROJECT_ROOT / name / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(init.parent)]
        )
        if spec is None or spec.loader is None or not init.is_file():
            raise ImportError(
                f"the project's package '{name}' is missing beside recipes: no {init}; "
                "reinstall the project (pip install -e .)",
                name=name,
            )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise


claim_siblings()
