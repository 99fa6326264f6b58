"""A recipe and how it registers: every recipe function registers itself with the cluster it was
published for.

A recipe is a plain function returning a `TrainingConfig`. Registering records its name, its
published cluster (the size the default layout came from) and where that layout was published.
The catalog's modules (recipes/catalog/) import this module only, and recipes/registry.py finds
them, so that the two never import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from config.hardware import Cluster
from config.schema import TrainingConfig


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    build: Callable[[], TrainingConfig]
    cluster: Cluster  # the job size and GPU kind of the published run
    source: str  # where the default layout was published
    summary: str

    def config(self) -> TrainingConfig:
        cfg = self.build()
        cfg.name = self.name
        return cfg


RECIPES: dict[str, Recipe] = {}


def recipe(*, nodes: int, gpus_per_node: int = 8, gpu: str = "h100", source: str) -> Callable:
    """Register a recipe function under its own name."""

    def register(fn: Callable[[], TrainingConfig]) -> Callable[[], TrainingConfig]:
        if fn.__name__ in RECIPES:
            raise ValueError(f"recipe {fn.__name__} is registered twice")
        summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        RECIPES[fn.__name__] = Recipe(
            name=fn.__name__,
            build=fn,
            cluster=Cluster(num_nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu),
            source=source,
            summary=summary,
        )
        return fn

    return register
