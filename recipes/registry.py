"""The recipe catalog: every recipe registers itself here with the cluster it was published for.

A recipe is a plain function returning a `TrainingConfig`. Registering records its name, its
published cluster (the size the default layout came from) and where that layout was published.
This is the fast path (no torch, no NeMo-Run); `recipes.nemo` turns the same function into a
NeMo-Run `run.Partial` of the training entry point. Recipes are discovered from the modules of
`recipes.catalog`, so adding a model family never means editing a list.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from config.hardware import Cluster
from config.schema import TrainingConfig
from config.tree import ConfigError, apply_overrides, suggest


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


_RECIPES: dict[str, Recipe] = {}


def recipe(*, nodes: int, gpus_per_node: int = 8, gpu: str = "h100", source: str) -> Callable:
    """Register a recipe function under its own name."""

    def register(fn: Callable[[], TrainingConfig]) -> Callable[[], TrainingConfig]:
        if fn.__name__ in _RECIPES:
            raise ValueError(f"recipe {fn.__name__} is registered twice")
        summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        _RECIPES[fn.__name__] = Recipe(
            name=fn.__name__,
            build=fn,
            cluster=Cluster(num_nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu),
            source=source,
            summary=summary,
        )
        return fn

    return register


def _load_catalog() -> None:
    import recipes.catalog as catalog

    for module in pkgutil.iter_modules(catalog.__path__):
        importlib.import_module(f"recipes.catalog.{module.name}")


def all_recipes() -> dict[str, Recipe]:
    if not _RECIPES:
        _load_catalog()
    return dict(sorted(_RECIPES.items()))


def resolve(name: str, overrides: list[str]) -> tuple[Recipe, TrainingConfig]:
    """A catalog recipe with dotlist overrides applied; raises ConfigError naming the fields."""
    recipe = get(name)
    return recipe, apply_overrides(recipe.config(), overrides)


def get(name: str) -> Recipe:
    recipes = all_recipes()
    if name not in recipes:
        hint = suggest(name, list(recipes)) or " Run `recipes list` to see them all."
        raise ConfigError([("recipe", f"unknown recipe '{name}'.{hint}")])
    return recipes[name]
