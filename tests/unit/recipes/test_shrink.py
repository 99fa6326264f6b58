"""`--shrink` on the CPU: what only a GPU runs is replaced and said; the rest, SP included, stays.

Torch-free and quick; tests/smoke/test_catalog_shrink.py trains every shrunk recipe, and
tests/smoke/test_sp_cpu.py holds sequence parallel on the CPU to TP without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from config.hardware import Cluster
from config.rules import validate
from config.schema import TrainingConfig
from config.tree import apply_overrides
from recipes.registry import all_recipes
from recipes.shrink import cpu_substitutes, fit_to_world, shrink
from tests.support import children

REPO = Path(__file__).resolve().parents[3]
CPU4 = Cluster(num_nodes=1, gpus_per_node=4, gpu="cpu")


def shrunk(name: str, overrides: Sequence[str] = ()) -> TrainingConfig:
    cfg = apply_overrides(all_recipes()[name].config(), [*overrides, "train.device=cpu"])
    return shrink(cfg)


def problems(cfg: TrainingConfig) -> list[str]:
    return [f"{p.field}: {p.message}" for p in validate(cfg, CPU4)]


def test_fp8_becomes_the_plain_preset_of_its_dtype() -> None:
    cfg = shrunk("llama3_8b_pretrain_8gpu_h100_fp8cs")
    assert any(p.startswith("precision:") for p in problems(cfg))  # refused as it is
    assert cpu_substitutes(cfg) == [
        "precision: bf16_with_fp8_current_scaling_mixed -> bf16_mixed "
        "(FP8 needs a GPU with Transformer Engine)"
    ]
    assert cfg.precision == "bf16_mixed"


@pytest.mark.parametrize(
    ("preset", "plain", "fmt"),
    [
        ("bf16_with_mxfp8_mixed", "bf16_mixed", "FP8"),
        ("fp16_with_nvfp4_mixed", "fp16_mixed", "FP4"),
    ],
)
def test_block_scaled_and_fp4_presets(preset: str, plain: str, fmt: str) -> None:
    cfg = shrunk("llama32_1b_pretrain", [f"precision={preset}"])
    assert cpu_substitutes(cfg) == [
        f"precision: {preset} -> {plain} ({fmt} needs a GPU with Transformer Engine)"
    ]
    assert cfg.precision == plain


def test_context_parallel_becomes_data_parallel_replicas() -> None:
    """CP=2 is dropped before the layout is fitted: the 4 processes become 4 DP replicas, and the
    global batch follows."""
    cfg = shrunk("llama3_8b_pretrain")
    assert cfg.parallel.context_parallel_size == 2
    changes = cpu_substitutes(cfg) + fit_to_world(cfg, 4)
    assert changes == [
        "parallel.context_parallel_size: 2 -> 1 (context parallel needs Transformer Engine's "
        "attention on a GPU)"
    ]
    assert cfg.train.global_batch_size == 4  # micro batch 1 x DP 4
    assert problems(cfg) == []


def test_sequence_parallel_and_tensor_parallel_stay() -> None:
    cfg = shrunk("llama3_70b_pretrain_64gpu_h200_bf16")
    changes = cpu_substitutes(cfg) + fit_to_world(cfg, 4)
    assert not any("sequence_parallel" in change for change in changes)
    par = cfg.parallel
    assert (par.tensor_model_parallel_size, par.sequence_parallel) == (2, True)
    assert cfg.model.num_layers == 2 * 2 * 5  # 2 layers per chunk: PP 2 x VPP 5
    assert problems(cfg) == []


def test_moe_dispatcher_says_why() -> None:
    cfg = shrunk("qwen3_30b_a3b_pretrain")
    (change,) = cpu_substitutes(cfg)
    assert change.startswith("model.moe_token_dispatcher_type: alltoall -> allgather (")
    assert cfg.model.moe_token_dispatcher_type == "allgather"


def test_moe_alltoall_overlap_goes_with_the_alltoall() -> None:
    """Megatron-Core runs the overlap with alltoall or flex only: the CPU's all-gathers take
    it off too, and the shrunken config passes the checker."""
    cfg = shrunk("qwen3_30b_a3b_pretrain")
    cfg.parallel.overlap_moe_expert_parallel_comm = True
    changes = cpu_substitutes(cfg)
    assert changes[1].startswith("parallel.overlap_moe_expert_parallel_comm: True -> False (")
    assert not cfg.parallel.overlap_moe_expert_parallel_comm
    fit_to_world(cfg, 4)
    assert problems(cfg) == []


def test_the_shared_expert_overlap_goes_with_the_alltoall() -> None:
    """DeepSeek-V3 has shared experts: with their overlap on, the CPU's all-gather dispatcher
    would be refused (model.moe_shared_expert_overlap needs alltoall or flex)."""
    cfg = shrunk("deepseek_v3_pretrain")
    cfg.model.moe_shared_expert_overlap = True
    changes = cpu_substitutes(cfg)
    assert any(c.startswith("model.moe_shared_expert_overlap: True -> False (") for c in changes)
    assert not cfg.model.moe_shared_expert_overlap
    fit_to_world(cfg, 4)
    assert problems(cfg) == []


def test_cpu_activation_offloading_goes_and_a_gpu_keeps_one_layer_of_it() -> None:
    """Transformer Engine's offload hooks: the CPU keeps its activations (the checker would refuse
    them), a shrunken GPU run offloads one of its two layers (fewer than the model's)."""
    offload = ["model.cpu_offloading_num_layers=24"]
    cfg = shrunk("llama32_1b_pretrain", offload)
    assert cfg.model.cpu_offloading_num_layers == 1
    (change,) = cpu_substitutes(cfg)
    assert change.startswith("model.cpu_offloading_num_layers: 1 -> 0 (")
    fit_to_world(cfg, 4)
    assert problems(cfg) == []
    gpu = shrink(apply_overrides(all_recipes()["llama32_1b_pretrain"].config(), offload))
    assert validate(gpu, Cluster(num_nodes=1, gpus_per_node=8, gpu="h100")) == []


def test_a_recipe_the_cpu_runs_as_is_is_left_alone() -> None:
    cfg = shrunk("llama32_1b_pretrain")
    assert cpu_substitutes(cfg) == []


def test_cpu_rule_without_shrink_names_the_replacement() -> None:
    """Asked for the CPU with their own layout, the user gets the fix for each GPU-only feature;
    SP alone is not one of them."""
    cfg = apply_overrides(
        all_recipes()["llama32_1b_pretrain"].config(),
        [
            "train.device=cpu",
            "precision=bf16_with_fp8_delayed_scaling_mixed",
            "parallel.context_parallel_size=2",
        ],
    )
    found = {p.field: p.message for p in validate(cfg, CPU4)}
    assert found["precision"].endswith("use bf16_mixed")
    assert found["parallel.context_parallel_size"].endswith("use 1")
    sp = apply_overrides(
        all_recipes()["tiny_gpt_pretrain"].config(), ["parallel.sequence_parallel=true"]
    )
    assert validate(sp, Cluster(num_nodes=1, gpus_per_node=2, gpu="cpu")) == []


def test_run_prints_each_substitute(tmp_path: Path) -> None:
    """`recipes run --shrink` on the CPU says what it replaced, before it launches (here: --dryrun)."""
    cmd = [sys.executable, "-m", "recipes", "run", "llama31_405b_pretrain_1024gpu_h100_fp8cs"]
    cmd += ["--shrink", "--executor", "local", "--device", "cpu", "--gpus-per-node", "4"]
    cmd += ["--dryrun", f"logging.run_dir={tmp_path / 'run'}"]
    env = os.environ | {"NEMORUN_HOME": str(tmp_path / "nemo_run")}
    proc = children.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("shrink: ")]
    assert lines[:2] == [
        "shrink: parallel.context_parallel_size: 2 -> 1 (context parallel needs Transformer "
        "Engine's attention on a GPU)",
        "shrink: precision: bf16_with_fp8_current_scaling_mixed -> bf16_mixed (FP8 needs a GPU "
        "with Transformer Engine)",
    ]
    assert "sequence_parallel" not in "\n".join(lines)


def test_llava_turns_sequence_parallel_off() -> None:
    """Megatron-Core's LLaVAModel asserts TE's attention under SP: the one SP the CPU cannot run."""
    cfg = shrunk("llava_llama3_8b_pretrain")
    assert any(p.startswith("parallel.sequence_parallel:") for p in problems(cfg))
    assert cpu_substitutes(cfg) == [
        "parallel.sequence_parallel: True -> False (Megatron-Core's LLaVA model runs sequence "
        "parallel only with Transformer Engine's attention)"
    ]
    assert cfg.parallel.tensor_model_parallel_size == 4


@pytest.mark.parametrize("name", ["deepseek_v3_pretrain", "qwen3_30b_a3b_pretrain"])
def test_the_experts_follow_the_fitted_expert_parallel_size(name: str) -> None:
    """`shrink` sizes the experts for the recipe's EP (DeepSeek-V3: 64, so 128 experts); once the
    layout is fitted to 4 processes there are two per expert-parallel rank again (DeepSeek-V3:
    at least one per routing group)."""
    cfg = shrunk(name)
    cpu_substitutes(cfg)
    fit_to_world(cfg, 4)
    ep = cfg.parallel.expert_model_parallel_size
    groups = cfg.model.moe_router_num_groups or 1
    assert cfg.model.num_moe_experts == max(4, 2 * ep, groups) < 128
    assert problems(cfg) == []
