"""Tiny models for the CPU smoke mode: a few seconds per step on a laptop, same code paths as the big ones.

Not published models: sizes are picked so that TP=2 (heads, KV groups and FFN split in two) and
EP=2 (experts split in two) divide evenly, and so that a 2-process gloo run takes about a second
per step. Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path).
"""

from __future__ import annotations

from config.schema import ModelConfig


def tiny_gpt(seq_length: int = 128) -> ModelConfig:
    """A 4-layer Llama-style GPT (GQA, SwiGLU, RoPE): about 1.1M parameters."""
    return ModelConfig(
        num_layers=4,
        hidden_size=128,
        ffn_hidden_size=512,
        num_attention_heads=4,
        num_query_groups=2,  # GQA, and still whole KV heads per rank at TP=2
        seq_length=seq_length,
        vocab_size=512,
    )


def tiny_moe(seq_length: int = 128) -> ModelConfig:
    """The tiny GPT with every FFN a mixture of 4 experts, top-2."""
    model = tiny_gpt(seq_length)
    model.ffn_hidden_size = 256
    model.num_moe_experts = 4
    model.moe_router_topk = 2
    model.moe_ffn_hidden_size = 128
    # The alltoall dispatcher needs CUDA; allgather is the one that runs over gloo on the CPU.
    model.moe_token_dispatcher_type = "allgather"
    return model
