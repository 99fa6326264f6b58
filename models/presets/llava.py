"""LLaVA-style vision-language presets: a CLIP ViT, a 2-layer MLP projector and a GPT.

Plain functions returning `ModelConfig` with arch "llava" (no torch: these sit on the one-second CLI
path); models/llava.py turns them into Megatron-Core's LLaVAModel. As in LLaVA-1.5, the
projector is Linear(vision hidden -> LM hidden), GELU, Linear(LM hidden -> LM hidden)
(projector_hidden_size None), and the image tokens are the patch embeddings of the encoder's last
layer; the class token is kept (VisionConfig.class_token), so one image takes
(image_size / patch_size)^2 + 1 positions of the language model: 577 for CLIP ViT-L/14-336.
"""

from __future__ import annotations

from config.schema import ModelConfig, VisionConfig
from models.presets.llama import llama3_8b
from models.presets.tiny import tiny_gpt


def clip_vit_l14_336(*, freeze_vision: bool = True, freeze_language: bool = False) -> VisionConfig:
    """openai/clip-vit-large-patch14-336 vision tower: 24 layers, hidden 1024, ffn 4096, 16 heads."""
    return VisionConfig(
        num_layers=24,
        hidden_size=1024,
        ffn_hidden_size=4096,
        num_attention_heads=16,
        image_size=336,
        patch_size=14,
        class_token=True,
        freeze_vision=freeze_vision,
        freeze_language=freeze_language,
    )


def llava_llama3_8b(seq_length: int = 4096, *, freeze_language: bool = False) -> ModelConfig:
    """CLIP ViT-L/14-336 + MLP projector + Llama 3 8B; the encoder stays frozen (as in LLaVA)."""
    model = llama3_8b(seq_length)
    model.arch = "llava"
    model.vision = clip_vit_l14_336(freeze_language=freeze_language)
    return model


def tiny_vit(*, freeze_vision: bool = False, freeze_language: bool = False) -> VisionConfig:
    """A 2-layer ViT on 32 x 32 images in 8 x 8 patches: 16 patches + a class token per image."""
    return VisionConfig(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=256,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        class_token=True,
        freeze_vision=freeze_vision,
        freeze_language=freeze_language,
    )


def tiny_llava(seq_length: int = 64) -> ModelConfig:
    """The tiny ViT in front of the tiny 4-layer GPT, for the CPU smoke mode; nothing frozen,
    since both start from random weights (a real run starts from pretrained ones)."""
    model = tiny_gpt(seq_length)
    model.arch = "llava"
    model.vision = tiny_vit()
    return model
