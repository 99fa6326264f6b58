"""Every recipe is also a NeMo-Run config: a `run.Partial` of the training entry point.

The fast path (dataclasses + our dotlist) and NeMo-Run (run.Config tree + its dotlist parser) must
reach the same config for the same overrides.
"""

from __future__ import annotations

import pytest

run = pytest.importorskip("nemo_run")

from nemo_run.cli.cli_parser import ParseError, parse_cli_args  # noqa: E402

from config.tree import apply_overrides  # noqa: E402
from recipes.nemo import from_partial, partial, register_factories  # noqa: E402
from recipes.registry import all_recipes, get  # noqa: E402
from training.entry import pretrain  # noqa: E402


@pytest.mark.parametrize("name", sorted(all_recipes()))
def test_partial_builds_the_same_config(name: str) -> None:
    task = partial(name)
    assert isinstance(task, run.Partial)
    assert task.__fn_or_cls__ is pretrain
    assert from_partial(task) == get(name).config()


def test_editing_the_partial_is_an_override() -> None:
    task = partial("llama3_8b_pretrain")
    task.config.parallel.tensor_model_parallel_size = 2
    task.config.train.max_steps = 10
    expected = apply_overrides(
        get("llama3_8b_pretrain").config(),
        ["parallel.tensor_model_parallel_size=2", "train.max_steps=10"],
    )
    assert from_partial(task) == expected


OVERRIDES = [
    "parallel.tensor_model_parallel_size=4",
    "parallel.virtual_pipeline_model_parallel_size=None",
    "precision=bf16_with_fp8_current_scaling_mixed",
    "optimizer.lr=0.0001",
    "train.max_steps=100",
]


def test_nemo_run_cli_factory_and_dotlist_agree_with_ours() -> None:
    """NeMo-Run's own CLI: pick the recipe by factory name, override with its dotlist parser."""
    register_factories()
    args = ["config=llama3_70b_pretrain", *(f"config.{o}" for o in OVERRIDES)]
    task = parse_cli_args(pretrain, args, output_type=run.Partial)
    expected = apply_overrides(get("llama3_70b_pretrain").config(), OVERRIDES)
    assert from_partial(task) == expected


def test_nemo_run_refuses_a_value_outside_a_literal_as_we_do() -> None:
    """The schema's Literal fields are checked by NeMo-Run's own parser too (not only by ours)."""
    from config.tree import ConfigError

    task = partial("tiny_gpt_pretrain")
    ok = parse_cli_args(pretrain, ["config.scheduler.decay_style=linear"], task)
    assert from_partial(ok).scheduler.decay_style == "linear"
    with pytest.raises(ParseError, match="cosin"):
        parse_cli_args(
            pretrain, ["config.scheduler.decay_style=cosin"], partial("tiny_gpt_pretrain")
        )
    with pytest.raises(ConfigError, match="Did you mean 'cosine'"):
        apply_overrides(get("tiny_gpt_pretrain").config(), ["scheduler.decay_style=cosin"])
