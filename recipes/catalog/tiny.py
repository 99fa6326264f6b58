"""Tiny recipes for the CPU smoke mode: the real engine, two gloo processes, about a minute.

Not published runs. They exercise the same paths as the big recipes (tensor parallel, expert
parallel, the distributed optimizer, checkpoints) on a laptop; `recipes run tiny_gpt_pretrain
--device cpu` is the demo. Sequence parallel, context parallel, the alltoall dispatcher and FP8
need a GPU, so these recipes leave them off.
"""

from __future__ import annotations

from config.schema import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PeftConfig,
    SchedulerConfig,
    TrainConfig,
    TrainingConfig,
)
from models.presets.tiny import tiny_gpt, tiny_moe
from recipes.registry import recipe

SOURCE = "CPU smoke recipe, not a published run"


def _pretrain(model: ModelConfig, parallel: ParallelConfig) -> TrainingConfig:
    """40 steps of mock data: enough for the loss to fall visibly and for a checkpoint and resume."""
    return TrainingConfig(
        name="tiny_pretrain",  # the registry replaces it with the recipe's own name
        model=model,
        parallel=parallel,
        # A tiny model tolerates (and needs, to move within 40 steps) a large learning rate.
        optimizer=OptimizerConfig(lr=1e-3, min_lr=1e-4, weight_decay=0.01),
        scheduler=SchedulerConfig(warmup_steps=4, decay_style="cosine"),
        data=DataConfig(kind="mock"),
        # 8 sequences of 128 tokens per step: 4 microbatches of 2 at TP2 (DP1), 2 at EP2 (DP2).
        train=TrainConfig(global_batch_size=8, micro_batch_size=2, max_steps=40),
        checkpoint=CheckpointConfig(save_interval=20),  # one mid-run checkpoint to resume from
    )


@recipe(nodes=1, gpus_per_node=2, gpu="cpu", source=SOURCE)
def tiny_gpt_pretrain() -> TrainingConfig:
    """A 4-layer GPT split TP=2 over two CPU processes (the demo)."""
    # Sequence parallel stays off although TP > 1: it needs a GPU.
    return _pretrain(tiny_gpt(), ParallelConfig(tensor_model_parallel_size=2))


@recipe(nodes=1, gpus_per_node=2, gpu="cpu", source=SOURCE)
def tiny_moe_pretrain() -> TrainingConfig:
    """A 4-layer MoE GPT, 4 experts split EP=2 over two CPU processes (allgather dispatcher)."""
    return _pretrain(tiny_moe(), ParallelConfig(expert_model_parallel_size=2))


@recipe(nodes=1, gpus_per_node=2, gpu="cpu", source=SOURCE)
def tiny_gpt_sft() -> TrainingConfig:
    """The tiny GPT fine-tuned on packed arithmetic Q&A, TP=2 over two CPU processes."""
    cfg = tiny_gpt_pretrain()
    # `recipes data make-synthetic-sft` writes both; the loss counts only the answers.
    cfg.data = DataConfig(
        kind="sft",
        path="runs/synthetic_sft/sft.jsonl",
        tokenizer="runs/synthetic_sft/tokenizer.json",
        sequence_packing=True,  # about 8 pairs per 128-token row, each under its own mask
    )
    cfg.optimizer.lr, cfg.optimizer.min_lr = 2e-3, 2e-4  # from scratch: no pretrained weights
    return cfg


@recipe(nodes=1, gpus_per_node=2, gpu="cpu", source=SOURCE)
def tiny_llama_chat_lora() -> TrainingConfig:
    """LoRA on chat conversations, TP=2 over two CPU processes, from a tiny Hugging Face folder.

    `recipes data make-synthetic-chat --tokenizer runs/synthetic_chat/tokenizer` writes the
    conversations and a tokenizer folder with a ChatML template; `scripts/make_tiny_hf.py
    runs/tiny_llama --tokenizer runs/synthetic_chat/tokenizer` the model folder (random weights, the
    tiny GPT's shapes, that tokenizer). The adapters export for peft with `recipes export --adapter`.
    """
    cfg = tiny_gpt_pretrain()
    cfg.model.layernorm_epsilon = 1e-6  # transformers' LlamaConfig default, as the folder holds it
    cfg.data = DataConfig(
        kind="chat",
        path="runs/synthetic_chat/chat.jsonl",
        tokenizer="runs/synthetic_chat/tokenizer",
        sequence_packing=True,  # a conversation is ~60 tokens: two or three fill a row
    )
    cfg.checkpoint.pretrained_dir = "runs/tiny_llama"
    cfg.peft = PeftConfig(scheme="lora", rank=8, alpha=16)
    # The adapters start at zero: a random tiny base needs a large rate to move within 40 steps.
    cfg.optimizer.lr, cfg.optimizer.min_lr = 1e-2, 1e-3
    return cfg
