"""Llama 3.x pretraining recipes, each on the layout of a run NVIDIA published for its size.

A base recipe (`llama3_70b_pretrain`) runs bf16_mixed on the published H100 layout; a variant
(`llama3_70b_pretrain_64gpu_h100_fp8cs`) calls it and changes what the published run on that
hardware and precision changed. "MB" sources are rows of the Megatron-Bridge performance summary,
whose exact settings live in Megatron-Bridge's scripts/performance/configs/llama/ workload presets
(V1/V2 there differ only in global batch). Published runs that used Megatron-FSDP or CUDA graphs
are reproduced with the distributed optimizer and without graphs, the engine's defaults.
"""

from __future__ import annotations

from config.schema import ModelConfig, ParallelConfig, TrainingConfig
from models.presets.llama import llama3_8b, llama3_70b, llama31_405b, llama32_1b, llama32_3b
from recipes.base import finetune, lora, pretrain
from recipes.recipe import recipe

FP8_CS = "bf16_with_fp8_current_scaling_mixed"
MXFP8 = "bf16_with_mxfp8_mixed"
MB = "Megatron-Bridge performance summary"
LLAMA3_8B_INSTRUCT = "/models/Meta-Llama-3-8B-Instruct"  # a placeholder for your local folder


def _pretrain(
    model: ModelConfig, *, global_batch_size: int, micro_batch_size: int = 1, lr: float = 3e-4
) -> TrainingConfig:
    """Every Llama recipe: recipes.base.pretrain over NeMo's horizon; `_layout` sets the layout."""
    return pretrain(
        model,
        ParallelConfig(),
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        lr=lr,
    )


def _layout(
    cfg: TrainingConfig, *, tp: int = 1, pp: int = 1, vpp: int | None = None, cp: int = 1
) -> TrainingConfig:
    """Set the model-parallel layout, sequence parallel whenever TP > 1 (as NeMo does)."""
    par = cfg.parallel
    par.tensor_model_parallel_size, par.pipeline_model_parallel_size = tp, pp
    par.virtual_pipeline_model_parallel_size, par.context_parallel_size = vpp, cp
    par.sequence_parallel = tp > 1
    return cfg


# Llama 3.2 1B / 3B: no NeMo or Megatron-Bridge performance table has them, so these take the
# layout and batch of NeMo 2's own llama32_{1b,3b}.pretrain_recipe (1 node x 8 GPUs, TP1 PP1,
# GBS 512, MBS 1, seq 8192, lr 3e-4): data parallel only, the model fits whole on every GPU.
@recipe(
    nodes=1,
    source="no published perf run; NeMo 2 llama32_1b.pretrain_recipe defaults (8 GPUs, TP1 PP1, GBS 512)",
)
def llama32_1b_pretrain() -> TrainingConfig:
    """Llama 3.2 1B pretraining, data parallel on one 8-GPU node."""
    return _pretrain(llama32_1b(), global_batch_size=512)


@recipe(
    nodes=1,
    source="no published perf run; NeMo 2 llama32_3b.pretrain_recipe defaults (8 GPUs, TP1 PP1, GBS 512)",
)
def llama32_3b_pretrain() -> TrainingConfig:
    """Llama 3.2 3B pretraining, data parallel on one 8-GPU node."""
    return _pretrain(llama32_3b(), global_batch_size=512)


# CP2 splits each 8192-token sequence over two GPUs, halving activation memory: no recompute.
@recipe(
    nodes=1,
    source="DGX Cloud benchmarking llama3.1/README_8b.md (NeMo 24.09) and MB H100 BF16: TP1 PP1 CP2, GBS 128",
)
def llama3_8b_pretrain() -> TrainingConfig:
    """Llama 3 8B pretraining on one H100 node (published BF16 layout)."""
    return _layout(_pretrain(llama3_8b(), global_batch_size=128), cp=2)


@recipe(nodes=1, source=f"{MB} 25.11, DGX-H100 FP8-CS: TP1 PP1 CP1, Megatron-FSDP, GBS 128")
def llama3_8b_pretrain_8gpu_h100_fp8cs() -> TrainingConfig:
    """Llama 3 8B on 8 H100s with FP8 current scaling (published layout)."""
    cfg = _layout(llama3_8b_pretrain(), cp=1)
    cfg.precision = FP8_CS
    # Without CP every GPU holds whole sequences. As published: Megatron-FSDP shards the weights
    # and gradients too, and 5 layers are recomputed in full (predicted 56 of 79 GiB; with
    # Megatron DDP and the distributed optimizer, FP8 weights alone, it takes recomputing 9).
    cfg.parallel.use_megatron_fsdp = True
    cfg.model.recompute_granularity = "full"
    cfg.model.recompute_method = "block"
    cfg.model.recompute_num_layers = 5
    return cfg


# Full SFT as NeMo 2's llama3_8b.finetune_recipe sets it (no PEFT): TP2, seq 2048 (most SQuAD
# samples are shorter), GBS 128, MBS 1, lr 5e-6. The paths are placeholders for your own.
@recipe(
    nodes=1,
    source="NeMo 2 llama3_8b.finetune_recipe, full SFT: TP2, seq 2048, GBS 128, MBS 1, lr 5e-6",
)
def llama3_8b_sft() -> TrainingConfig:
    """Llama 3 8B full SFT on one 8-GPU node, from the base model's Hugging Face folder.

    checkpoint.pretrained_dir takes the downloaded Hugging Face folder of meta-llama/Meta-Llama-3-8B
    as it is (config.json and safetensors, no conversion step; `recipes check` compares its
    config.json with the model section first), or a Megatron checkpoint of the same architecture
    (a run's checkpoints folder or one iter_XXXXXXX). For Llama 3.1 8B, take its architecture
    with the override model=<its folder>.
    """
    cfg = finetune(
        llama3_8b(seq_length=2048),
        ParallelConfig(),
        data_path="/data/sft/train.jsonl",  # placeholder: {"prompt", "response"} lines
        tokenizer="/models/Meta-Llama-3-8B",  # placeholder: the base model's local tokenizer
        # placeholder: the base model's Hugging Face folder, or a Megatron checkpoint
        pretrained_dir="/models/Meta-Llama-3-8B",
        global_batch_size=128,
    )
    return _layout(cfg, tp=2)


# Megatron-Bridge's llama3_8b_finetune_config with its default peft="lora": TP1 PP1, LoRA dim 8,
# alpha 16 on linear_qkv/proj/fc1/fc2, lr 1e-4 (50 warmup steps, cosine to 0, Adam beta2 0.98),
# packed sequences of 4096 in GBS 8, MBS 1. It lays that out over 8 GPUs; one H100 holds it too
# (frozen BF16 weights 15 GiB, adapters and their optimizer state under 0.1 GiB).
@recipe(
    nodes=1,
    gpus_per_node=1,
    source="Megatron-Bridge llama3_8b_finetune_config(peft='lora'): TP1, dim 8, alpha 16, lr 1e-4, "
    "packed seq 4096, GBS 8, MBS 1",
)
def llama3_8b_lora() -> TrainingConfig:
    """Llama 3 8B LoRA on chat conversations on one H100, from the Instruct model's folder.

    data.path holds JSONL lines of {"messages": [{"role", "content"}, ...]}; they are rendered with
    the chat template of data.tokenizer's folder and the loss falls on the assistant's turns.
    `recipes export CKPT OUT --adapter` writes the adapter for peft or vLLM; without --adapter,
    the merged model.
    """
    cfg = finetune(
        llama3_8b(seq_length=4096),
        ParallelConfig(),
        data_path="/data/chat/train.jsonl",  # placeholder: {"messages": [...]} lines
        tokenizer=LLAMA3_8B_INSTRUCT,  # placeholder: its folder (the chat template's)
        pretrained_dir=LLAMA3_8B_INSTRUCT,  # placeholder: the Hugging Face folder
        global_batch_size=8,
        kind="chat",
    )
    return lora(cfg, rank=8, alpha=16)


@recipe(
    nodes=1,
    source="NeMo 2 llama3_8b.finetune_recipe, full SFT (TP2, seq 2048, GBS 128, lr 5e-6), on chat",
)
def llama3_8b_chat_sft() -> TrainingConfig:
    """Llama 3 8B full SFT on chat conversations on one 8-GPU node: every weight trains, the loss
    on the assistant's turns (the template of data.tokenizer's folder)."""
    cfg = llama3_8b_sft()
    cfg.data.kind, cfg.data.path = "chat", "/data/chat/train.jsonl"  # placeholder
    cfg.data.tokenizer = cfg.checkpoint.pretrained_dir = LLAMA3_8B_INSTRUCT  # placeholders
    return cfg


@recipe(
    nodes=1,
    gpu="b200",
    source=f"{MB}, DGX-B200 BF16 (LLAMA3_8B_PRETRAIN_CONFIG_B200_BF16_V1): TP1 PP1 CP1, MBS 2",
)
def llama3_8b_pretrain_8gpu_b200_bf16() -> TrainingConfig:
    """Llama 3 8B on 8 B200s: 178 GiB per GPU needs neither CP nor recompute, and takes MBS 2."""
    cfg = _layout(llama3_8b_pretrain(), cp=1)
    cfg.train.micro_batch_size = 2
    return cfg


@recipe(
    nodes=2,
    gpus_per_node=4,
    gpu="gb200",
    source=f"{MB}, DGX-GB200 BF16 (LLAMA3_8B_PRETRAIN_CONFIG_GB200_BF16_V1): TP1 PP1, MBS 2",
)
def llama3_8b_pretrain_8gpu_gb200_bf16() -> TrainingConfig:
    """Llama 3 8B on 8 GB200s (2 trays of 4): the B200 layout."""
    return llama3_8b_pretrain_8gpu_b200_bf16()


@recipe(
    nodes=8,
    source=f"{MB}, DGX-H100 BF16 (LLAMA3_70B_PRETRAIN_CONFIG_H100_BF16_V2): TP4 PP4 CP2 VP5, GBS 256",
)
def llama3_70b_pretrain() -> TrainingConfig:
    """Llama 3 70B pretraining on 64 H100s (published BF16 layout)."""
    # 80 layers over PP4 x VP5 = 20 chunks of 4; 256 / (MBS 1 x DP 2) = 128 microbatches, % PP.
    return _layout(_pretrain(llama3_70b(), global_batch_size=256), tp=4, pp=4, vpp=5, cp=2)


@recipe(nodes=8, source=f"{MB} 26.04, DGX-H100 FP8-CS: TP4 PP8 CP1 VP5, GBS 256")
def llama3_70b_pretrain_64gpu_h100_fp8cs() -> TrainingConfig:
    """Llama 3 70B on 64 H100s with FP8 current scaling (published layout)."""
    # The FP8 run trades CP2 for a deeper pipeline: PP8 x VP5 = 40 chunks of 2 layers.
    cfg = _layout(llama3_70b_pretrain(), tp=4, pp=8, vpp=5)
    cfg.precision = FP8_CS
    return cfg


@recipe(
    nodes=8,
    gpu="b200",
    source=f"{MB}, DGX-B200 BF16 (LLAMA3_70B_PRETRAIN_CONFIG_B200_BF16_V2): TP2 PP4 CP2 VP5, GBS 256",
)
def llama3_70b_pretrain_64gpu_b200_bf16() -> TrainingConfig:
    """Llama 3 70B on 64 B200s: the larger memory halves TP."""
    return _layout(llama3_70b_pretrain(), tp=2, pp=4, vpp=5, cp=2)


@recipe(
    nodes=16,
    gpus_per_node=4,
    gpu="gb200",
    source=f"{MB}, DGX-GB200 MXFP8 (LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_MX_V2): TP2 PP4 VP5, GBS 256",
)
def llama3_70b_pretrain_64gpu_gb200_fp8mx() -> TrainingConfig:
    """Llama 3 70B on 64 GB200s with MXFP8 (published layout)."""
    cfg = _layout(llama3_70b_pretrain(), tp=2, pp=4, vpp=5)
    cfg.precision = MXFP8
    return cfg


# No NeMo or Megatron-Bridge table publishes H200 runs. Derived: H200 is an H100 compute-wise with
# 141 GB, so the H100 BF16 layout can drop to TP2 (the B200 BF16 layout) and still fit.
@recipe(
    nodes=8,
    gpu="h200",
    source="no published H200 run; derived from the MB B200 BF16 layout TP2 PP4 CP2 VP5",
)
def llama3_70b_pretrain_64gpu_h200_bf16() -> TrainingConfig:
    """Llama 3 70B on 64 H200s (derived layout, not a published run)."""
    return _layout(llama3_70b_pretrain(), tp=2, pp=4, vpp=5, cp=2)


# 126 layers over PP8 x VP8 = 64 chunks do not split evenly: finalize derives the balanced layout
# Megatron-Core needs, with the embedding and the loss each standing in for one layer.
@recipe(
    nodes=128,
    source=f"{MB}, DGX-H100 BF16 (LLAMA31_405B_PRETRAIN_CONFIG_H100_BF16_V2): TP8 PP8 CP2 VP8, GBS 1536",
)
def llama31_405b_pretrain() -> TrainingConfig:
    """Llama 3.1 405B pretraining on 1024 H100s (published BF16 layout)."""
    # Llama 3 paper (arXiv 2407.21783, section 3.4.1): peak lr 8e-5 after 8000 linear warmup
    # steps, then cosine to 8e-7 over 1.2M steps.
    cfg = _pretrain(llama31_405b(), global_batch_size=1536, lr=8e-5)
    cfg.optimizer.min_lr, cfg.scheduler.warmup_steps, cfg.train.max_steps = 8e-7, 8000, 1_200_000
    return _layout(cfg, tp=8, pp=8, vpp=8, cp=2)


@recipe(nodes=128, source=f"{MB} 26.06, DGX-H100 FP8-CS: TP8 PP8 CP2 VP8, GBS 1536")
def llama31_405b_pretrain_1024gpu_h100_fp8cs() -> TrainingConfig:
    """Llama 3.1 405B on 1024 H100s with FP8 current scaling (published layout)."""
    cfg = llama31_405b_pretrain()
    cfg.precision = FP8_CS
    return cfg


# Megatron-Bridge's 256-GPU GB200 preset (TP4 PP16 VP8, GBS 1536) is predicted 0.5 GiB over the
# 184 GiB without recompute; the 128-GPU one below fits with room to spare.
@recipe(
    nodes=32,
    gpus_per_node=4,
    gpu="gb200",
    source="NeMo performance summary 25.04 DGX-GB200 and MB GB200 BF16 (LLAMA31_405B_PRETRAIN_CONFIG_GB200_BF16_V1): TP4 PP8 CP2 VP8, GBS 64",
)
def llama31_405b_pretrain_128gpu_gb200_bf16() -> TrainingConfig:
    """Llama 3.1 405B on 128 GB200s (32 trays of 4; published BF16 layout)."""
    cfg = _layout(llama31_405b_pretrain(), tp=4, pp=8, vpp=8, cp=2)
    cfg.train.global_batch_size = 64  # DP 2 x 32 microbatches
    return cfg
