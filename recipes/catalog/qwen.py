"""Qwen3 mixture-of-experts pretraining recipes, on layouts NVIDIA published.

Sources are rows of the Megatron-Bridge performance summary; their exact settings live in
Megatron-Bridge's scripts/performance/configs/qwen/qwen3_workload_base_configs.py. The base recipe
runs bf16_mixed on the published H100 layout; variants change what the run on other hardware or
precision changed. Those runs dispatched tokens with the "flex" dispatcher (HybridEP) and used
CUDA graphs; these recipes use the alltoall dispatcher and no graphs, the engine's defaults.
"""

from __future__ import annotations

from config.schema import ModelConfig, ParallelConfig, TrainingConfig
from models.qwen import qwen3_30b_a3b
from recipes.base import pretrain
from recipes.registry import recipe

FP8_CS = "bf16_with_fp8_current_scaling_mixed"
MB = "Megatron-Bridge performance summary"


def _pretrain(
    model: ModelConfig,
    parallel: ParallelConfig,
    *,
    global_batch_size: int,
    micro_batch_size: int = 1,
) -> TrainingConfig:
    """Every Qwen3 MoE recipe: AdamW at 3e-4; 300K steps, about 1.3T tokens at GBS 1024 x 4096."""
    return pretrain(
        model,
        parallel,
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        min_lr=3e-5,
        max_steps=300_000,
    )


@recipe(
    nodes=2,
    source=f"{MB} 26.04.01, DGX-H100 (QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_*_V1): TP1 PP1 EP16, GBS 1024, seq 4096",
)
def qwen3_30b_a3b_pretrain() -> TrainingConfig:
    """Qwen3-30B-A3B pretraining on 16 H100s (published layout)."""
    # Only 3B parameters are active per token: no TP or PP, just the 128 experts spread over all
    # 16 GPUs (8 each) with experts' tensors whole (ETP 1) and everything else data parallel.
    parallel = ParallelConfig(expert_model_parallel_size=16, expert_tensor_parallel_size=1)
    return _pretrain(qwen3_30b_a3b(seq_length=4096), parallel, global_batch_size=1024)


@recipe(
    nodes=2,
    source=f"{MB} 26.04.01, DGX-H100 FP8 (QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1): TP1 PP1 EP16, GBS 1024",
)
def qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs() -> TrainingConfig:
    """Qwen3-30B-A3B on 16 H100s with FP8 current scaling (published layout)."""
    cfg = qwen3_30b_a3b_pretrain()
    cfg.precision = FP8_CS
    return cfg


@recipe(
    nodes=1,
    gpu="b200",
    source=f"{MB}, DGX-B200 BF16 (QWEN3_30B_A3B_PRETRAIN_CONFIG_B200_BF16_V1): EP8, MBS 4, GBS 512",
)
def qwen3_30b_a3b_pretrain_8gpu_b200_bf16() -> TrainingConfig:
    """Qwen3-30B-A3B on one 8-B200 node: 16 experts per GPU and MBS 4."""
    cfg = qwen3_30b_a3b_pretrain()
    cfg.parallel.expert_model_parallel_size = 8
    cfg.train.global_batch_size, cfg.train.micro_batch_size = 512, 4
    return cfg


@recipe(
    nodes=2,
    gpus_per_node=4,
    gpu="gb200",
    source=f"{MB}, DGX-GB200 BF16 (QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_BF16_V1): EP8, MBS 4, GBS 512",
)
def qwen3_30b_a3b_pretrain_8gpu_gb200_bf16() -> TrainingConfig:
    """Qwen3-30B-A3B on 8 GB200s (2 trays of 4): the B200 layout."""
    return qwen3_30b_a3b_pretrain_8gpu_b200_bf16()
