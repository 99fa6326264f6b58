"""Golden files: what we generate (resolved recipes, sbatch scripts) kept in tests/golden/.

Refresh them all with `make golden` (python -m tests.support.refresh_golden) and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from config.finalize import finalize
from config.tree import to_dict
from recipes.registry import all_recipes

GOLDEN = Path(__file__).parents[1] / "golden"


def resolved_recipe_yaml(name: str) -> str:
    """A recipe's config tree and what finalize derives on its published cluster."""
    recipe = all_recipes()[name]
    cfg = recipe.config()
    derived = finalize(cfg, recipe.cluster)
    doc = {
        "recipe": name,
        "cluster": {
            "num_nodes": recipe.cluster.num_nodes,
            "gpus_per_node": recipe.cluster.gpus_per_node,
            "gpu": recipe.cluster.gpu,
        },
        "source": recipe.source,
        "config": to_dict(cfg),
        "derived": {
            "world_size": derived.world_size,
            "data_parallel_size": derived.data_parallel_size,
            "num_microbatches": derived.num_microbatches,
            "expert_data_parallel_size": derived.expert_data_parallel_size,
            "pipeline_model_parallel_layout": derived.pipeline_layout,
            "decoder_layers_per_rank": derived.decoder_layers_per_rank,
            "padded_vocab_size": derived.padded_vocab_size,
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)


def recipe_goldens() -> dict[Path, str]:
    return {
        GOLDEN / "recipes" / f"{name}.yaml": resolved_recipe_yaml(name) for name in all_recipes()
    }


README = Path(__file__).resolve().parents[2] / "README.md"
CHOICES_BEGIN = "<!-- fields with choices: generated from config/schema.py by `make golden` -->"
CHOICES_END = "<!-- end of generated fields -->"


def readme_choices() -> str:
    """The README's table of the fields with a fixed set of values, from the schema itself."""
    from config.schema import TrainingConfig
    from config.tree import choice_fields

    rows = [
        f"| `{path}` | {', '.join(f'`{v}`' for v in values)} |"
        for path, values in choice_fields(TrainingConfig)
    ]
    return "\n".join([CHOICES_BEGIN, "| field | values |", "|---|---|", *rows, CHOICES_END])


def readme_with_choices(text: str) -> str:
    """README text with its generated table replaced by the current one."""
    head, _, rest = text.partition(CHOICES_BEGIN)
    _, _, tail = rest.partition(CHOICES_END)
    return head + readme_choices() + tail


def all_goldens() -> dict[Path, str]:
    """Every golden file and its expected text; other generators add themselves here."""
    goldens = recipe_goldens()
    try:
        from tests.support.golden_sbatch import sbatch_goldens
    except ImportError:  # the launchers' goldens arrive with the launchers
        return goldens
    goldens.update(sbatch_goldens())
    return goldens
