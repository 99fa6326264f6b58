"""DeepSeek-V3 pretraining recipes (MLA, MoE, multi-token prediction) on layouts NVIDIA published.

Sources are rows of the Megatron-Bridge performance summary; their exact settings live in
Megatron-Bridge's scripts/performance/configs/deepseek/deepseek_workload_base_configs.py (V1
presets). The base recipe runs bf16_mixed on the published H100 layout; variants change what the
run on other hardware or precision changed. Each recomputes the modules its run recomputed
(model.recompute_modules). Those runs dispatched tokens with the "flex" dispatcher (DeepEP on
the 25.09 H100 run, HybridEP later) and the H100 one overlapped the alltoall with another
microbatch; these recipes use the alltoall dispatcher without the overlap, which need neither
package nor a GPU test this engine has not had yet. `model.moe_token_dispatcher_type=flex
parallel.overlap_moe_expert_parallel_comm=true` runs them as published (README: hiding the MoE
exchange).

61 decoder layers + 1 MTP layer + embedding + loss make 64 units: finalize spreads them evenly over
the pipeline chunks (2 per chunk at PP8 x VP4, the published "Et|(tt|)*30mL"), so no recipe needs
an explicit pipeline_model_parallel_layout.
"""

from __future__ import annotations

from config.schema import ParallelConfig, TrainingConfig
from models.presets.deepseek import deepseek_v3
from recipes.base import pretrain
from recipes.registry import recipe

FP8_BLOCKWISE = "bf16_with_fp8_subchannel_scaling_mixed"
MB = "Megatron-Bridge performance summary"


def _pretrain(parallel: ParallelConfig, *, global_batch_size: int) -> TrainingConfig:
    """Every DeepSeek-V3 recipe: the report's schedule (section 4.2: AdamW (0.9, 0.95), weight
    decay 0.1, peak lr 2.2e-4 after 2K warmup steps, decayed to 2.2e-5; 14.8T tokens are 441K steps
    of GBS 8192 x 4096)."""
    model = deepseek_v3(seq_length=4096)  # the report pretrains at 4K
    # ... with plain RoPE: YaRN (the published checkpoint's, in the preset) came with the context
    # extension after pretraining.
    model.rope_scaling = None
    # The published runs keep experts' tensors whole (ETP 1) whatever the attention's TP is.
    parallel.expert_tensor_parallel_size = 1
    return pretrain(
        model, parallel, global_batch_size=global_batch_size, lr=2.2e-4, max_steps=441_000
    )


def _mla_up_proj(cfg: TrainingConfig) -> TrainingConfig:
    """As the Blackwell runs: recompute MLA's up projections (the queries, keys and values)."""
    cfg.model.recompute_granularity = "selective"
    cfg.model.recompute_modules = "mla_up_proj"
    return cfg


@recipe(
    nodes=128,
    source=f"{MB} 25.09, DGX-H100 (DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1): TP2 PP8 VP4 EP64, GBS 8192, seq 4096",
)
def deepseek_v3_pretrain() -> TrainingConfig:
    """DeepSeek-V3 pretraining on 1024 H100s (published layout, BF16)."""
    # EP64 gives every GPU 4 of a layer's 256 experts; PP8 x VP4 = 32 chunks of 2 units each.
    parallel = ParallelConfig(
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=8,
        virtual_pipeline_model_parallel_size=4,
        expert_model_parallel_size=64,
    )
    cfg = _pretrain(parallel, global_batch_size=8192)
    # As published: recompute MLA's up projections and the (3 dense layers') MLPs; predicted
    # 62 GiB, against 81 GiB with no recompute.
    cfg.model.recompute_granularity = "selective"
    cfg.model.recompute_modules = "mla_up_proj,mlp"
    return cfg


@recipe(
    nodes=128,
    source=f"{MB} 25.09, DGX-H100 FP8 blockwise (DEEPSEEK_V3_PRETRAIN_CONFIG_H100_FP8_SC_V1): TP2 PP8 VP4 EP64, GBS 8192",
)
def deepseek_v3_pretrain_1024gpu_h100_fp8sc() -> TrainingConfig:
    """DeepSeek-V3 on 1024 H100s with FP8 blockwise (subchannel) scaling, as DeepSeek trained it."""
    cfg = deepseek_v3_pretrain()
    cfg.precision = FP8_BLOCKWISE
    return cfg


@recipe(
    nodes=64,
    gpus_per_node=4,
    gpu="gb200",
    source=f"{MB}, DGX-GB200 BF16 (DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_BF16_V1): TP1 PP4 VP4 EP64, GBS 2048",
)
def deepseek_v3_pretrain_256gpu_gb200_bf16() -> TrainingConfig:
    """DeepSeek-V3 on 256 GB200s (64 trays of 4): no TP, 16 chunks of 4 units."""
    parallel = ParallelConfig(
        pipeline_model_parallel_size=4,
        virtual_pipeline_model_parallel_size=4,
        expert_model_parallel_size=64,
    )
    return _mla_up_proj(_pretrain(parallel, global_batch_size=2048))


@recipe(
    nodes=32,
    gpu="b200",
    source=f"{MB}, DGX-B200 BF16 (DEEPSEEK_V3_PRETRAIN_CONFIG_B200_V1): TP1 PP16 EP8, GBS 2048",
)
def deepseek_v3_pretrain_256gpu_b200_bf16() -> TrainingConfig:
    """DeepSeek-V3 on 256 B200s: a deep pipeline (16 stages of 4 units), experts within a node."""
    parallel = ParallelConfig(pipeline_model_parallel_size=16, expert_model_parallel_size=8)
    return _mla_up_proj(_pretrain(parallel, global_batch_size=2048))
