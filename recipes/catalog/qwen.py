"""Qwen recipes: Qwen3-30B-A3B (MoE) on layouts NVIDIA published, the dense Qwen3 8B, and
fine-tuning Qwen2.5 7B.

MoE sources are rows of the Megatron-Bridge performance summary; their exact settings live in
Megatron-Bridge's scripts/performance/configs/qwen/qwen3_workload_base_configs.py. The base recipe
runs bf16_mixed on the published H100 layout; variants change what the run on other hardware or
precision changed. Those runs dispatched tokens with the "flex" dispatcher (HybridEP) and used
CUDA graphs; these recipes use the alltoall dispatcher and no graphs, the engine's defaults.

Qwen3 8B has no published performance run (neither the Megatron-Bridge nor the NeMo performance
summary lists it); its recipes take the layouts of Megatron-Bridge's own Qwen3 recipes
(src/megatron/bridge/recipes/qwen/qwen3.py `qwen3_8b_pretrain_config` and
`qwen3_8b_finetune_config`, full SFT), with sequence parallel on whenever TP > 1 as NeMo does.

Qwen2.5 7B's fine-tuning recipes take Megatron-Bridge's (src/megatron/bridge/recipes/qwen/qwen2.py
`qwen25_7b_finetune_config`): full SFT at TP 2, LoRA at TP 1, one 8-GPU node each.
"""

from __future__ import annotations

from config.schema import ModelConfig, ParallelConfig, TrainingConfig
from models.presets.qwen import qwen3_8b, qwen3_30b_a3b, qwen25_7b
from recipes.base import finetune, lora, pretrain
from recipes.recipe import recipe

FP8_CS = "bf16_with_fp8_current_scaling_mixed"
MB = "Megatron-Bridge performance summary"
MB_RECIPE = "no published perf run; Megatron-Bridge recipes/qwen/qwen3.py"
# A local Hugging Face folder of Qwen/Qwen3-8B (config.json, model-*.safetensors and their index,
# tokenizer.json): `hf download Qwen/Qwen3-8B --local-dir /models/Qwen3-8B`. Placeholder: override
# checkpoint.pretrained_dir and data.tokenizer with where yours is.
QWEN3_8B_HF = "/models/Qwen3-8B"
# The same for Qwen/Qwen2.5-7B (or -Instruct: the same shapes and numbers).
QWEN25_7B_HF = "/models/Qwen2.5-7B"
MB_QWEN25 = "Megatron-Bridge recipes/qwen/qwen2.py qwen25_7b_finetune_config"


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


# Megatron-Bridge's qwen3_8b_pretrain_config: TP4 PP1 on one 8-GPU node (DP 2), seq 4096, GBS 32,
# MBS 2, lr 3e-4 with 500 warmup steps, cosine to 3e-5 over 300K steps.
@recipe(
    nodes=1,
    source=f"{MB_RECIPE} qwen3_8b_pretrain_config defaults: TP4 PP1, seq 4096, GBS 32, MBS 2",
)
def qwen3_8b_pretrain() -> TrainingConfig:
    """Qwen3 8B pretraining on one 8-GPU node (Megatron-Bridge's recipe layout)."""
    return pretrain(
        qwen3_8b(seq_length=4096),
        ParallelConfig(tensor_model_parallel_size=4),
        global_batch_size=32,
        micro_batch_size=2,
        lr=3e-4,
        min_lr=3e-5,
        warmup_steps=500,
        max_steps=300_000,
    )


# Megatron-Bridge's qwen3_8b_finetune_config with peft=None (full SFT, as NeMo 2's): TP4 PP1,
# seq 2048, GBS 128, MBS 1, lr 5e-6 with 50 warmup steps, 1000 steps. The paths are placeholders.
@recipe(
    nodes=1,
    source=f"{MB_RECIPE} qwen3_8b_finetune_config, full SFT: TP4, seq 2048, GBS 128, MBS 1, lr 5e-6",
)
def qwen3_8b_sft() -> TrainingConfig:
    """Qwen3 8B full SFT on one 8-GPU node, from the Hugging Face folder of Qwen/Qwen3-8B.

    checkpoint.pretrained_dir takes the downloaded Hugging Face folder as it is (config.json and
    safetensors, no conversion step): every rank reads its own slices of the weights. `recipes
    check` compares the folder's config.json with the model section first. To fine-tune another
    Qwen3 size, take its whole architecture with the override model=<its folder>.
    """
    return finetune(
        qwen3_8b(seq_length=2048),
        ParallelConfig(tensor_model_parallel_size=4),
        data_path="/data/sft/train.jsonl",  # placeholder: {"prompt", "response"} lines
        tokenizer=QWEN3_8B_HF,  # placeholder: the folder's tokenizer.json
        pretrained_dir=QWEN3_8B_HF,  # placeholder: a Hugging Face folder or a Megatron checkpoint
        global_batch_size=128,
    )


# Megatron-Bridge's qwen3_8b_finetune_config with its default peft="lora": TP1 PP1, lr 1e-4, its
# LoRA defaults (dim 32, alpha 32, linear_qkv/proj/fc1/fc2); packed sequences of 4096 in GBS 8,
# MBS 1, as its Llama 3 8B LoRA recipe packs. One H100 holds it.
@recipe(
    nodes=1,
    gpus_per_node=1,
    source=f"{MB_RECIPE} qwen3_8b_finetune_config(peft='lora'): TP1, dim 32, alpha 32, lr 1e-4",
)
def qwen3_8b_lora() -> TrainingConfig:
    """Qwen3 8B LoRA on chat conversations on one H100, with Qwen3's own chat template."""
    cfg = finetune(
        qwen3_8b(seq_length=4096),
        ParallelConfig(),
        data_path="/data/chat/train.jsonl",  # placeholder: {"messages": [...]} lines
        tokenizer=QWEN3_8B_HF,  # placeholder: the folder (its tokenizer and chat template)
        pretrained_dir=QWEN3_8B_HF,  # placeholder: the Hugging Face folder
        global_batch_size=8,
        kind="chat",
    )
    return lora(cfg, rank=32, alpha=32)


def _qwen25_7b_finetune(parallel: ParallelConfig, *, seq_length: int, kind: str) -> TrainingConfig:
    """Qwen2.5 7B from its Hugging Face folder: Megatron-Bridge's fine-tuning defaults (GBS 128,
    MBS 1, 1000 steps here for its 100). The paths are placeholders: override
    checkpoint.pretrained_dir, data.path and data.tokenizer."""
    return finetune(
        qwen25_7b(seq_length=seq_length),
        parallel,
        data_path=f"/data/{kind}/train.jsonl",  # placeholder: prompt/response or messages lines
        tokenizer=QWEN25_7B_HF,  # placeholder: the folder (its tokenizer and chat template)
        pretrained_dir=QWEN25_7B_HF,  # placeholder: a Hugging Face folder or a Megatron checkpoint
        global_batch_size=128,
        kind=kind,
    )


@recipe(nodes=1, source=f"{MB_QWEN25}(peft=None): full SFT TP2 PP1, seq 4096, GBS 128, lr 5e-6")
def qwen25_7b_sft() -> TrainingConfig:
    """Qwen2.5 7B full SFT on one 8-GPU node (TP 2 x DP 4), from the Hugging Face folder.

    28 heads in 4 KV groups: TP divides 4 (1, 2 or 4). TP 2 with sequence parallel splits the
    7.6B weights so that the distributed optimizer's state fits 80 GB with 4096-token rows.
    """
    return _qwen25_7b_finetune(
        ParallelConfig(tensor_model_parallel_size=2), seq_length=4096, kind="sft"
    )


@recipe(nodes=1, source=f"{MB_QWEN25}(peft='lora'): TP1, dim 32, alpha 32, lr 1e-4, packed 2048")
def qwen25_7b_lora() -> TrainingConfig:
    """Qwen2.5 7B LoRA on chat conversations on one 8-GPU node (DP 8), with Qwen2.5's own chat
    template; rows packed to 2048 tokens as Megatron-Bridge packs them."""
    cfg = _qwen25_7b_finetune(ParallelConfig(), seq_length=2048, kind="chat")
    return lora(cfg, rank=32, alpha=32)
