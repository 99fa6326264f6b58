"""Llama 3 / 3.1 / 3.2 (LlamaForCausalLM) <-> Megatron-Core's GPTModel.

RMSNorm, SwiGLU, GQA, RoPE with Llama 3.1/3.2's "llama3" frequency scaling, tied embeddings on the
small 3.2 models. Biases (`attention_bias`, `mlp_bias`) are mapped when a derivative sets them both.
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
        raise ValueError(
            f"config.json attention_bias={attention_bias}, mlp_bias={mlp_bias}: Megatron-Core "
            "puts biases on every linear layer or on QKV only"
        )
    return ModelConfig(
        **gpt.decoder_fields(hf), add_qkv_bias=attention_bias, add_bias_linear=mlp_bias
    )


def to_hf(model: ModelConfig) -> dict[str, Any]:
    return gpt.decoder_to_hf(model, ARCHITECTURE, "llama") | {
        "attention_bias": model.add_qkv_bias,
        "mlp_bias": model.add_bias_linear,
    }


def matches(model: ModelConfig) -> bool:
    return (
        model.arch == "gpt"
        and not model.num_moe_experts
        and gpt.plain_layers(model)
        and not model.qk_layernorm
        and not model.multi_latent_attention
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
