"""Llama 3 / 3.1 / 3.2 (LlamaForCausalLM) <-> Megatron-Core's GPTModel.

RMSNorm, SwiGLU, GQA, RoPE with Llama 3.1/3.2's "llama3" frequency scaling, tied embeddings on the
small 3.2 models. Biases (`attention_bias`, `mlp_bias`) are mapped when a derivative sets them both;
q/k/v biases alone are Qwen2's layout (models/hf/qwen2.py).
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt
from models.hf.mapping import Node

ARCHITECTURE = "LlamaForCausalLM"


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    attention_bias, mlp_bias = bool(hf.get("attention_bias")), bool(hf.get("mlp_bias"))
    if attention_bias != mlp_bias:
        raise ValueError(bias_message(attention_bias, mlp_bias))
    return ModelConfig(
        **gpt.decoder_fields(hf), add_qkv_bias=attention_bias, add_bias_linear=mlp_bias
    )


def bias_message(attention_bias: bool, mlp_bias: bool) -> str:
    """Why Llama's biases on attention alone, or on the MLP alone, are refused, and what to do."""
    return (
        f"config.json attention_bias={str(attention_bias).lower()}, "
        f"mlp_bias={str(mlp_bias).lower()}: Llama's attention_bias puts a bias on q, k, v and "
        "o_proj. Megatron-Core models biases on q, k and v alone (add_qkv_bias: Qwen2's layout, "
        "no bias on o_proj or the MLP) or on every linear layer (attention_bias and mlp_bias both "
        "true), not this mix. If the folder's only biases are q_proj/k_proj/v_proj.bias, it is a "
        'Qwen2 model: set architectures to ["Qwen2ForCausalLM"] in its config.json'
    )


def to_hf(model: ModelConfig) -> dict[str, Any]:
    return gpt.decoder_to_hf(model, ARCHITECTURE, "llama") | {
        "attention_bias": model.add_qkv_bias,
        "mlp_bias": model.add_bias_linear,
    }


def matches(model: ModelConfig) -> bool:
    """A dense GPT without QK norm whose biases, if any, are on every linear layer (QKV alone is
    Qwen2's: Llama's attention_bias would put one on o_proj too)."""
    return (
        model.arch == "gpt"
        and not model.num_moe_experts
        and gpt.plain_layers(model)
        and not model.qk_layernorm
        and not model.multi_latent_attention
        and model.add_qkv_bias == model.add_bias_linear
    )


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    """`names`: the folder's tensor names (one spelling only here; llava-hf has several)."""

    def layer(i: int, m: str, h: str) -> dict[str, Node]:
        out = gpt.attention(model, m, h)
        out |= gpt.dense_mlp(m, f"{h}.mlp", f"{h}.post_attention_layernorm.weight")
        if model.add_bias_linear:
            out[f"{m}.mlp.linear_fc1.bias"] = gpt.gated(
                f"{h}.mlp.gate_proj.bias", f"{h}.mlp.up_proj.bias"
            )
            out[f"{m}.mlp.linear_fc2.bias"] = gpt.tensor(f"{h}.mlp.down_proj.bias")
        return out

    return gpt.decoder(model, padded_vocab, meg, hf, layer)
