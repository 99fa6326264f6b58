"""LLaVA-style vision-language recipes: CLIP ViT-L/14-336 + MLP projector + Llama 3 8B.

The two stages of LLaVA-1.5 (Liu et al. 2023, "Improved Baselines with Visual Instruction
Tuning"): `llava_llama3_8b_pretrain` aligns the projector on image-caption pairs with the encoder
and the language model frozen; `llava_llama3_8b_sft` then trains the language model too (the
encoder stays frozen). Batch, learning rate, warmup (3 %) and length (one epoch: 558K captions at
256, 665K instructions at 128) are the paper's; the 8-GPU layouts are NeMo 2's llava_next_7b
pretrain (TP4) and llava15_7b full finetune (TP2) recipes, both at seq 4096 and micro batch 2,
carried over to the 8B Llama 3 (derived, not a published Llama 3 run).

Data: an Energon dataset and the language model's tokenizer, both local:
    recipes data prepare /data/llava/LCS-558K /data/llava/pretrain   # images + captions
    recipes run llava_llama3_8b_pretrain data.path=/data/llava/pretrain \\
        data.tokenizer=/models/Meta-Llama-3-8B
The default paths below are placeholders for those overrides. Starting weights
(`checkpoint.pretrained_dir`): stage 2 takes stage 1's checkpoints, or a llava-hf folder
(LlavaForConditionalGeneration: CLIP, projector and language model in one) together with
`model=<that folder>`, since llava-hf's LLaVA-1.5 reads the ViT's second-to-last layer without the
class token where this preset keeps 24 layers and the class token (README, "Starting from Hugging
Face weights"). Stage 1 from separate CLIP and Llama 3 folders is not bridged: the pretrained
weights come from one folder or checkpoint.

`tiny_llava_pretrain` runs the same model code on two CPU processes over the synthetic set of
`recipes data make-synthetic-vlm runs/synthetic_vlm`.
"""

from __future__ import annotations

from config.schema import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    SchedulerConfig,
    TrainConfig,
    TrainingConfig,
)
from models.presets.llava import llava_llama3_8b, tiny_llava
from recipes.registry import recipe

PRETRAIN_SOURCE = (
    "NeMo 2 llava_next_7b.pretrain_recipe layout (8 GPUs, TP4, seq 4096, MBS 2) with LLaVA-1.5 "
    "stage 1 batch 256, lr 1e-3, one epoch of LCS-558K; derived for Llama 3 8B"
)
SFT_SOURCE = (
    "NeMo 2 llava15_7b.finetune_recipe full-finetune layout (8 GPUs, TP2, seq 4096, MBS 2) with "
    "LLaVA-1.5 stage 2 batch 128, lr 2e-5, one epoch of mix665k; derived for Llama 3 8B"
)
SYNTHETIC = "runs/synthetic_vlm"  # where `recipes data make-synthetic-vlm` writes by default


def _llava(
    model: ModelConfig, *, tp: int, gbs: int, lr: float, steps: int, data: str
) -> TrainingConfig:
    """LLaVA-1.5's optimiser (AdamW, betas 0.9/0.999, no weight decay, 3 % warmup, cosine)."""
    return TrainingConfig(
        name="llava",  # the registry replaces it with the recipe's own name
        model=model,
        # Sequence parallel with TP, as NeMo does (it needs TE's attention in LLaVAModel); BF16
        # gradient reduction as the Llama recipes.
        parallel=ParallelConfig(
            tensor_model_parallel_size=tp, sequence_parallel=tp > 1, grad_reduce_in_fp32=False
        ),
        optimizer=OptimizerConfig(lr=lr, min_lr=lr / 100, weight_decay=0.0, adam_beta2=0.999),
        scheduler=SchedulerConfig(warmup_steps=max(1, round(0.03 * steps)), decay_style="cosine"),
        data=DataConfig(
            kind="energon",
            path=f"/data/llava/{data}",  # placeholder: an Energon dataset (recipes data prepare)
            tokenizer="/models/Meta-Llama-3-8B",  # placeholder: the LM's local tokenizer
            num_workers=4,
            shuffle_buffer_size=1000,
        ),
        train=TrainConfig(global_batch_size=gbs, micro_batch_size=2, max_steps=steps),
        checkpoint=CheckpointConfig(save_interval=500),
    )


@recipe(nodes=1, source=PRETRAIN_SOURCE)
def llava_llama3_8b_pretrain() -> TrainingConfig:
    """LLaVA stage 1 on 8 H100s: train the projector, CLIP ViT-L/14-336 and Llama 3 8B frozen."""
    model = llava_llama3_8b(4096, freeze_language=True)
    return _llava(model, tp=4, gbs=256, lr=1e-3, steps=2180, data="pretrain")


@recipe(nodes=1, source=SFT_SOURCE)
def llava_llama3_8b_sft() -> TrainingConfig:
    """LLaVA stage 2 on 8 H100s: train the projector and Llama 3 8B, CLIP ViT-L/14-336 frozen,
    from stage 1's weights (checkpoint.pretrained_dir: a placeholder to override, see above)."""
    model = llava_llama3_8b(4096, freeze_language=False)
    cfg = _llava(model, tp=2, gbs=128, lr=2e-5, steps=5198, data="sft")
    cfg.checkpoint.pretrained_dir = "/runs/llava_llama3_8b_pretrain/checkpoints"  # placeholder
    return cfg


@recipe(nodes=1, gpus_per_node=2, gpu="cpu", source="CPU smoke recipe, not a published run")
def tiny_llava_pretrain() -> TrainingConfig:
    """A 2-layer ViT + 4-layer GPT on the synthetic shapes set, data parallel over two CPU ranks."""
    cfg = TrainingConfig(
        name="tiny_llava_pretrain",
        model=tiny_llava(seq_length=64),  # 17 image positions + a caption of about 12 tokens
        # DP=2: each rank has its own Energon loader and its own saved loader state.
        parallel=ParallelConfig(),
        # Random encoder and LM learn together (nothing frozen); a tiny model needs a large LR.
        optimizer=OptimizerConfig(lr=2e-3, min_lr=2e-4, weight_decay=0.0),
        scheduler=SchedulerConfig(warmup_steps=2, decay_style="cosine"),
        data=DataConfig(
            kind="energon",
            path=SYNTHETIC,
            tokenizer=f"{SYNTHETIC}/tokenizer.json",
            num_workers=2,
            shuffle_buffer_size=64,
            max_samples_per_sequence=32,
        ),
        train=TrainConfig(global_batch_size=8, micro_batch_size=2, max_steps=40),
        checkpoint=CheckpointConfig(save_interval=20),
    )
    return cfg
