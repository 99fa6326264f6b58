"""Finding a recipe by name: the catalog's modules are imported on first use and register
themselves (recipes/recipe.py).

This is the fast path (no torch, no NeMo-Run); `recipes.nemo` turns the same function into a
NeMo-Run `run.Partial` of the training entry point. Recipes are discovered from the modules of
`recipes.catalog`, so adding a model family never means editing a list.
"""

from __future__ import annotations

import importlib
import pkgutil

from config.schema import TrainingConfig
from config.tree import ConfigError, apply_overrides, suggest
from recipes.recipe import RECIPES, Recipe


def _load_catalog() -> None:
    import recipes.catalog as catalog

    for module in pkgutil.iter_modules(catalog.__path__):
        importlib.import_module(f"recipes.catalog.{module.name}")


def all_recipes() -> dict[str, Recipe]:
    if not RECIPES:
        _load_catalog()
    return dict(sorted(RECIPES.items()))


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
