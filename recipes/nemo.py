"""Where the fast path meets NeMo-Run: a recipe as a `run.Partial` of the training entry point.

The catalog builds plain `TrainingConfig` dataclasses (no torch, no NeMo-Run: `list`, `show` and
`check` answer in well under a second). This module mirrors that same tree, node by node, as
`run.Config` objects under `run.Partial(training.entry.pretrain, config=...)`, so that every recipe
also works with `run.run`, `run.Experiment` and NeMo-Run's CLI factories; `from_partial` builds it
back. Nothing else converts between the two worlds.

    import nemo_run as run
    from recipes.nemo import partial
    task = partial("llama3_8b_pretrain")
    task.config.parallel.tensor_model_parallel_size = 2
    run.run(task, executor=run.LocalExecutor(ntasks_per_node=8, launcher="torchrun"))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import nemo_run as run

from config.schema import TrainingConfig
from recipes.registry import all_recipes, get
from training.entry import pretrain


def to_config(node: Any) -> Any:
    """The `run.Config` mirror of a config dataclass tree (other values pass through)."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return run.Config(
            type(node),
            **{f.name: to_config(getattr(node, f.name)) for f in dataclasses.fields(node)},
        )
    if isinstance(node, list):
        return [to_config(v) for v in node]
    return node


def partial(recipe: str | TrainingConfig) -> run.Partial:
    """`run.Partial(pretrain, config=...)` of a catalog recipe name or a built config."""
    cfg = get(recipe).config() if isinstance(recipe, str) else recipe
    return run.Partial(pretrain, config=to_config(cfg))


def from_partial(task: run.Partial) -> TrainingConfig:
    """Build the `TrainingConfig` that a (possibly edited) partial would pass to the entry point."""
    import fiddle as fdl

    return fdl.build(task).keywords["config"]


def register_factories() -> None:
    """Expose every catalog recipe as a NeMo-Run CLI factory of the entry point (`nemo llm ...`-style)."""
    for name in all_recipes():
        factory = _factory(name)
        run.cli.factory(target=pretrain, target_arg="config", name=name)(factory)


def _factory(name: str):
    def build() -> run.Config[TrainingConfig]:
        return to_config(get(name).config())

    build.__name__ = name
    return build
