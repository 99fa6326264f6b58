"""Mistral presets, numbers from Mistral AI's published config.json.

Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path).
"""

from __future__ import annotations

from config.schema import ModelConfig


def mistral_7b_v03(seq_length: int = 4096) -> ModelConfig:
    """mistralai/Mistral-7B-v0.3 config.json (MistralForCausalLM): 7.25B parameters.

    Llama's layout: 32 layers, hidden 4096, 32 heads of 128 in 8 KV groups, SwiGLU of 14336, no
    biases, untied embeddings; the vocabulary extended to 32768 in v0.3 (v0.2 has 32000), RoPE base
    1e6, sliding_window null (whole-sequence attention; v0.1's window of 4096 bounds
    model.seq_length to 4096 with its weights). max_position_embeddings is 32768; training at 4096
    is a choice.
    """
    return ModelConfig(
        num_layers=32,  # num_hidden_layers
        hidden_size=4096,  # hidden_size
        ffn_hidden_size=14336,  # intermediate_size
        num_attention_heads=32,  # num_attention_heads
        num_query_groups=8,  # num_key_value_heads
        share_embeddings_and_output_weights=False,  # tie_word_embeddings
        seq_length=seq_length,
        vocab_size=32768,  # vocab_size
        rotary_base=1_000_000,  # rope_theta
        normalization="RMSNorm",
        layernorm_epsilon=1e-5,  # rms_norm_eps
        activation="swiglu",  # hidden_act: silu, gated
        init_method_std=0.02,  # initializer_range
    )
