"""Mixtral 8x7B pretraining recipes, each on the layout of a run NVIDIA published for it.

Sources are NeMo's performance summary (25.04 and 25.07 containers) and the per-GPU layouts it was
run from, NeMo's scripts/performance/recommended_model_configs/model_configs_{h100,b200,gb200}.csv.
The base recipe runs bf16_mixed on the published H100 layout; variants change what the published
run on other hardware or precision changed. CUDA graphs used on Blackwell are left out.
"""

from __future__ import annotations

from config.schema import ModelConfig, ParallelConfig, TrainingConfig
from models.presets.mixtral import mixtral_8x7b
from recipes.base import pretrain
from recipes.registry import recipe

FP8_CS = "bf16_with_fp8_current_scaling_mixed"
NEMO = "NeMo performance summary (recommended_model_configs"


def _pretrain(
    model: ModelConfig,
    parallel: ParallelConfig,
    *,
    global_batch_size: int,
    micro_batch_size: int = 1,
) -> TrainingConfig:
    """Every Mixtral recipe: recipes.base.pretrain's AdamW at 3e-4 over NeMo's horizon."""
    return pretrain(
        model,
        parallel,
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        min_lr=3e-5,
    )


@recipe(nodes=8, source=f"{NEMO}_h100.csv): DGX-H100, TP1 PP4 VP8 EP8, GBS 256, seq 4096")
def mixtral_8x7b_pretrain() -> TrainingConfig:
    """Mixtral 8x7B pretraining on 64 H100s (published layout)."""
    # The 8 experts of a layer go to 8 GPUs (EP8); PP4 x VP8 puts one layer in each of 32 chunks.
    # DP 16 -> 256 / 16 = 16 microbatches, a multiple of PP as the interleaved schedule needs.
    parallel = ParallelConfig(
        pipeline_model_parallel_size=4,
        virtual_pipeline_model_parallel_size=8,
        expert_model_parallel_size=8,
    )
    return _pretrain(mixtral_8x7b(seq_length=4096), parallel, global_batch_size=256)


@recipe(nodes=8, source=f"{NEMO}_h100.csv), FP8 current scaling table: TP1 PP4 VP8 EP8, GBS 256")
def mixtral_8x7b_pretrain_64gpu_h100_fp8cs() -> TrainingConfig:
    """Mixtral 8x7B on 64 H100s with FP8 current scaling (the run the NeMo table reports)."""
    cfg = mixtral_8x7b_pretrain()
    cfg.precision = FP8_CS
    return cfg


@recipe(nodes=8, gpu="b200", source=f"{NEMO}_b200.csv): DGX-B200, TP1 PP1 EP8, MBS 2, GBS 256")
def mixtral_8x7b_pretrain_64gpu_b200_bf16() -> TrainingConfig:
    """Mixtral 8x7B on 64 B200s: 178 GiB holds a whole replica per GPU, no pipeline."""
    cfg = mixtral_8x7b_pretrain()
    cfg.parallel.pipeline_model_parallel_size, cfg.parallel.virtual_pipeline_model_parallel_size = (
        1,
        None,
    )
    cfg.train.micro_batch_size = 2
    return cfg


@recipe(
    nodes=16,
    gpus_per_node=4,
    gpu="gb200",
    source=f"{NEMO}_gb200.csv): DGX-GB200, TP1 PP1 EP8, MBS 2, GBS 256",
)
def mixtral_8x7b_pretrain_64gpu_gb200_bf16() -> TrainingConfig:
    """Mixtral 8x7B on 64 GB200s (16 trays of 4): the B200 layout."""
    return mixtral_8x7b_pretrain_64gpu_b200_bf16()
