"""Megatron-FSDP on the login node: the checker's rules for parallel.use_megatron_fsdp (each names
its field and the fix), the resume rule that keeps a run's checkpoint format, and the memory
estimate's sharding (Megatron-FSDP's own training and checkpoints: tests/smoke/test_fsdp_cpu.py
and test_checkpoint.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.cost.memory import estimate_memory
from config.hardware import Cluster
from config.rules import derive, validate
from config.tree import ConfigError, to_dict
from launchers.env import recipe_env
from launchers.resume import check_resume
from recipes.registry import resolve
from training.checkpoint import dirs

FSDP = "parallel.use_megatron_fsdp=true"


def problems(recipe: str, overrides: list[str], nodes: int = 1, gpus: int = 8) -> dict[str, str]:
    _, cfg = resolve(recipe, overrides)
    cluster = Cluster(num_nodes=nodes, gpus_per_node=gpus, gpu="h100")
    return {p.field: p.message for p in validate(cfg, cluster)}


def test_a_dense_gpt_is_valid_and_moe_is_refused() -> None:
    assert problems("llama3_8b_pretrain", [FSDP]) == {}
    assert "parallel.use_megatron_fsdp" in problems("tiny_moe_pretrain", [FSDP], gpus=2)


@pytest.mark.parametrize(
    ("overrides", "field", "fix"),
    [
        (
            ["optimizer.use_distributed_optimizer=false"],
            "optimizer.use_distributed_optimizer",
            "=true",
        ),
        (
            ["parallel.pipeline_model_parallel_size=2"],
            "parallel.pipeline_model_parallel_size",
            "PP 1",
        ),
        (["peft.scheme=lora"], "parallel.use_megatron_fsdp", "use_megatron_fsdp=false"),
        (
            ["checkpoint.pretrained_dir=/tmp/x"],
            "checkpoint.pretrained_dir",
            "use_megatron_fsdp=false",
        ),
        (["precision=fp32"], "precision", "bf16_mixed"),
    ],
)
def test_what_fsdp_cannot_run_names_the_field_and_the_fix(
    overrides: list[str], field: str, fix: str
) -> None:
    found = problems("llama3_8b_pretrain", [FSDP, *overrides])
    assert field in found and fix in found[field], found


def test_a_vision_model_is_refused() -> None:
    assert "parallel.use_megatron_fsdp" in problems("llava_llama3_8b_pretrain", [FSDP])


def test_resume_cannot_switch_fsdp(tmp_path: Path) -> None:
    _, saved = resolve("tiny_gpt_pretrain", [FSDP])
    folder = tmp_path / "run" / "checkpoints" / dirs.iter_name(10)
    folder.mkdir(parents=True)
    state = {"step": 10, "config": to_dict(saved), "dist_optimizer_sharding": "fsdp_dtensor"}
    (folder / dirs.STATE_FILE).write_text(json.dumps(state))
    _, cfg = resolve("tiny_gpt_pretrain", [])
    with pytest.raises(ConfigError) as err:
        check_resume(cfg, tmp_path / "run")
    found = dict(err.value.problems)
    assert "fsdp_dtensor" in found["parallel.use_megatron_fsdp"]
    assert "pretrained_dir" not in found["parallel.use_megatron_fsdp"]


def test_fsdp_shards_weights_and_gradients_over_data_parallel() -> None:
    """Llama 3 8B on 8 H100s, TP 1: the distributed optimizer shards only the optimizer state;
    Megatron-FSDP also the BF16 weights and FP32 gradients, 8 ways."""
    _, ddp = resolve("llama3_8b_pretrain", ["parallel.context_parallel_size=1"])
    _, fsdp = resolve("llama3_8b_pretrain", ["parallel.context_parallel_size=1", FSDP])
    cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu="h100")
    a = estimate_memory(ddp, cluster, derive(ddp, cluster))
    b = estimate_memory(fsdp, cluster, derive(fsdp, cluster))
    assert a.params_per_gpu == b.params_per_gpu
    assert b.optimizer_gib == pytest.approx(a.optimizer_gib)
    # What stays unsharded: one layer's gathered weights and its gradients before the reduction.
    assert b.weights_gib < a.weights_gib / 3
    assert b.gradients_gib < a.gradients_gib / 3


def test_fsdp_keeps_several_hardware_queues() -> None:
    """Megatron-LM refuses CUDA_DEVICE_MAX_CONNECTIONS=1 with Megatron-FSDP (its side streams)."""
    tp2 = ["parallel.tensor_model_parallel_size=2"]
    _, ddp = resolve("llama3_8b_pretrain", tp2)
    _, fsdp = resolve("llama3_8b_pretrain", [*tp2, FSDP])
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in {v.name for v in recipe_env(ddp)}
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in {v.name for v in recipe_env(fsdp)}
