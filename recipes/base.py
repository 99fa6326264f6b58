"""What every GPU pretraining and fine-tuning recipe shares; family modules pass only what differs.

Pretraining: AdamW (0.9, 0.95, weight decay 0.1), linear warmup then cosine to a tenth of the
peak, mock data (set data.kind=indexed, data.path and data.tokenizer to learn from real text), a
checkpoint every 500 steps (a few hours apart at the published speeds).

Fine-tuning (`finetune`): the same AdamW at NeMo 2's full-SFT rate (5e-6, 50 warmup steps, cosine
to 0) on prompt/response JSONL (data.kind=sft) or conversations (data.kind=chat), starting from
checkpoint.pretrained_dir. `lora` turns such a recipe into LoRA: adapters train, the base is
frozen, at NeMo 2's and Megatron-Bridge's LoRA rate (1e-4).
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

NEMO_PRETRAIN_STEPS = 1_168_251  # NeMo's pretraining horizon for its Llama and Mixtral recipes


def pretrain(
    model: ModelConfig,
    parallel: ParallelConfig,
    *,
    global_batch_size: int,
    micro_batch_size: int = 1,
    lr: float = 3e-4,
    min_lr: float | None = None,  # None: a tenth of lr
    warmup_steps: int = 2000,
    max_steps: int = NEMO_PRETRAIN_STEPS,
) -> TrainingConfig:
    if model.num_moe_experts:
        # Experts exchange tokens with alltoall on GPUs; grouped GEMM runs all local experts at once.
        model.moe_token_dispatcher_type, model.moe_grouped_gemm = "alltoall", True
    parallel.sequence_parallel = parallel.tensor_model_parallel_size > 1  # as NeMo does
    # Gradients reduced in BF16, as NVIDIA's performance runs do: 2 bytes per parameter less.
    parallel.grad_reduce_in_fp32 = False
    return TrainingConfig(
        name="pretrain",  # the registry replaces it with the recipe's own name
        model=model,
        parallel=parallel,
        optimizer=OptimizerConfig(
            lr=lr,
            min_lr=lr / 10 if min_lr is None else min_lr,
            weight_decay=0.1,
            adam_beta1=0.9,
            adam_beta2=0.95,
        ),
        scheduler=SchedulerConfig(warmup_steps=warmup_steps, decay_style="cosine"),
        data=DataConfig(kind="mock"),
        # The cosine decays over the whole horizon.
        train=TrainConfig(
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            max_steps=max_steps,
        ),
        checkpoint=CheckpointConfig(save_interval=500),
    )


def finetune(
    model: ModelConfig,
    parallel: ParallelConfig,
    *,
    data_path: str,
    tokenizer: str,
    pretrained_dir: str,
    global_batch_size: int,
    micro_batch_size: int = 1,
    lr: float = 5e-6,
    max_steps: int = 1000,
    kind: str = "sft",
) -> TrainingConfig:
    """Full SFT: every weight trains, loss on the responses (data/sft.py) or the assistant's turns
    (kind="chat", data/chat.py) only."""
    cfg = pretrain(
        model,
        parallel,
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        lr=lr,
        min_lr=0.0,
        warmup_steps=50,
        max_steps=max_steps,
    )
    cfg.data = DataConfig(kind=kind, path=data_path, tokenizer=tokenizer)
    cfg.checkpoint = CheckpointConfig(save_interval=250, pretrained_dir=pretrained_dir)
    return cfg


def lora(cfg: TrainingConfig, *, rank: int, alpha: float, lr: float = 1e-4) -> TrainingConfig:
    """LoRA on the attention and MLP linear layers (training/lora.py), packed rows (short chat
    turns fill a row), Megatron-Bridge's finetune optimizer (Adam beta2 0.98)."""
    cfg.peft = PeftConfig(scheme="lora", rank=rank, alpha=alpha)
    cfg.optimizer.lr, cfg.optimizer.adam_beta2 = lr, 0.98
    cfg.data.sequence_packing = True
    return cfg
