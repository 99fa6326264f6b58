"""GPT-OSS (GptOssForCausalLM) <-> Megatron-Core's GPTModel with a mixture of experts.

Attention: GQA with biases on q, k, v and o (Megatron-Core's add_bias_linear), a learned sink logit
per head that joins each softmax's denominator (`self_attn.sinks`: Megatron-Core's learnable
softmax offset, `core_attention.softmax_offset`), and a sliding window on the layers config.json's
`layer_types` marks "sliding_attention" (every other one, the first included: Megatron-Core's
window_attn_skip_freq 2). transformers' window of `sliding_window` tokens holds the token itself,
Megatron-Core's (left, 0) window the token and `left` before it: left = sliding_window - 1.

RoPE is YaRN (factor 32 over 4,096 positions, `truncate` false: the correction range is not
rounded), in GPTModel's own YaRN rotary embedding.

Every layer's MLP is a MoE: a router with a bias (`mlp.router`) picks the top k experts by logit and
weighs them by the softmax over those k (Megatron-Core's softmax router without pre-softmax). The
experts live in one tensor per projection, features last: `gate_up_proj` [experts, hidden,
2 x ffn] with gate and up features interleaved (gate at even, up at odd features:
transformers' `gate_up[..., ::2]`, `[..., 1::2]`), `down_proj` [experts, ffn, hidden], and their
biases. The activation is a clamped GLU: quick GELU (x * sigmoid(1.702 x)) of the gate clamped
above at `swiglu_limit`, times the up projection clamped to +-swiglu_limit plus 1 (Megatron-Core's
quick_gelu with activation_func_clamp_value and glu_linear_offset 1).

The published checkpoints store the experts' weights in MXFP4 (`<name>_blocks`, `<name>_scales`,
config.json `quantization_config.quant_method` "mxfp4"): they are dequantized to BF16 as they are
read (models/hf/mapping.py `dequantize_mxfp4`), as transformers does when it loads them without
its MXFP4 kernels; an export writes them dequantized.
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt
from models.hf.mapping import Expert, Node, Stack, tensor

ARCHITECTURE = "GptOssForCausalLM"
SLIDING, FULL = "sliding_attention", "full_attention"
QUICK_GELU_ALPHA = 1.702  # Megatron-Core's quick_gelu: x * sigmoid(1.702 x), fixed


def _windows(hf: dict[str, Any]) -> dict[str, Any]:
    """window_size and window_attn_skip_freq from `sliding_window` and `layer_types`."""
    layers = int(hf["num_hidden_layers"])
    types = list(hf.get("layer_types") or [SLIDING if (i + 1) % 2 else FULL for i in range(layers)])
    if len(types) != layers or set(types) - {SLIDING, FULL}:
        raise ValueError(
            f"config.json layer_types={types}: expected {layers} entries of {SLIDING!r} or {FULL!r}"
        )
    if SLIDING not in types or hf.get("sliding_window") is None:
        return {"window_size": None, "window_attn_skip_freq": None}
    window = int(hf["sliding_window"])
    if window < 1:
        raise ValueError(f"config.json sliding_window={window}: must be at least 1")
    if FULL not in types:
        return {"window_size": window - 1, "window_attn_skip_freq": None}
    # Megatron-Core: layer i (from 1) attends in full when i % freq == 0.
    freq = types.index(FULL) + 1
    if types != [FULL if (i + 1) % freq == 0 else SLIDING for i in range(layers)]:
        raise ValueError(
            f"config.json layer_types={types}: Megatron-Core's pattern here is one full-attention "
            "layer every N (window_attn_skip_freq), the others windowed"
        )
    return {"window_size": window - 1, "window_attn_skip_freq": freq}


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    if not hf.get("attention_bias", True):
        raise ValueError(
            "config.json attention_bias=false: GPT-OSS's experts and router always carry biases, "
            "and Megatron-Core's add_bias_linear gives every linear layer one or none"
        )
    alpha = float(hf.get("swiglu_alpha", QUICK_GELU_ALPHA))
    if alpha != QUICK_GELU_ALPHA:
        raise ValueError(
            f"config.json swiglu_alpha={alpha}: Megatron-Core's quick_gelu has it fixed at "
            f"{QUICK_GELU_ALPHA} (as GPT-OSS publishes it)"
        )
    quant = (hf.get("quantization_config") or {}).get("quant_method")
    if quant not in (None, "mxfp4"):
        raise ValueError(
            f"config.json quantization_config.quant_method={quant!r}: only MXFP4 experts (the "
            "published checkpoints) are dequantized on import; use a BF16 copy of the model"
        )
    fields = gpt.decoder_fields(hf)
    gpt.yarn(hf, fields, "GPT-OSS")
    topk = int(hf.get("num_experts_per_tok", 4))
    if topk == 1:
        raise ValueError(
            "config.json num_experts_per_tok=1: Megatron-Core's softmax router needs top-k > 1 "
            "without pre-softmax"
        )
    # transformers adds the balancing loss only with output_router_logits (GPT-OSS publishes
    # false, with router_aux_loss_coef 0.9): trained without one unless the folder asks for it.
    balanced = bool(hf.get("output_router_logits", False))
    fields["activation"] = "quick_geglu"
    return ModelConfig(
        **fields,
        **_windows(hf),
        softmax_type="learnable",
        add_bias_linear=True,
        activation_func_clamp_value=float(hf.get("swiglu_limit", 7.0)),
        glu_linear_offset=1.0,
        num_moe_experts=int(hf["num_local_experts"]),
        moe_router_topk=topk,
        moe_ffn_hidden_size=hf["intermediate_size"],
        moe_router_score_function="softmax",
        moe_router_pre_softmax=False,
        moe_router_load_balancing_type="aux_loss" if balanced else "none",
        moe_aux_loss_coeff=float(hf.get("router_aux_loss_coef", 0.9)) if balanced else 0.0,
    )


def to_hf(model: ModelConfig) -> dict[str, Any]:
    out = gpt.decoder_to_hf(model, ARCHITECTURE, "gpt_oss")
    out.pop("rope_scaling", None)
    out.pop("rope_theta")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(model.rotary_base)}
    if model.rope_scaling == "yarn":
        rope = {
            "rope_type": "yarn",
            "rope_theta": float(model.rotary_base),
            "factor": model.rope_scaling_factor,
            "original_max_position_embeddings": model.rope_original_max_position_embeddings,
            "beta_fast": model.rope_beta_fast,
            "beta_slow": model.rope_beta_slow,
            "truncate": model.rope_correction_range_round_to_int,
        }
    layers = range(model.num_layers)
    if model.window_size is None:
        types = [FULL for _ in layers]
    else:
        freq = model.window_attn_skip_freq
        types = [FULL if freq and (i + 1) % freq == 0 else SLIDING for i in layers]
    return out | {
        "intermediate_size": model.moe_ffn_hidden_size or model.ffn_hidden_size,
        "num_local_experts": model.num_moe_experts,
        "num_experts_per_tok": model.moe_router_topk,
        "router_aux_loss_coef": model.moe_aux_loss_coeff,
        "output_router_logits": model.moe_router_load_balancing_type != "none",
        "attention_bias": True,
        "sliding_window": None if model.window_size is None else model.window_size + 1,
        "layer_types": types,
        "swiglu_limit": model.activation_func_clamp_value,
        "swiglu_alpha": QUICK_GELU_ALPHA,
        "rope_parameters": rope,
    }


def matches(model: ModelConfig) -> bool:
    return (
        model.arch == "gpt"
        and bool(model.num_moe_experts)
        and not model.multi_latent_attention
        and model.softmax_type == "learnable"
        and model.activation == "quick_geglu"
        and model.add_bias_linear
        and model.moe_router_score_function == "softmax"
        and not model.moe_router_pre_softmax
        and not model.moe_shared_expert_intermediate_size
        and not model.moe_first_k_dense_layers
    )


def experts(model: ModelConfig, meg: str, hf: str, names: set[str] | None) -> dict[str, Node]:
    """The experts of one layer: one Megatron tensor per projection and expert axis, each expert
    a slice of the Hugging Face tensor that holds them all (MXFP4 when the folder has blocks)."""
    n = range(model.num_moe_experts or 0)
    x, e = f"{meg}.mlp.experts.experts", f"{hf}.mlp.experts"

    def stack(name: str, bias: bool, interleaved: bool) -> Stack:
        quantized = not bias and names is not None and f"{name}_blocks" in names
        return Stack(tuple(Expert(name, i, bias, interleaved, quantized) for i in n))

    return {
        f"{x}.linear_fc1.weight": stack(f"{e}.gate_up_proj", False, True),
        f"{x}.linear_fc1.bias": stack(f"{e}.gate_up_proj_bias", True, True),
        f"{x}.linear_fc2.weight": stack(f"{e}.down_proj", False, False),
        f"{x}.linear_fc2.bias": stack(f"{e}.down_proj_bias", True, False),
    }


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    """`names`: the folder's tensor names; `<expert tensor>_blocks` among them marks MXFP4."""

    def layer(i: int, m: str, h: str) -> dict[str, Node]:
        out = gpt.attention(model, m, h)
        out[f"{m}.self_attention.core_attention.softmax_offset"] = tensor(f"{h}.self_attn.sinks")
        out[f"{m}.pre_mlp_layernorm.weight"] = tensor(f"{h}.post_attention_layernorm.weight")
        out[f"{m}.mlp.router.weight"] = tensor(f"{h}.mlp.router.weight")
        out[f"{m}.mlp.router.bias"] = tensor(f"{h}.mlp.router.bias")
        return out | experts(model, m, h, names)

    return gpt.decoder(model, padded_vocab, meg, hf, layer)
