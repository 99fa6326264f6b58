"""Llama 3 / 3.1 / 3.2 architecture presets, numbers from Meta's published config.json files.

Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path). Every
Llama 3.x shares the 128,256-token vocabulary, SwiGLU, RMSNorm (eps 1e-5), GQA with 8 KV heads and
RoPE base 500,000. The 3.1 and 3.2 configs also carry "llama3" RoPE frequency scaling (factor 8
and 32, low/high frequency factors 1 and 4 over 8,192 original positions): it changes the rotation
of the low frequencies at every position, so the presets carry it as published and a Hugging
Face folder of those models loads with the same forward (models/hf/llama.py).
"""

from __future__ import annotations

from config.schema import ModelConfig

LLAMA3_VOCAB = 128_256
LLAMA3_ROPE_BASE = 500_000


def _llama3(**arch: int | bool) -> ModelConfig:
    return ModelConfig(
        vocab_size=LLAMA3_VOCAB,
        num_query_groups=8,
        rotary_base=LLAMA3_ROPE_BASE,
        normalization="RMSNorm",
        layernorm_epsilon=1e-5,
        activation="swiglu",
        init_method_std=0.02,  # initializer_range
        **arch,
    )


def llama32_1b(seq_length: int = 8192) -> ModelConfig:
    """meta-llama/Llama-3.2-1B config.json: 16 layers, hidden 2048, 32 heads of 64, tied embeddings."""
    return _llama3(
        num_layers=16,
        hidden_size=2048,
        ffn_hidden_size=8192,
        num_attention_heads=32,
        kv_channels=64,
        share_embeddings_and_output_weights=True,  # tie_word_embeddings: true
        rope_scaling="llama3",  # rope_scaling.rope_type
        rope_scaling_factor=32.0,
        seq_length=seq_length,
    )


def llama32_3b(seq_length: int = 8192) -> ModelConfig:
    """meta-llama/Llama-3.2-3B config.json: 28 layers, hidden 3072, 24 heads of 128, tied embeddings."""
    return _llama3(
        num_layers=28,
        hidden_size=3072,
        ffn_hidden_size=8192,
        num_attention_heads=24,
        kv_channels=128,
        share_embeddings_and_output_weights=True,  # tie_word_embeddings: true
        rope_scaling="llama3",  # rope_scaling.rope_type
        rope_scaling_factor=32.0,
        seq_length=seq_length,
    )


def llama3_8b(seq_length: int = 8192) -> ModelConfig:
    """meta-llama/Meta-Llama-3-8B config.json: 32 layers, hidden 4096, ffn 14336, 32 heads."""
    return _llama3(
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=14336,
        num_attention_heads=32,
        seq_length=seq_length,
    )


def llama3_70b(seq_length: int = 8192) -> ModelConfig:
    """meta-llama/Meta-Llama-3-70B config.json: 80 layers, hidden 8192, ffn 28672, 64 heads."""
    return _llama3(
        num_layers=80,
        hidden_size=8192,
        ffn_hidden_size=28672,
        num_attention_heads=64,
        seq_length=seq_length,
    )


def llama31_405b(seq_length: int = 8192) -> ModelConfig:
    """meta-llama/Llama-3.1-405B config.json: 126 layers, hidden 16384, ffn 53248, 128 heads."""
    return _llama3(
        num_layers=126,
        hidden_size=16384,
        ffn_hidden_size=53248,
        num_attention_heads=128,
        rope_scaling="llama3",  # rope_scaling.rope_type
        rope_scaling_factor=8.0,
        seq_length=seq_length,
    )
