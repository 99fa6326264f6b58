"""Gemma 3 recipes: fine-tuning the 12B's language model, full and LoRA.

No performance run of Gemma 3 is published (neither the Megatron-Bridge nor the NeMo performance
summary lists one), and Megatron-Bridge's text recipes cover the 1B only
(src/megatron/bridge/recipes/gemma/h100/gemma3.py: full SFT at lr 5e-6 and LoRA dim 8, alpha 16
at lr 1e-4, GBS 32, packed rows of 4096). These take its settings to the 12B, with layouts sized
by `recipes check`'s memory estimate. The 12B folder is a Gemma3ForConditionalGeneration: the
language model trains, the vision tower is not loaded and an export writes it back unchanged
(models/hf/gemma3_vlm.py).

Gemma 3's sliding-window layers take Transformer Engine's attention as they are; context
parallelism cannot run them (the checker says so), so long sequences split over TP with sequence
parallel instead.
"""

from __future__ import annotations

from config.schema import ParallelConfig, TrainingConfig
from models.presets.gemma import gemma3_12b
from recipes.base import finetune, lora
from recipes.recipe import recipe

MB_1B = "no published run; Megatron-Bridge recipes/gemma/h100/gemma3.py (1B) settings on the 12B"
# A local Hugging Face folder of google/gemma-3-12b-pt (or -it): config.json, model-*.safetensors
# and their index, tokenizer.json. Placeholder: override checkpoint.pretrained_dir and
# data.tokenizer with where yours is.
GEMMA3_12B_HF = "/models/gemma-3-12b-pt"


@recipe(nodes=1, source=f"{MB_1B}: full SFT, lr 5e-6, GBS 32, seq 4096; TP4 with SP")
def gemma3_12b_sft() -> TrainingConfig:
    """Gemma 3 12B (language model) full SFT on one 8-GPU node, from its Hugging Face folder."""
    # TP4 (16 heads, 8 KV groups: 4 and 2 per rank) with SP: 12B x 18 bytes (distributed Adam over
    # DP 2 halves the 12) / 4 plus the 262k-token logits of a 4096-token row per rank.
    return finetune(
        gemma3_12b(seq_length=4096),
        ParallelConfig(tensor_model_parallel_size=4, sequence_parallel=True),
        data_path="/data/sft/train.jsonl",  # placeholder: {"prompt", "response"} lines
        tokenizer=GEMMA3_12B_HF,  # placeholder: the folder's tokenizer.json
        pretrained_dir=GEMMA3_12B_HF,  # placeholder: a Hugging Face folder or a Megatron checkpoint
        global_batch_size=32,
    )


@recipe(
    nodes=1,
    gpus_per_node=4,
    gpu="gh200",
    source=f"{MB_1B}: full SFT on one 4-GH200 node (Alps, JUPITER); TP4 with SP",
)
def gemma3_12b_sft_4gpu_gh200_bf16() -> TrainingConfig:
    """Gemma 3 12B full SFT on one node of 4 GH200s (96 GB each): the 8-GPU layout at DP 1."""
    # 56 of 95 GiB predicted; `recipes check gemma3_12b_sft --profile leonardo` (4 A100s of
    # 64 GB) predicts the same 56 of 63 GiB.
    return gemma3_12b_sft()


@recipe(nodes=1, source=f"{MB_1B}: LoRA dim 8, alpha 16, lr 1e-4, GBS 32, packed rows of 4096")
def gemma3_12b_lora() -> TrainingConfig:
    """Gemma 3 12B LoRA on chat conversations on one 8-GPU node, Gemma's own chat template."""
    # The frozen 12B in BF16 (24 GB) fits one GPU beside its activations: no TP, DP 8.
    cfg = finetune(
        gemma3_12b(seq_length=4096),
        ParallelConfig(),
        data_path="/data/chat/train.jsonl",  # placeholder: {"messages": [...]} lines
        tokenizer=GEMMA3_12B_HF,  # placeholder: the folder (its tokenizer and chat template)
        pretrained_dir=GEMMA3_12B_HF,  # placeholder: the Hugging Face folder
        global_batch_size=32,
        kind="chat",
    )
    return lora(cfg, rank=8, alpha=16)


@recipe(
    nodes=1,
    gpus_per_node=4,
    gpu="gh200",
    source=f"{MB_1B}: LoRA on one 4-GH200 node (Alps, JUPITER); TP1, DP 4",
)
def gemma3_12b_lora_4gpu_gh200_bf16() -> TrainingConfig:
    """Gemma 3 12B LoRA on one node of 4 GH200s: the 8-GPU layout at DP 4."""
    return gemma3_12b_lora()
