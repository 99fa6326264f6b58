"""The Hugging Face bridge: one mapping module per family (config.registry.HF_FAMILIES).

Each module declares, without torch, `to_model`, `to_hf`, `matches` and `weights` (see
config.registry.HfFamily); models/hf/mapping.py turns a declaration into reads and splits of
tensors, models/hf/safetensors_io.py reads and writes the files.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from config.hf import family
from config.registry import HF_FAMILIES


def module_of(name: str) -> ModuleType:
    """The mapping module of a registered family (config.registry.HF_FAMILIES)."""
    return importlib.import_module(HF_FAMILIES[name].module)


def family_module(hf: dict[str, Any], folder: Path) -> ModuleType:
    """The mapping module of the family a folder's config.json names."""
    return module_of(family(hf, folder).name)
