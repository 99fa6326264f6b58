"""`config.rules.derive`: the complete derived values of a config the checker accepts, or the
checker's problems. What runs after the check (the estimate, the step-time model, the engine) reads
a `Derived`, every value set; the rules read finalize's `Partial`, None where a value cannot be
derived."""

from __future__ import annotations

import dataclasses

import pytest

from config.finalize import Derived, Partial, complete, finalize, missing
from config.hardware import Cluster
from config.rules import derive, validate
from config.tree import ConfigError
from recipes.registry import all_recipes, resolve

H100x8 = Cluster(num_nodes=1, gpus_per_node=8, gpu="h100")


@pytest.mark.parametrize("name", sorted(all_recipes()))
def test_every_recipe_derives_every_value(name: str) -> None:
    recipe = all_recipes()[name]
    cfg = recipe.config()
    derived = derive(cfg, recipe.cluster)
    partial = finalize(cfg, recipe.cluster)
    assert isinstance(derived, Derived) and missing(partial) == []
    assert derived == complete(partial)
    # The same values as finalize's: only the type says that none is missing.
    assert dataclasses.astuple(derived) == dataclasses.astuple(partial)
    unset = [f.name for f in dataclasses.fields(derived) if getattr(derived, f.name) is None]
    assert unset in ([], ["pipeline_layout"])  # None: Megatron-Core's own even split


@pytest.mark.parametrize(
    ("overrides", "precision"),
    [
        (["train.global_batch_size=7"], None),  # not a whole number of microbatches
        (["parallel.tensor_model_parallel_size=3"], None),  # 8 GPUs hold no whole TP 3 replicas
        ([], "nope"),  # no preset (set in Python: the dotlist refuses it itself)
        (["parallel.sequence_parallel=true"], None),  # every value derives, and the rule refuses
    ],
)
def test_an_invalid_config_derives_nothing_and_raises_the_checkers_problems(
    overrides: list[str], precision: str | None
) -> None:
    _, cfg = resolve("llama3_8b_pretrain", overrides)
    cfg.precision = precision or cfg.precision
    problems = validate(cfg, H100x8)
    assert problems
    with pytest.raises(ConfigError) as err:
        derive(cfg, H100x8)
    assert err.value.problems == [(p.field, p.message) for p in problems]


def test_a_partial_with_a_value_missing_does_not_complete() -> None:
    """A Partial with a value missing completes to None, and `missing` names the value."""
    _, cfg = resolve("llama3_8b_pretrain", ["parallel.tensor_model_parallel_size=3"])
    partial = finalize(cfg, H100x8)
    assert type(partial) is Partial
    assert complete(partial) is None
    assert missing(partial) == [
        "data_parallel_size",
        "num_microbatches",
        "expert_data_parallel_size",
    ]
