"""Qwen3 dense (Qwen3ForCausalLM) <-> Megatron-Core's GPTModel.

Llama's layout plus an RMSNorm over each query and key head before RoPE (`q_norm`, `k_norm`:
Megatron-Core's qk_layernorm) and a head dimension that need not be hidden / heads (`head_dim`:
kv_channels). Qwen3 has no biases and attends over the whole sequence in every published model;
folders that switch either on are refused rather than loaded into a model that computes something
else.
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt, llama
from models.hf.mapping import Node

ARCHITECTURE = "Qwen3ForCausalLM"


def full_attention_only(hf: dict[str, Any]) -> None:
    """Refuse sliding-window layers (`use_sliding_window`, transformers 5's `layer_types`):
    Megatron-Core's layers here attend over the whole sequence."""
    if hf.get("use_sliding_window"):
        raise ValueError(
            "config.json use_sliding_window=true: sliding-window attention is not modelled here "
            "(every layer attends over the whole sequence)"
        )
    kinds = set(hf.get("layer_types") or ()) - {"full_attention"}
    if kinds:
        raise ValueError(
            f"config.json layer_types has {sorted(kinds)}: only full_attention layers are "
            "modelled here"
        )


def no_attention_bias(hf: dict[str, Any]) -> None:
    """Qwen3's `attention_bias` puts a bias on q, k, v and o; Megatron-Core has biases on QKV
    only (add_qkv_bias) or on every linear layer, MLP included (add_bias_linear)."""
    if hf.get("attention_bias"):
        raise ValueError(
            "config.json attention_bias=true: biases on q, k, v and o but not on the MLP have no "
            "Megatron-Core equivalent"
        )


def plain_rope(fields: dict[str, Any]) -> None:
    """YaRN is wired into Megatron-Core's multi-latent attention only (models/gpt.py)."""
    if fields.get("rope_scaling") == "yarn":
        raise ValueError(
            "config.json rope_scaling type yarn: YaRN is modelled for multi-latent attention "
            "(DeepSeek-V3) only"
        )


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    full_attention_only(hf)
    no_attention_bias(hf)
    fields = gpt.decoder_fields(hf)
    plain_rope(fields)
    return ModelConfig(**fields, qk_layernorm=True)


def to_hf(model: ModelConfig) -> dict[str, Any]:
    return gpt.decoder_to_hf(model, ARCHITECTURE, "qwen3") | {
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": model.num_layers,
    }


def matches(model: ModelConfig) -> bool:
    return (
        model.arch == "gpt"
        and not model.num_moe_experts
        and gpt.plain_layers(model)
        and model.qk_layernorm
        and not model.multi_latent_attention
        and not model.add_qkv_bias
        and not model.add_bias_linear
    )


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    """Llama's map: the per-head q/k norms come with model.qk_layernorm (models/hf/gpt.py)."""
    return llama.weights(model, padded_vocab, names, meg, hf)
