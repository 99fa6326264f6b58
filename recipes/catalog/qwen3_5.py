"""Qwen3.5 / 3.6 recipes: the dense 27B and the 35B-A3B mixture of experts (Gated DeltaNet in
three of four layers).

No NVIDIA performance summary lists Qwen3.5 runs. The pretraining layouts are Megatron-Bridge's
own H100 recipes (src/megatron/bridge/recipes/qwen/h100/qwen35.py: 27B TP4 PP2 on one 8-GPU
node; 35B-A3B on 16 GPUs, TP1 PP2 EP8, as its later recipes for the model, BF16); fine-tuning
starts from those layouts (LoRA on one node), from a downloaded Hugging Face
folder of the published Qwen3_5(Moe)ForConditionalGeneration (its language model; the vision
tower and the MTP layer stay in the folder, kept aside by an import). Every DeltaNet and attention
head count of both sizes (16 key, 48 / 32 value, 24 / 16 query, 4 / 2 KV groups) divides TP 4.

Packed rows are off: Gated DeltaNet's recurrence runs over a whole row and would carry one
packed sample into the next (config/rules/linear_attention.py refuses them).
"""

from __future__ import annotations

from config.schema import ParallelConfig, TrainingConfig
from models.presets.qwen3_5 import qwen3_5_27b, qwen3_5_35b_a3b
from recipes.base import finetune, lora, pretrain
from recipes.recipe import recipe

MB = "no published perf run; Megatron-Bridge recipes/qwen/h100/qwen35.py"
# Local Hugging Face folders of Qwen/Qwen3.5-27B and Qwen/Qwen3.5-35B-A3B (config.json,
# model-*.safetensors and their index, tokenizer.json): `hf download Qwen/Qwen3.5-27B --local-dir
# /models/Qwen3.5-27B`. Placeholders: override checkpoint.pretrained_dir and data.tokenizer.
QWEN3_5_27B_HF = "/models/Qwen3.5-27B"
QWEN3_5_35B_A3B_HF = "/models/Qwen3.5-35B-A3B"


def _dense_layout() -> ParallelConfig:
    """27B on one 8-GPU node: TP4 (with sequence parallel) x PP2, 32 layers a stage."""
    return ParallelConfig(
        tensor_model_parallel_size=4, pipeline_model_parallel_size=2, sequence_parallel=True
    )


def _moe_layout_16() -> ParallelConfig:
    """35B-A3B pretraining and full SFT on 16 GPUs, Megatron-Bridge's later H100 layout for the
    model (qwen35_vl_35b_a3b_*_16gpu_h100_bf16, its commit a7f4ad56b): TP1 PP2 EP8 ETP1, expert
    DP 2. One 8-GPU node does not hold full Adam state: 4 bytes a parameter of FP32 gradient
    copies at the optimizer step on top of the 16 that TP4 PP2 VP10 EP4 kept (predicted 84 of
    72.9 GiB). Predicted 55 GiB."""
    return ParallelConfig(
        pipeline_model_parallel_size=2, expert_model_parallel_size=8, expert_tensor_parallel_size=1
    )


def _moe_layout() -> ParallelConfig:
    """35B-A3B LoRA on one 8-GPU node (its frozen base holds BF16 weights only). Megatron-Bridge's
    first recipe ran EP8 alone; the experts go over EP4 inside each of two pipeline stages (ten
    virtual stages of two layers) and the rest over TP4 with sequence parallel."""
    return ParallelConfig(
        tensor_model_parallel_size=4,
        sequence_parallel=True,
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=10,
        expert_model_parallel_size=4,
        expert_tensor_parallel_size=1,
    )


@recipe(nodes=1, source=f"{MB} qwen35_27b_pretrain_8gpu_h100_bf16_config: TP4 PP2, BF16")
def qwen3_5_27b_pretrain() -> TrainingConfig:
    """Qwen3.5 27B pretraining on one 8-GPU H100 node (Megatron-Bridge's recipe layout)."""
    return pretrain(qwen3_5_27b(seq_length=4096), _dense_layout(), global_batch_size=32)


@recipe(
    nodes=2,
    source=f"{MB} qwen35_35b_a3b_pretrain_8gpu_h100_bf16_config (EP8), refitted to 16 GPUs as "
    "its later 16-GPU H100 recipes: TP1 PP2 EP8 ETP1",
)
def qwen3_5_35b_a3b_pretrain() -> TrainingConfig:
    """Qwen3.5 35B-A3B pretraining on two 8-GPU H100 nodes."""
    return pretrain(qwen3_5_35b_a3b(seq_length=4096), _moe_layout_16(), global_batch_size=64)


@recipe(nodes=1, source=f"{MB}: its 27B layout TP4 PP2 for full SFT, seq 4096, lr 5e-6")
def qwen3_5_27b_sft() -> TrainingConfig:
    """Qwen3.5 27B full SFT on one 8-GPU node, from the published Hugging Face folder."""
    return finetune(
        qwen3_5_27b(seq_length=4096),
        _dense_layout(),
        data_path="/data/sft/train.jsonl",  # placeholder: {"prompt", "response"} lines
        tokenizer=QWEN3_5_27B_HF,
        pretrained_dir=QWEN3_5_27B_HF,
        global_batch_size=64,
    )


@recipe(
    nodes=2, source=f"{MB}: the 35B-A3B pretraining layout (TP1 PP2 EP8 ETP1) for full SFT, lr 5e-6"
)
def qwen3_5_35b_a3b_sft() -> TrainingConfig:
    """Qwen3.5 35B-A3B full SFT on two 8-GPU nodes, from the published Hugging Face folder."""
    return _moe_sft(_moe_layout_16())


def _moe_sft(parallel: ParallelConfig) -> TrainingConfig:
    return finetune(
        qwen3_5_35b_a3b(seq_length=4096),
        parallel,
        data_path="/data/sft/train.jsonl",  # placeholder: {"prompt", "response"} lines
        tokenizer=QWEN3_5_35B_A3B_HF,
        pretrained_dir=QWEN3_5_35B_A3B_HF,
        global_batch_size=64,
    )


def _lora(cfg: TrainingConfig) -> TrainingConfig:
    """LoRA (rank 32, alpha 32: Megatron-Bridge's defaults) on the attention layers' QKV and
    output projections and the MLPs; chat data, rows unpacked (Gated DeltaNet)."""
    cfg.data.kind = "chat"
    cfg.data.path = "/data/chat/train.jsonl"  # placeholder: {"messages": [...]} lines
    cfg = lora(cfg, rank=32, alpha=32)
    cfg.data.sequence_packing = False
    return cfg


@recipe(nodes=1, source=f"{MB}: its 27B layout TP4 PP2 with LoRA rank 32, alpha 32, lr 1e-4")
def qwen3_5_27b_lora() -> TrainingConfig:
    """Qwen3.5 27B LoRA on chat conversations on one 8-GPU node."""
    cfg = _lora(qwen3_5_27b_sft())
    cfg.train.global_batch_size = 32
    return cfg


@recipe(nodes=1, source=f"{MB}: the 35B-A3B layout (TP4 PP2 VP10 EP4) with LoRA rank 32, alpha 32")
def qwen3_5_35b_a3b_lora() -> TrainingConfig:
    """Qwen3.5 35B-A3B LoRA on chat conversations on one 8-GPU node."""
    cfg = _lora(_moe_sft(_moe_layout()))
    cfg.train.global_batch_size = 32
    return cfg


@recipe(
    nodes=1,
    gpus_per_node=4,
    gpu="gh200",
    source=f"{MB}: LoRA on a 4-GPU GH200 node (EP4, TP1), not a published run",
)
def qwen3_5_35b_a3b_lora_4gpu_gh200_bf16() -> TrainingConfig:
    """Qwen3.5 35B-A3B LoRA on one 4-GPU GH200 node (JUPITER, Alps): 64 experts a GPU.

    Full SFT does not fit four GPUs (about 18 bytes a parameter with Adam, 157 GiB a GPU);
    the frozen base holds its BF16 weights only."""
    cfg = qwen3_5_35b_a3b_lora()
    cfg.parallel = ParallelConfig(expert_model_parallel_size=4, expert_tensor_parallel_size=1)
    return cfg


@recipe(
    nodes=1,
    gpus_per_node=4,
    gpu="gh200",
    source=f"{MB}: LoRA on a 4-GPU GH200 node (TP4 with sequence parallel), not a published run",
)
def qwen3_5_27b_lora_4gpu_gh200_bf16() -> TrainingConfig:
    """Qwen3.5 27B LoRA on one 4-GPU GH200 node (JUPITER, Alps): TP4 inside the NVLink mesh."""
    cfg = qwen3_5_27b_lora()
    cfg.parallel = ParallelConfig(tensor_model_parallel_size=4, sequence_parallel=True)
    return cfg
