"""Phi-3 (Phi3ForCausalLM) <-> Megatron-Core's GPTModel.

Llama's computation with fused projections: `qkv_proj` holds the rows of all query heads, then
all keys, then all values; `gate_up_proj` holds [gate; up]. The map splits them into Megatron's
layout: linear_qkv interleaves per query group (group g's query heads, then its key, then its
value: models/hf/gpt.py `fused_qkv`), which is also what lets a TP rank read only its groups'
rows; linear_fc1 is [gate; up] already, so gate_up_proj is it as it is. A LoRA adapter of a fused
layer exports as one adapter of qkv_proj or gate_up_proj (peft's names for Phi-3).

Phi-3-mini-4k and Phi-3-medium-4k publish `sliding_window` 2047: their layers attend to the last
2047 tokens, the same computation as the whole-sequence attention here up to 2047 tokens, so
`attention_span` bounds model.seq_length (the checker names it). Refused by name: the 128K models'
"longrope" (formerly "su") RoPE scaling, whose per-frequency factors Megatron-Core does not model,
and a partial rotary factor (Phi-4-mini's 0.75).
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt, llama
from models.hf.mapping import Node, tensor

ARCHITECTURE = "Phi3ForCausalLM"


def _rope_params(hf: dict[str, Any]) -> dict[str, Any]:
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    return params


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    params = _rope_params(hf)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in ("longrope", "su", "yarn"):  # transformers reads "su" and "yarn" as longrope
        raise ValueError(
            f"config.json rope scaling type {kind!r}: Phi-3's LongRoPE (the 128K models) scales "
            "each RoPE frequency by its own factor, which Megatron-Core does not model; take a "
            "4K model (Phi-3-mini-4k-instruct, Phi-3-medium-4k-instruct), which has none"
        )
    partial = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise ValueError(
            f"config.json partial_rotary_factor={partial}: RoPE on part of each head is not "
            "mapped here (every published Phi-3 rotates whole heads: 1.0)"
        )
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError(
            "config.json attention_bias/mlp_bias true: Phi-3's projections have no bias (and "
            "transformers' Phi-3 reads neither key)"
        )
    return ModelConfig(**gpt.decoder_fields(hf))


def attention_span(hf: dict[str, Any]) -> int | None:
    """config.json's sliding_window: the longest sequence computed as full attention."""
    window = hf.get("sliding_window")
    return None if window is None else int(window)


def to_hf(model: ModelConfig) -> dict[str, Any]:
    return gpt.decoder_to_hf(model, ARCHITECTURE, "phi3") | {
        "original_max_position_embeddings": model.seq_length,
        "sliding_window": None,
    }


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
    """`names`: the folder's tensor names (unused: the family has one spelling)."""
    heads = model.num_attention_heads
    groups = model.num_query_groups or heads
    head_dim = model.kv_channels or model.hidden_size // heads

    def layer(i: int, m: str, h: str) -> dict[str, Node]:
        a = f"{h}.self_attn"
        return {
            f"{m}.self_attention.linear_qkv.layer_norm_weight": tensor(
                f"{h}.input_layernorm.weight"
            ),
            f"{m}.self_attention.linear_qkv.weight": gpt.fused_qkv(
                f"{a}.qkv_proj.weight", heads, groups, head_dim
            ),
            f"{m}.self_attention.linear_proj.weight": tensor(f"{a}.o_proj.weight"),
            f"{m}.mlp.linear_fc1.layer_norm_weight": tensor(f"{h}.post_attention_layernorm.weight"),
            f"{m}.mlp.linear_fc1.weight": tensor(f"{h}.mlp.gate_up_proj.weight"),
            f"{m}.mlp.linear_fc2.weight": tensor(f"{h}.mlp.down_proj.weight"),
        }

    return gpt.decoder(model, padded_vocab, meg, hf, layer)
