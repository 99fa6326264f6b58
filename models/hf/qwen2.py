"""Qwen2 and Qwen2.5 (Qwen2ForCausalLM) <-> Megatron-Core's GPTModel.

Llama's layout with a bias on the query, key and value projections and nowhere else (no bias on
o_proj or the MLP): Megatron-Core's add_qkv_bias. The small models (0.5B, 1.5B, 3B) tie the output
layer to the embedding. Every published Qwen2/2.5 model attends over the whole sequence
(use_sliding_window false, whatever its sliding_window and max_window_layers say); a folder that
switches the window on is refused, as is RoPE scaling other than none (the 128K YaRN setting Qwen
documents for long inputs is added to config.json by hand, and YaRN is modelled for multi-latent
attention only).
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt, llama, qwen3
from models.hf.mapping import Node

ARCHITECTURE = "Qwen2ForCausalLM"


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    qwen3.full_attention_only(hf)
    fields = gpt.decoder_fields(hf)
    qwen3.plain_rope(fields)
    return ModelConfig(**fields, add_qkv_bias=True)


def to_hf(model: ModelConfig) -> dict[str, Any]:
    return gpt.decoder_to_hf(model, ARCHITECTURE, "qwen2") | {
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": model.num_layers,
    }


def matches(model: ModelConfig) -> bool:
    return (
        model.arch == "gpt"
        and not model.num_moe_experts
        and not model.qk_layernorm
        and not model.multi_latent_attention
        and model.add_qkv_bias
        and not model.add_bias_linear
    )


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    """Llama's map: the q/k/v biases come with model.add_qkv_bias (models/hf/gpt.py)."""
    return llama.weights(model, padded_vocab, names, meg, hf)
