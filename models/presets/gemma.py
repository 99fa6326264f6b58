"""Gemma 3 presets (the text model), numbers from Google's published config.json.

Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path). The 1B
folder is a Gemma3ForCausalLM; the 4B, 12B and 27B folders are Gemma3ForConditionalGeneration,
whose `text_config` these are (the SigLIP vision tower is not part of them). What every size
shares is in `_gemma3`; tests/unit/models/test_gemma3_presets.py holds each to its config.json.
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig


def _gemma3(seq_length: int, **size: Any) -> ModelConfig:
    """The fields every size shares, `size` adding or replacing some."""
    shared: dict[str, Any] = dict(
        seq_length=seq_length,
        vocab_size=262_208,  # the 4B-27B text_config's (with the image tokens); 1B: 262,144
        kv_channels=256,  # head_dim (27B: 128)
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,  # rms_norm_eps
        layernorm_zero_centered_gamma=True,  # Gemma3RMSNorm scales by (1 + weight)
        activation="geglu",  # hidden_activation: gelu_pytorch_tanh, gated
        qk_layernorm=True,  # q_norm, k_norm
        sandwich_norm=True,  # post_attention_layernorm, post_feedforward_layernorm
        scale_embeddings=True,  # Gemma3TextScaledWordEmbedding: times sqrt(hidden_size)
        share_embeddings_and_output_weights=True,  # tie_word_embeddings
        init_method_std=0.02,  # initializer_range
        softmax_scale=256**-0.5,  # query_pre_attn_scalar 256 (27B: 168)
        # sliding_window 1024 (1B: 512) counts the query itself; window_size does not
        window_size=1023,
        window_attn_skip_freq=6,  # sliding_window_pattern: five local layers, then a global one
        rotary_base=1_000_000,  # rope_theta, the global layers
        rotary_base_local=10_000,  # rope_local_base_freq, the local layers
        rope_scaling="linear",  # rope_scaling {"rope_type": "linear", "factor": 8.0}; 1B: none
        rope_scaling_factor=8.0,
    )
    return ModelConfig(**(shared | size))


def gemma3_1b(seq_length: int = 4096) -> ModelConfig:
    """google/gemma-3-1b-pt config.json (Gemma3ForCausalLM): 1.0B parameters, 26 layers, one KV
    head, a 512-token window, a 32,768-token context without RoPE scaling, 262,144 tokens."""
    return _gemma3(
        seq_length,
        num_layers=26,  # num_hidden_layers
        hidden_size=1152,
        ffn_hidden_size=6912,  # intermediate_size
        num_attention_heads=4,
        num_query_groups=1,  # num_key_value_heads
        vocab_size=262_144,
        window_size=511,  # sliding_window 512
        rope_scaling=None,  # rope_scaling: null (the factor is then unused)
    )


def gemma3_4b(seq_length: int = 4096) -> ModelConfig:
    """google/gemma-3-4b-pt text_config: 3.9B parameters in the language model, 34 layers."""
    return _gemma3(
        seq_length,
        num_layers=34,
        hidden_size=2560,
        ffn_hidden_size=10240,
        num_attention_heads=8,
        num_query_groups=4,
    )


def gemma3_12b(seq_length: int = 4096) -> ModelConfig:
    """google/gemma-3-12b-pt text_config: 11.8B parameters in the language model, 48 layers."""
    return _gemma3(
        seq_length,
        num_layers=48,
        hidden_size=3840,
        ffn_hidden_size=15360,
        num_attention_heads=16,
        num_query_groups=8,
    )


def gemma3_27b(seq_length: int = 4096) -> ModelConfig:
    """google/gemma-3-27b-pt text_config: 27.0B parameters in the language model, 62 layers.
    Heads of 128 (32 x 128 = 4096, not hidden 5376) with logits scaled as heads of 168
    (query_pre_attn_scalar = 5376 / 32)."""
    return _gemma3(
        seq_length,
        num_layers=62,
        hidden_size=5376,
        ffn_hidden_size=21504,
        num_attention_heads=32,
        num_query_groups=16,
        kv_channels=128,
        softmax_scale=168**-0.5,
    )
