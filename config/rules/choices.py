"""Every string field with a fixed set of values holds one of them.

Overrides and YAML are checked as they are read (config/tree.py); this rule catches the values a
recipe function set in Python, which no parser saw. The valid values come from the schema: a
`Literal[...]`, or the registry a field's `one_of` metadata names.
"""

from __future__ import annotations

from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig
from config.tree import choices as field_choices
from config.tree import leaves, not_one_of


def choices(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    problems = []
    for cls, name, path, value in leaves(cfg):
        allowed = field_choices(cls, name)
        if allowed is not None and value is not None and value not in allowed:
            problems.append(Problem(path, not_one_of(value, allowed)))
    return problems
