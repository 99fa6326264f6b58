"""Every number lies in its field's range: counts of at least 1, dropout below 1, finite floats,
seeds that NumPy takes, sizes below bounds that no real model reaches.

Overrides and YAML are checked as they are read (config/tree.py); this rule catches the values a
recipe function set in Python, which no parser saw. The ranges come from the schema (`within`
metadata). When it finds anything, `validate` runs no other rule: they would divide by these
values, or loop over them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from config.finalize import Derived
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig
from config.tree import out_of_range


def ranges(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    return list(_walk(cfg, ""))


def _walk(node: Any, prefix: str) -> Any:
    for f in dataclasses.fields(node):
        value, path = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _walk(value, f"{path}.")
        elif (why := out_of_range(type(node), f.name, value)) is not None:
            yield Problem(path, why)
