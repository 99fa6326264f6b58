"""Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text) <-> Megatron-Core's GPTModel.

What Gemma 3 computes beyond Llama's layout, and the ModelConfig field that says it:

- Five local (sliding-window) layers to one global: `sliding_window` tokens, the query's own
  included (window_size = sliding_window - 1: Megatron-Core counts the tokens before it), the
  global ones every `sliding_window_pattern`-th layer (transformers 5's `layer_types`):
  window_attn_skip_freq. The local layers rotate with their own RoPE base, unscaled
  (`rope_local_base_freq`, transformers 5's rope_parameters.sliding_attention):
  rotary_base_local; the global ones with `rope_theta` and, from 4B up, linear scaling by 8.
- Four norms per layer (`input_layernorm`, `post_attention_layernorm`,
  `pre_feedforward_layernorm`, `post_feedforward_layernorm`): sandwich_norm; per-head
  `q_norm` / `k_norm`: qk_layernorm. Every norm scales by (1 + weight): the weights map as
  published, layernorm_zero_centered_gamma.
- The embedding times sqrt(hidden_size): scale_embeddings; tied to the output layer.
- GeGLU with gelu_pytorch_tanh: activation geglu.
- Attention logits scaled by query_pre_attn_scalar ** -0.5 (27B: 168 with heads of 128):
  softmax_scale.

Gemma 3 publishes no logit soft-capping (Gemma 2's `attn_logit_softcapping` /
`final_logit_softcapping`) and no bidirectional attention; a config.json that sets either is
refused, naming the key, as are RoPE types other than default and linear.

models/gemma_layers.py holds what Megatron-Core lacks (the local layers' RoPE, the post norms, the
embedding scale).
"""

from __future__ import annotations

import math
from typing import Any

from config.schema import ModelConfig
from models.hf import gpt
from models.hf.mapping import Node

ARCHITECTURE = "Gemma3ForCausalLM"
MODEL_TYPE = "gemma3_text"
ACTIVATION = "gelu_pytorch_tanh"

# transformers' Gemma3TextConfig defaults: the text_config of the 4B / 12B / 27B folders leaves
# most of them out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": ACTIVATION,
    "max_position_embeddings": 131_072,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
}
SLIDING, FULL = "sliding_attention", "full_attention"


def _skip_freq(hf: dict[str, Any], layers: int) -> tuple[bool, int | None]:
    """(any local layer, every how many layers a global one comes) from `layer_types` or
    `sliding_window_pattern` (6 when neither is given, transformers' default)."""
    types = hf.get("layer_types")
    if types is None:
        pattern = int(hf.get("sliding_window_pattern") or 6)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
    if len(types) != layers or set(types) - {SLIDING, FULL}:
        raise ValueError(
            f"config.json layer_types {types}: {layers} entries of {SLIDING} or {FULL} expected"
        )
    if FULL not in types:
        return True, None
    if SLIDING not in types:
        return False, None
    every = types.index(FULL) + 1
    if any((t == FULL) != ((i + 1) % every == 0) for i, t in enumerate(types)):
        raise ValueError(
            f"config.json layer_types {types}: Megatron-Core's window_attn_skip_freq places a "
            f"global layer every Nth layer; this pattern is not one (its first is layer {every})"
        )
    return True, every


def _rope(hf: dict[str, Any]) -> dict[str, Any]:
    """RoPE of the global and local layers, transformers 4's keys (rope_theta,
    rope_local_base_freq, rope_scaling) or transformers 5's (rope_parameters per layer type)."""
    params = hf.get("rope_parameters") or {}
    full = dict(params.get(FULL) or {})
    local = dict(params.get(SLIDING) or {})
    full = (
        {"rope_theta": hf.get("rope_theta", DEFAULTS["rope_theta"])}
        | (hf.get("rope_scaling") or {})
        | full
    )
    local.setdefault("rope_theta", hf.get("rope_local_base_freq", DEFAULTS["rope_local_base_freq"]))
    out: dict[str, Any] = {
        "rotary_base": int(full["rope_theta"]),
        "rotary_base_local": int(local["rope_theta"]),
    }
    kind = full.get("rope_type", full.get("type", "default"))
    if kind == "linear":
        out |= {"rope_scaling": "linear", "rope_scaling_factor": float(full["factor"])}
    elif kind != "default":
        raise ValueError(
            f"config.json rope type {kind!r} of the global layers: Gemma 3 is modelled with "
            "default or linear RoPE"
        )
    local_kind = local.get("rope_type", local.get("type", "default"))
    if local_kind != "default":
        raise ValueError(
            f"config.json rope type {local_kind!r} of the sliding-window layers: they are "
            "modelled unscaled (default), as Gemma 3 publishes them"
        )
    return out


def _refuse(hf: dict[str, Any]) -> None:
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if hf.get(key) is not None:
            raise ValueError(
                f"config.json {key}={hf[key]}: logit soft-capping (Gemma 2's) is not modelled; "
                "Gemma 3 publishes none (null)"
            )
    for key, why in (
        ("use_bidirectional_attention", "attention here is causal"),
        ("attention_bias", "Gemma 3 has no biases, and Megatron-Core has none on q, k, v and o"),
    ):
        if hf.get(key):
            raise ValueError(f"config.json {key}=true: {why}")
    act = hf.get("hidden_activation") or hf.get("hidden_act") or ACTIVATION
    if act != ACTIVATION:
        raise ValueError(
            f"config.json hidden_activation={act!r}: Gemma 3 is mapped with {ACTIVATION}"
        )


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    """`hf`: a Gemma3ForCausalLM config.json, or a text_config (transformers' defaults filled in)."""
    hf = DEFAULTS | hf
    _refuse(hf)
    layers = hf["num_hidden_layers"]
    local, every = _skip_freq(hf, layers)
    if local and not hf.get("sliding_window"):
        raise ValueError("config.json has sliding_attention layers but no sliding_window")
    return ModelConfig(
        num_layers=layers,
        hidden_size=hf["hidden_size"],
        ffn_hidden_size=hf["intermediate_size"],
        num_attention_heads=hf["num_attention_heads"],
        num_query_groups=hf["num_key_value_heads"],
        kv_channels=hf["head_dim"],
        seq_length=min(int(hf["max_position_embeddings"]), 4096),
        vocab_size=hf["vocab_size"],
        normalization="RMSNorm",
        layernorm_epsilon=float(hf["rms_norm_eps"]),
        layernorm_zero_centered_gamma=True,
        activation="geglu",
        qk_layernorm=True,
        sandwich_norm=True,
        scale_embeddings=True,
        share_embeddings_and_output_weights=bool(hf["tie_word_embeddings"]),
        init_method_std=float(hf["initializer_range"]),
        softmax_scale=float(hf["query_pre_attn_scalar"]) ** -0.5,
        window_size=int(hf["sliding_window"]) - 1 if local else None,
        window_attn_skip_freq=every,
        **_rope(hf),
    )


def to_hf(model: ModelConfig) -> dict[str, Any]:
    """config.json of a Gemma3ForCausalLM: transformers 4's keys, which transformers 5 reads too,
    and transformers 5's layer_types."""
    heads = model.num_attention_heads
    head_dim = model.kv_channels or model.hidden_size // heads
    scalar = (model.softmax_scale or head_dim**-0.5) ** -2
    every, window = model.window_attn_skip_freq, model.window_size
    types = [
        SLIDING if window is not None and (every is None or (i + 1) % every) else FULL
        for i in range(model.num_layers)
    ]
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": model.num_query_groups or heads,
        "head_dim": head_dim,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.seq_length,
        "rms_norm_eps": model.layernorm_epsilon,
        "hidden_activation": ACTIVATION,
        "tie_word_embeddings": model.share_embeddings_and_output_weights,
        "initializer_range": model.init_method_std,
        "query_pre_attn_scalar": round(scalar) if math.isclose(scalar, round(scalar)) else scalar,
        "sliding_window": None if window is None else window + 1,
        "layer_types": types,
        "rope_theta": float(model.rotary_base),
        "rope_local_base_freq": float(model.rotary_base_local or model.rotary_base),
        "rope_scaling": (
            {"rope_type": "linear", "factor": model.rope_scaling_factor}
            if model.rope_scaling == "linear"
            else None
        ),
        "attention_bias": False,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    }
    if every is not None:
        out["sliding_window_pattern"] = every
    return out


def matches(model: ModelConfig) -> bool:
    return (
        model.arch == "gpt"
        and not model.num_moe_experts
        and not model.multi_latent_attention
        and model.activation == "geglu"
        and model.qk_layernorm
        and model.sandwich_norm
        and model.layernorm_zero_centered_gamma
        and model.scale_embeddings
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
    def layer(i: int, m: str, h: str) -> dict[str, Node]:
        out = gpt.attention(model, m, h)
        out[f"{m}.self_attention.post_layernorm.weight"] = gpt.tensor(
            f"{h}.post_attention_layernorm.weight"
        )
        out |= gpt.dense_mlp(m, f"{h}.mlp", f"{h}.pre_feedforward_layernorm.weight")
        out[f"{m}.mlp.post_layernorm.weight"] = gpt.tensor(f"{h}.post_feedforward_layernorm.weight")
        return out

    return gpt.decoder(model, padded_vocab, meg, hf, layer)
