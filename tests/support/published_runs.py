"""Published NVIDIA training runs on H100s, as catalog recipes with overrides: what the step-time
model (config/cost/steptime.py) is calibrated on and the planner (recipes/advice/plan.py) is held to.

The first six are NVIDIA's published layouts (Megatron-Bridge's performance summary). The others come from NVIDIA's DGX Cloud
benchmarking READMEs (github.com/NVIDIA/dgxc-benchmarking), which publish a step time and the total
tokens/s: tokens/s/GPU here is that total / GPUs; and from the archive of Megatron-Bridge's
performance summary (docs/performance-summary-archive.md in NVIDIA-NeMo/Megatron-Bridge).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str
    recipe: str
    gpus: int
    tokens_per_s_per_gpu: float
    # TP, PP, VPP (None: none), CP, EP and MBS of the published layout, as the planner names them.
    layout: tuple[int, int, int | None, int, int, int]
    overrides: list[str] = field(default_factory=list)
    in_published_layouts: bool = False  # one of the six published layouts


RUNS = [
    PublishedRun(
        "Llama 3.1 8B BF16, 8 GPUs",
        "DGX Cloud benchmarking (NeMo 24.09), llama3.1/README_8b.md",
        "llama3_8b_pretrain",
        8,
        10_150,
        (1, 1, None, 2, 1, 1),
        in_published_layouts=True,
    ),
    PublishedRun(
        "Llama 3 8B FP8-CS, 8 GPUs",
        "Megatron-Bridge performance summary 25.11 (Megatron-FSDP)",
        "llama3_8b_pretrain_8gpu_h100_fp8cs",
        8,
        14_451,
        (1, 1, None, 1, 1, 1),
        in_published_layouts=True,
    ),
    PublishedRun(
        "Llama 3 70B FP8, 64 GPUs",
        "Megatron-Bridge performance summary 26.04",
        "llama3_70b_pretrain_64gpu_h100_fp8cs",
        64,
        1_633,
        (4, 8, 5, 1, 1, 1),
        in_published_layouts=True,
    ),
    PublishedRun(
        "Llama 3.1 405B FP8, 1024 GPUs",
        "Megatron-Bridge performance summary 26.06",
        "llama31_405b_pretrain_1024gpu_h100_fp8cs",
        1024,
        326,
        (8, 8, 8, 2, 1, 1),
        in_published_layouts=True,
    ),
    PublishedRun(
        "Qwen3 30B-A3B FP8, 16 GPUs",
        "Megatron-Bridge performance summary 26.04.01",
        "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs",
        16,
        8_960,
        (1, 1, None, 1, 16, 1),
        # As published: HybridEP, no alltoall overlap (Megatron-Bridge's perf_recipes/qwen/h100).
        ["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep"],
        in_published_layouts=True,
    ),
    PublishedRun(
        "DeepSeek-V3 FP8 blockwise, 1024 GPUs",
        "Megatron-Bridge performance summary 25.09",
        "deepseek_v3_pretrain_1024gpu_h100_fp8sc",
        1024,
        1_297,
        (2, 8, 4, 1, 64, 1),
        # As published: DeepEP (Megatron-Bridge's scripts/performance/run_script.py enables it on
        # H100) and the EP alltoall overlapped with another microbatch (A2A_1F1B there).
        ["model.moe_token_dispatcher_type=flex", "parallel.overlap_moe_expert_parallel_comm=true"],
        in_published_layouts=True,
    ),
    PublishedRun(
        "Llama 3.1 70B BF16, 64 GPUs",
        "dgxc-benchmarking v25.04.02 llama3.1/README.md: 71,526 tokens/s on 64 GPUs",
        "llama3_70b_pretrain",
        64,
        71_526 / 64,
        (4, 4, 5, 2, 1, 1),
        ["train.global_batch_size=128"],
    ),
    PublishedRun(
        "Llama 3.1 405B BF16, 512 GPUs",
        "dgxc-benchmarking v25.04.02 llama3.1/README.md: 106,024 tokens/s on 512 GPUs",
        "llama31_405b_pretrain",
        512,
        106_024 / 512,
        (8, 8, 8, 2, 1, 1),
        ["train.global_batch_size=256"],
    ),
    PublishedRun(
        "Llama 3.1 70B FP8, 64 GPUs",
        "dgxc-benchmarking v25.04.02 llama3.1/README.md: 106,346 tokens/s on 64 GPUs",
        "llama3_70b_pretrain_64gpu_h100_fp8cs",
        64,
        106_346 / 64,
        (4, 8, 5, 1, 1, 1),
        ["train.global_batch_size=128"],
    ),
    PublishedRun(
        "Qwen3 30B-A3B FP8, 16 GPUs, 26.02.01",
        # Printed there as PP2 VP12 EP8, 26.02's layout; its recipe ran EP16 without a pipeline
        # (bench/published_corrections.py). Fitted on as PP2 VP12 EP8 until 2026-11-29.
        "Megatron-Bridge performance summary 26.02.01",
        "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs",
        16,
        9_058,
        (1, 1, None, 1, 16, 1),
        ["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep"],
    ),
    PublishedRun(
        "DeepSeek-V3 BF16, 1024 GPUs, PP16 EP64",
        "dgxc-benchmarking v25.05.05 deepseek_v3/pretraining/README.md: 644,782 tokens/s",
        "deepseek_v3_pretrain",
        1024,
        644_781.55 / 1024,
        (2, 16, None, 1, 64, 1),
        [
            "parallel.pipeline_model_parallel_size=16",
            "parallel.virtual_pipeline_model_parallel_size=None",
            # NeMo's deepseek_v3 pretrain recipe, which that benchmark ran
            "model.recompute_modules=mla_up_proj,layernorm",
        ],
    ),
]
