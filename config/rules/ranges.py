"""Every number lies in its field's range: counts of at least 1, dropout below 1, finite floats,
seeds that NumPy takes, sizes below bounds that no real model reaches.

Overrides and YAML are checked as they are read (config/tree.py); this rule catches the values a
recipe function set in Python, which no parser saw. The ranges come from the schema (`within`
metadata). When it finds anything, `validate` runs no other rule: they would divide by these
values, or loop over them.
"""

from __future__ import annotations

from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig
from config.tree import leaves, out_of_range


def ranges(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    return [
        Problem(path, why)
        for cls, name, path, value in leaves(cfg)
        if (why := out_of_range(cls, name, value)) is not None
    ]
