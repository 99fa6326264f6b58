"""The catalog: every recipe builds, validates and fits on the cluster it was published for.

Recipes are discovered from the registry, never listed by hand, so a new recipe is tested the
moment it is registered. Only the names the issue asks for are spelled out, to catch one going
missing.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from config.finalize import finalize
from config.hardware import GPUS
from config.rules import derive, validate
from recipes.recipe import Recipe
from recipes.registry import all_recipes

RECIPES = all_recipes()
HAS_ESTIMATE = importlib.util.find_spec("config.cost.memory") is not None
needs_estimate = pytest.mark.skipif(
    not HAS_ESTIMATE, reason="config/cost/memory.py is not there yet"
)

REQUIRED = [
    "llama32_1b_pretrain",
    "llama32_3b_pretrain",
    "llama3_8b_pretrain",
    "llama3_70b_pretrain",
    "llama31_405b_pretrain",
    "mixtral_8x7b_pretrain",
    "qwen3_30b_a3b_pretrain",
    "deepseek_v3_pretrain",
    "tiny_gpt_pretrain",
    "tiny_moe_pretrain",
    "llama3_70b_pretrain_64gpu_h100_fp8cs",
]

# The precision suffix of a variant's name and the preset it stands for.
SUFFIXES = {
    "bf16": "bf16_mixed",
    "fp8ds": "bf16_with_fp8_delayed_scaling_mixed",
    "fp8cs": "bf16_with_fp8_current_scaling_mixed",
    "fp8sc": "bf16_with_fp8_subchannel_scaling_mixed",
    "fp8mx": "bf16_with_mxfp8_mixed",
    "nvfp4": "bf16_with_nvfp4_mixed",
}
NAME = re.compile(
    r"^(?P<base>[a-z0-9]+(?:_[a-z0-9]+)*?_(?:pretrain|sft|lora))"
    rf"(?:_(?P<gpus>\d+)gpu_(?P<gpu>[a-z0-9]+)_(?P<precision>{'|'.join(SUFFIXES)}))?$"
)

# Published totals (model cards, reports), in billions, embeddings included, MTP excluded.
PUBLISHED_PARAMS_B = {
    "llama32_1b_pretrain": 1.24,
    "llama32_3b_pretrain": 3.21,
    "llama3_8b_pretrain": 8.03,
    "llama3_70b_pretrain": 70.6,
    "llama31_405b_pretrain": 405.9,
    "mixtral_8x7b_pretrain": 46.7,
    "qwen3_30b_a3b_pretrain": 30.5,
    "deepseek_v3_pretrain": 671.0,
    "gpt_oss_20b_sft": 20.91,  # the gpt-oss model card's table (its active counts: see
    "gpt_oss_120b_pretrain": 116.83,  # tests/unit/models/test_hf_gpt_oss.py, no input embedding)
}
# Parameters a token passes through, for the mixtures of experts (billions).
PUBLISHED_ACTIVE_B = {
    "mixtral_8x7b_pretrain": 12.9,
    "qwen3_30b_a3b_pretrain": 3.3,
    "deepseek_v3_pretrain": 37.0,
}


def _ids(recipes: dict[str, Recipe]) -> list[str]:
    return sorted(recipes)


def test_required_recipes_exist() -> None:
    missing = [name for name in REQUIRED if name not in RECIPES]
    assert not missing, f"missing recipes: {missing}"


@pytest.mark.parametrize("name", _ids(RECIPES))
def test_recipe_builds_and_validates_on_its_cluster(name: str) -> None:
    recipe = RECIPES[name]
    cfg = recipe.config()
    assert cfg.name == name
    assert recipe.source.strip(), "every recipe names where its layout comes from"
    derived = finalize(cfg, recipe.cluster)
    problems = validate(cfg, recipe.cluster, derived)
    assert not problems, "\n".join(f"{p.field}: {p.message}" for p in problems)
    assert derived.data_parallel_size and derived.num_microbatches


@pytest.mark.parametrize("name", _ids(RECIPES))
def test_name_carries_scale_hardware_and_precision(name: str) -> None:
    match = NAME.match(name)
    assert match, (
        f"{name} is not <model>_<pretrain|sft|lora> or <model>_pretrain_<N>gpu_<gpu>_<precision>"
    )
    recipe, cfg = RECIPES[name], RECIPES[name].config()
    if match["gpus"] is None:
        assert cfg.precision == "bf16_mixed", (
            "base recipes run bf16_mixed; variants carry other precisions"
        )
        return
    assert match["base"] in RECIPES, f"variant {name} has no base recipe {match['base']}"
    assert int(match["gpus"]) == recipe.cluster.world_size
    assert match["gpu"] == recipe.cluster.gpu and match["gpu"] in GPUS
    assert cfg.precision == SUFFIXES[match["precision"]]


@pytest.mark.parametrize("name", _ids(RECIPES))
def test_gpu_conventions(name: str) -> None:
    """Sequence parallel whenever TP > 1 and the alltoall dispatcher on GPUs; neither on the CPU."""
    recipe, cfg = RECIPES[name], RECIPES[name].config()
    tp = cfg.parallel.tensor_model_parallel_size
    on_cpu = recipe.cluster.gpu == "cpu"
    assert cfg.parallel.sequence_parallel == (tp > 1 and not on_cpu)
    if cfg.model.num_moe_experts:
        assert cfg.model.moe_token_dispatcher_type == ("allgather" if on_cpu else "alltoall")


@pytest.mark.parametrize("name", _ids(RECIPES))
def test_each_build_is_a_fresh_tree(name: str) -> None:
    """Variants edit what their base returns: no two builds may share a mutable node."""
    first, second = RECIPES[name].config(), RECIPES[name].config()
    first.model.num_layers += 1
    first.parallel.tensor_model_parallel_size += 1
    first.train.global_batch_size += 1
    assert second.model.num_layers != first.model.num_layers
    assert second.parallel.tensor_model_parallel_size != first.parallel.tensor_model_parallel_size
    assert second.train.global_batch_size != first.train.global_batch_size


def test_tiny_recipes_run_on_two_cpu_processes() -> None:
    tiny = {name: r for name, r in RECIPES.items() if name.startswith("tiny_")}
    assert tiny
    for name, recipe in tiny.items():
        assert (recipe.cluster.gpu, recipe.cluster.world_size) == ("cpu", 2), name
    assert RECIPES["tiny_gpt_pretrain"].config().parallel.tensor_model_parallel_size == 2
    moe = RECIPES["tiny_moe_pretrain"].config()
    assert moe.parallel.expert_model_parallel_size == 2


def test_uneven_pipelines_get_the_published_balanced_layout() -> None:
    """61 + MTP and 126 layers do not split evenly; finalize must derive what the runs used."""
    deepseek = RECIPES["deepseek_v3_pretrain"]
    # Megatron-Bridge's DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1 pp_layout for PP8 x VP4.
    assert finalize(deepseek.config(), deepseek.cluster).pipeline_layout == "Et|(tt|)*30mL"
    llama = RECIPES["llama31_405b_pretrain"]
    assert finalize(llama.config(), llama.cluster).pipeline_layout == "Et|(tt|)*62tL"


@needs_estimate
@pytest.mark.parametrize("name", _ids(RECIPES))
def test_recipe_fits_its_gpu(name: str) -> None:
    from config.cost.memory import estimate_memory

    recipe = RECIPES[name]
    cfg = recipe.config()
    total = estimate_memory(cfg, recipe.cluster, derive(cfg, recipe.cluster)).total_gib
    assert total < recipe.cluster.spec.memory_gib, (
        f"predicted {total:.1f} GiB per GPU, {recipe.cluster.gpu} has {recipe.cluster.spec.memory_gib} GiB"
    )


@needs_estimate
@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS_B))
def test_parameter_count_matches_the_published_model(name: str) -> None:
    from config.cost.memory import count_parameters

    count = count_parameters(RECIPES[name].config())
    # Published totals leave out DeepSeek-V3's multi-token-prediction module.
    assert (count.total - count.mtp) / 1e9 == pytest.approx(PUBLISHED_PARAMS_B[name], rel=0.02)
    if name in PUBLISHED_ACTIVE_B:
        assert count.active_per_token / 1e9 == pytest.approx(PUBLISHED_ACTIVE_B[name], rel=0.03)
