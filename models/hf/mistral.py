"""Mistral (MistralForCausalLM) <-> Megatron-Core's GPTModel.

Llama's layout (RMSNorm, SwiGLU, GQA, RoPE, no biases) with a head dimension that may differ from
hidden / heads (`head_dim`: kv_channels, as Mistral-Nemo's 128 with hidden 5120 and 32 heads).
Mistral 7B v0.1 attends within a sliding window of 4096 tokens (`sliding_window`); v0.2 and v0.3
publish null (full attention). Megatron-Core's layers here attend over the whole sequence, which is
the same computation as the window for sequences no longer than it: `attention_span` tells the
checker so, and it refuses a longer model.seq_length with a folder that has a window.
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt, llama, qwen3
from models.hf.mapping import Node

ARCHITECTURE = "MistralForCausalLM"


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    qwen3.full_attention_only(hf)  # layer_types of sliding layers: Ministral's, not modelled
    fields = gpt.decoder_fields(hf)
    if fields.get("rope_scaling") is not None:
        raise ValueError(
            f"config.json rope scaling {fields['rope_scaling']!r}: Mistral is modelled with plain "
            "RoPE (as every published Mistral 7B is)"
        )
    return ModelConfig(**fields)


def attention_span(hf: dict[str, Any]) -> int | None:
    """config.json's sliding_window: the longest sequence computed as full attention."""
    window = hf.get("sliding_window")
    return None if window is None else int(window)


def to_hf(model: ModelConfig) -> dict[str, Any]:
    return gpt.decoder_to_hf(model, ARCHITECTURE, "mistral") | {"sliding_window": None}


def matches(model: ModelConfig) -> bool:
    """Llama's models without biases (an export without an origin takes Llama, listed first)."""
    return llama.matches(model) and not model.add_qkv_bias and not model.add_bias_linear


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    """Llama's map (the same tensor names)."""
    return llama.weights(model, padded_vocab, names, meg, hf)
