"""Phi-3 presets, numbers from Microsoft's published config.json (the 4K-context models).

Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path). Both
publish sliding_window 2047: with their weights, model.seq_length must stay at 2047 or less (up to
there the window cuts nothing off; `recipes check` names it), hence the default of 2047; with
sequence or context parallelism take one that TP and 2 x CP divide (2040 at TP 8). The 128K
models' LongRoPE is not modelled (models/hf/phi3.py).
"""

from __future__ import annotations

from config.schema import ModelConfig


def _phi3(
    seq_length: int, *, layers: int, hidden: int, ffn: int, heads: int, groups: int
) -> ModelConfig:
    """What Phi-3 mini and medium share: Llama's computation (fused qkv_proj and gate_up_proj in
    the published files), no biases, vocabulary 32064, RoPE base 10000, untied embeddings."""
    return ModelConfig(
        num_layers=layers,  # num_hidden_layers
        hidden_size=hidden,  # hidden_size
        ffn_hidden_size=ffn,  # intermediate_size
        num_attention_heads=heads,  # num_attention_heads
        num_query_groups=groups,  # num_key_value_heads
        share_embeddings_and_output_weights=False,  # tie_word_embeddings
        seq_length=seq_length,
        vocab_size=32064,  # vocab_size
        rotary_base=10_000,  # rope_theta
        normalization="RMSNorm",
        layernorm_epsilon=1e-5,  # rms_norm_eps
        activation="swiglu",  # hidden_act: silu, gated
        init_method_std=0.02,  # initializer_range
    )


def phi3_mini_4k(seq_length: int = 2047) -> ModelConfig:
    """microsoft/Phi-3-mini-4k-instruct: 3.82B parameters, 32 layers, 32 heads of 96 (no GQA)."""
    return _phi3(seq_length, layers=32, hidden=3072, ffn=8192, heads=32, groups=32)


def phi3_medium_4k(seq_length: int = 2047) -> ModelConfig:
    """microsoft/Phi-3-medium-4k-instruct: 14B parameters, 40 layers, 40 heads of 128 in 10 KV
    groups."""
    return _phi3(seq_length, layers=40, hidden=5120, ffn=17920, heads=40, groups=10)
