"""GPT-OSS recipes: fine-tuning the 20B on one node, pretraining the 120B on NVIDIA's layout.

Fine-tuning follows Megatron-Bridge's recipes/gpt_oss/gpt_oss.py `gpt_oss_20b_finetune_config`
(full SFT: TP1 PP1 EP8, lr 5e-6; LoRA: TP1 PP1 EP1, lr 1e-4; seq 2048, GBS 128, MBS 1, unpacked
rows, which Megatron-Bridge requires for GPT-OSS). Packed rows run here too
(data.sequence_packing=true), but their attention is models/specs.py's torch attention with sinks,
not Transformer Engine's fused one: slower on GPUs. The 120B pretraining run is the H100 row of Megatron-Bridge's performance configs
(scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py). Every recipe keeps the
experts' tensors whole (ETP 1): Megatron-Core supports the experts' biases only so.

checkpoint.pretrained_dir takes the published Hugging Face folder as it is: its MXFP4 experts are
dequantized to BF16 as each rank reads its slices (models/hf/gpt_oss.py).
"""

from __future__ import annotations

from config.schema import ParallelConfig, TrainingConfig
from models.presets.gpt_oss import gpt_oss_20b, gpt_oss_120b
from recipes.base import finetune, lora, pretrain
from recipes.recipe import recipe

MB_RECIPE = "Megatron-Bridge recipes/gpt_oss/gpt_oss.py gpt_oss_20b_finetune_config"
MB_PERF = "Megatron-Bridge performance configs (gpt_oss_workload_base_configs.py)"
# A local Hugging Face folder of openai/gpt-oss-20b (config.json, the MXFP4 safetensors and their
# index, tokenizer.json): `hf download openai/gpt-oss-20b --local-dir /models/gpt-oss-20b`.
# Placeholder: override checkpoint.pretrained_dir and data.tokenizer with where yours is.
GPT_OSS_20B_HF = "/models/gpt-oss-20b"


def _sft(parallel: ParallelConfig) -> TrainingConfig:
    """Full SFT of gpt-oss-20b on {"prompt", "response"} lines, rows unpacked."""
    parallel.expert_tensor_parallel_size = 1  # expert biases: ETP 1 (Megatron-Core's rule)
    cfg = finetune(
        gpt_oss_20b(seq_length=2048),
        parallel,
        data_path="/data/sft/train.jsonl",  # placeholder: {"prompt", "response"} lines
        tokenizer=GPT_OSS_20B_HF,  # placeholder: the folder's tokenizer.json
        pretrained_dir=GPT_OSS_20B_HF,  # placeholder: a Hugging Face folder or a checkpoint
        global_batch_size=128,
    )
    cfg.data.sequence_packing = False  # as Megatron-Bridge: see the module docstring
    return cfg


@recipe(nodes=1, source=f"{MB_RECIPE}(peft=None): TP1 PP1 EP8, seq 2048, GBS 128, MBS 1, lr 5e-6")
def gpt_oss_20b_sft() -> TrainingConfig:
    """gpt-oss-20b full SFT on one 8-GPU node, from the published Hugging Face folder."""
    # EP8: each GPU holds 4 of a layer's 32 experts; attention and embeddings are replicated
    # over the 8 data-parallel ranks, their optimizer state sharded (distributed optimizer).
    return _sft(ParallelConfig(expert_model_parallel_size=8))


@recipe(
    nodes=2,
    gpus_per_node=4,
    gpu="gh200",
    source=f"{MB_RECIPE}(peft=None) on two 4-GPU GH200 nodes: TP2 with SP and EP4 in place of EP8",
)
def gpt_oss_20b_sft_8gpu_gh200_bf16() -> TrainingConfig:
    """gpt-oss-20b full SFT on two 4-GPU GH200 nodes (an HPC centre's nodes)."""
    # One node does not hold it: 8 experts per GPU (EP4) with no expert data-parallel peer keep
    # ~58 GiB of FP32 Adam state and, at the optimizer step, ~19 GiB of FP32 gradient copies
    # (predicted 102 of 94.9 GiB). Two nodes shard the experts' state over expert DP 2; TP2 with
    # SP halves the attention's weights and activations: predicted 63 GiB.
    return _sft(ParallelConfig(tensor_model_parallel_size=2, expert_model_parallel_size=4))


@recipe(
    nodes=1,
    source=f"{MB_RECIPE}(peft='lora'): TP1 PP1 EP1, lr 1e-4, seq 2048, GBS 128, MBS 1",
)
def gpt_oss_20b_lora() -> TrainingConfig:
    """gpt-oss-20b LoRA on the attention of one 8-GPU node (each GPU a whole BF16 replica)."""
    cfg = _sft(ParallelConfig())
    cfg = lora(cfg, rank=32, alpha=32)
    # The experts are not adapted (training/lora.py): every MLP here is a routed expert.
    cfg.peft.target_modules = "linear_qkv,linear_proj"
    cfg.data.sequence_packing = False  # lora() packs; unpacked as Megatron-Bridge
    return cfg


@recipe(
    nodes=8,
    source=f"{MB_PERF}, DGX-H100 BF16 (GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V1): TP1 PP4 EP8 "
    "ETP1, GBS 512, MBS 1, recompute layernorm + moe_act",
)
def gpt_oss_120b_pretrain() -> TrainingConfig:
    """gpt-oss-120b pretraining on 64 H100s (published layout)."""
    # 36 layers over PP4 (9 a stage); a layer's 128 experts over EP8 (16 a GPU), whole (ETP1);
    # DP 16. Recomputing the norms and the experts' activation keeps the stage within 80 GB.
    parallel = ParallelConfig(
        pipeline_model_parallel_size=4, expert_model_parallel_size=8, expert_tensor_parallel_size=1
    )
    cfg = pretrain(gpt_oss_120b(seq_length=4096), parallel, global_batch_size=512)
    cfg.model.recompute_granularity = "selective"
    cfg.model.recompute_modules = "layernorm,moe_act"
    return cfg


@recipe(
    nodes=1,
    gpus_per_node=4,
    gpu="gh200",
    source=f"{MB_RECIPE}(peft='lora') on a 4-GPU GH200 node: TP1 PP1 EP1, lr 1e-4",
)
def gpt_oss_20b_lora_4gpu_gh200_bf16() -> TrainingConfig:
    """gpt-oss-20b LoRA on one 4-GPU GH200 node: the 8-GPU recipe with DP 4."""
    return gpt_oss_20b_lora()
